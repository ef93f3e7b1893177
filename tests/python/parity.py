"""Training an exported module with tiermem-exec and the same module with
PyTorch on the same batches (the ones tiermem-exec dumps), for the
importer's parity tests."""

import copy
import math
import os
import subprocess

import numpy
import torch

EXEC = os.environ.get("TIERMEM_EXEC", "tiermem-exec")
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "corpus.txt")


def train_with_tiermem(model, daemon, tmp_path, steps, job, extra=(), world=1, quiet=True):
    """Runs `tiermem-exec train MODEL` for `steps` steps of one micro-batch,
    as `world` ranks (processes with TIERMEM_RANK and TIERMEM_WORLD_SIZE, on
    the one daemon); returns (the losses, the folder of the batches it
    read)."""
    dump = tmp_path / f"{job}.dump"
    losses = tmp_path / f"{job}.losses"
    args = [EXEC, "train", model, "--socket", daemon.socket, "--job", job, "--data", CORPUS, "--steps", str(steps),
            "--micro-batches", "1", "--dump", str(dump), "--dump-batches", str(steps), "--losses", str(losses),
            *(["-q"] if quiet else []), *extra]
    ranks = []
    for rank in range(world):
        env = dict(os.environ, TIERMEM_RANK=str(rank), TIERMEM_WORLD_SIZE=str(world),
                   TIERMEM_LOCAL_WORLD_SIZE=str(world))
        log = open(tmp_path / f"{job}.rank{rank}.log", "w")
        ranks.append((subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failed = []
    for rank, (proc, log) in enumerate(ranks):
        rc = proc.wait(timeout=600)
        log.close()
        if rc != 0:
            failed.append(f"rank {rank} exited {rc}:\n" + (tmp_path / f"{job}.rank{rank}.log").read_text())
    assert not failed, "\n".join(failed)
    ours = [float.fromhex(line) if "p" in line else float(line) for line in losses.read_text().split()]
    assert len(ours) == steps, ours
    return ours, dump


def batch(dump, step, shape):
    """The ids and next tokens tiermem-exec trained step `step` on."""
    ids = torch.from_numpy(numpy.fromfile(dump / f"batch{step}_mb0.ids.i32", numpy.int32)).long()
    nxt = torch.from_numpy(numpy.fromfile(dump / f"batch{step}_mb0.next.i32", numpy.int32)).long()
    return ids.view(shape), nxt.view(shape)


def train_with_pytorch(module, dump, steps, shape, loss_of, optimizer, noise=0.0, seed=0, lr_at=None, clip=None,
                       norms=None):
    """The module's losses over the same batches: `loss_of(module, ids,
    next)` gives the loss of one batch; `lr_at(it)`, the learning rate of
    iteration `it` (from 0), set before each step; `clip`, the largest
    global gradient norm (clip_grad_norm_, as nanoGPT's train.py), each
    step's norm appended to `norms`. With `noise`, every parameter is
    moved by that much (relative, random) after each step: rounding of
    another implementation's order of sums, as PyTorch's own spread."""
    theirs = []
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        ids, nxt = batch(dump, step, shape)
        optimizer.zero_grad()
        loss = loss_of(module, ids, nxt)
        loss.backward()
        if lr_at is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
            if norms is not None:
                norms.append(float(norm))
        optimizer.step()
        theirs.append(loss.item())
        if noise:
            with torch.no_grad():
                for p in module.parameters():
                    p.mul_(1 + noise * torch.randn(p.shape, generator=g).to(p.device, p.dtype))
    return theirs


def nanogpt_get_lr(it, learning_rate=3e-3, warmup_iters=5, lr_decay_iters=40, min_lr=3e-4):
    """nanoGPT's train.py get_lr, as published."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def worst_relative(ours, theirs):
    return max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))


def perturbed(module, seed, size=1e-7):
    """A copy of `module` with every parameter moved by `size` (relative,
    random): what one rounding of fp32 does."""
    copy_ = copy.deepcopy(module)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copy_.parameters():
            p.mul_(1 + size * torch.randn(p.shape, generator=g).to(p.device, p.dtype))
    return copy_


def check_parity(ours, module, dump, shape, loss_of, make_optimizer, tolerance=1e-4, lr_at=None, clip=None):
    """Asserts tiermem-exec's losses `ours` are PyTorch's: the module trained
    on the same batches. Each step is within `tolerance` (relative) of
    PyTorch fp32, except at steps where training is too sensitive for any
    fp32 implementation to follow another that closely (`make_optimizer(m)`
    builds the optimizer of a copy m of the module; `lr_at`, the schedule;
    `clip`, the clipping): where PyTorch itself,
    its parameters moved by 1e-7 (one fp32 rounding) after every step (two
    draws), or run in fp64, lands more than a tenth of the tolerance away.
    There, ours is within ten times the farthest of those. Returns (worst
    against PyTorch fp32, worst of PyTorch's own spread)."""
    steps = len(ours)

    def run(m, noise=0.0, seed=0):
        return train_with_pytorch(m, dump, steps, shape, loss_of, make_optimizer(m), noise, seed,
                                  lr_at, clip)

    theirs = run(copy.deepcopy(module))
    spreads = [run(copy.deepcopy(module), 1e-7, seed) for seed in (1, 2)] + [run(copy.deepcopy(module).double())]
    bad = []
    worst_spread = 0.0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        spread = max(abs(other[i] - b) for other in spreads)
        worst_spread = max(worst_spread, spread / abs(b))
        if abs(a - b) <= tolerance * abs(b):
            continue
        if spread > tolerance / 10 * abs(b) and abs(a - b) <= 10 * spread:
            continue
        bad.append((i, a, b, spread))
    assert not bad, f"steps (step, ours, PyTorch fp32, PyTorch's own spread) off: {bad}"
    return worst_relative(ours, theirs), worst_spread

"""Training an exported module with tiermem-exec and the same module with
PyTorch on the same batches (the ones tiermem-exec dumps), for the
importer's parity tests."""

import copy
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


def train_with_pytorch(module, dump, steps, shape, loss_of, optimizer):
    """The module's losses over the same batches: `loss_of(module, ids,
    next)` gives the loss of one batch."""
    theirs = []
    for step in range(steps):
        ids, nxt = batch(dump, step, shape)
        optimizer.zero_grad()
        loss = loss_of(module, ids, nxt)
        loss.backward()
        optimizer.step()
        theirs.append(loss.item())
    return theirs


def worst_relative(ours, theirs):
    return max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))


def check_parity(ours, module, dump, shape, loss_of, make_optimizer, tolerance=1e-4):
    """Asserts tiermem-exec's losses `ours` are PyTorch's: the module trained
    on the same batches in fp32 and in fp64. Each step is within `tolerance`
    (relative) of PyTorch fp32, except where the training itself is
    ill-conditioned (PyTorch fp32 strays from fp64 by more than a tenth of
    it: no fp32 implementation can follow another there); at those steps,
    ours is no farther from fp64 than twice PyTorch fp32's distance, plus
    the tolerance. Returns (worst against fp32, worst of fp32 against fp64)."""
    steps = len(ours)
    fp32 = copy.deepcopy(module)
    fp64 = copy.deepcopy(module).double()
    theirs = train_with_pytorch(fp32, dump, steps, shape, loss_of, make_optimizer(fp32.parameters()))
    exact = train_with_pytorch(fp64, dump, steps, shape, loss_of, make_optimizer(fp64.parameters()))
    bad = []
    for i, (a, b, c) in enumerate(zip(ours, theirs, exact)):
        if abs(a - b) <= tolerance * abs(b):
            continue
        noise = abs(b - c)
        if noise > tolerance / 10 * abs(c) and abs(a - c) <= 2 * noise + tolerance * abs(c):
            continue
        bad.append((i, a, b, c))
    assert not bad, f"steps (step, ours, PyTorch fp32, PyTorch fp64) off: {bad}"
    return worst_relative(ours, theirs), worst_relative(theirs, exact)

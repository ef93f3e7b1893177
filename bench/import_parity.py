#!/usr/bin/env python3
"""Imported models against PyTorch, on the device tiermem-exec trains on
(issue 48): nanoGPT's model.py as published (bias on and off; and with its
own AdamW, train.py's learning-rate schedule and clipping), a GPT-2 and
a Llama in Hugging Face's form (tests/python/models/) are exported with this
machine's PyTorch (1.13's make_fx, or 2.x's: nanoGPT then takes its
scaled_dot_product_attention path), trained by tiermem-exec for STEPS Adam
steps, and trained by PyTorch on the same batches. Prints, per model:

    import_<model>_fp32_vs_torch_worst_rel   the largest relative difference of a loss, fp32
    import_<model>_bf16_vs_torch_autocast_worst_rel  --precision bf16 against torch.autocast(bf16) (cuda)

each with PyTorch's own spread: PyTorch with its parameters moved after
every step by 1e-7 (fp32: one rounding; two draws) or 4e-3 (bf16: one
rounding), against PyTorch: how sensitive the run is, at the worst step and
over the run.

    import_nanogpt_dropout_mean_loss_vs_torch_ratio  dropout 0.2, 500 steps: the last 100's mean loss

Goals: fp32 within 1e-4 (where the run is not more sensitive than that),
bf16 within 2e-2, dropout within 3 %. PyTorch runs on the same device, TF32 off.
Usage: bench/import_parity.py --socket SOCK [--exec tiermem-exec] [--device cuda] [--steps 50]
"""

import argparse
import copy
import os
import pathlib
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python", "models"))

import parity  # noqa: E402
import tiermem.fx  # noqa: E402
from gpt2_hf_style import GPT2LMHeadModel  # noqa: E402
from llama_style import LlamaForCausalLM  # noqa: E402
from nanogpt_model import GPT, GPTConfig  # noqa: E402

B, T = 4, 16


class Daemon:
    def __init__(self, socket):
        self.socket = socket


def models():
    def nano(bias):
        return GPT(GPTConfig(block_size=32, vocab_size=256, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=bias))
    yield "nanogpt", lambda: nano(True), 1, None
    yield "nanogpt_nobias", lambda: nano(False), 1, None
    # nanoGPT's own optimizer (AdamW, decay and no-decay groups), train.py's schedule and grad_clip 1.0.
    yield "nanogpt_adamw", lambda: nano(True), 1, lambda m: m.configure_optimizers(1.0, 3e-3, (0.9, 0.95), "cpu")
    yield "gpt2", lambda: GPT2LMHeadModel(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=4), 0, None
    yield "llama", lambda: LlamaForCausalLM(num_hidden_layers=2), 0, None
    yield "llama_tied", lambda: LlamaForCausalLM(num_hidden_layers=2, tie_word_embeddings=True), 0, None


def torch_losses(module, dump, steps, which, device, make_opt, autocast=False, noise=0.0, seed=0):
    module = module.to(device)
    optimizer = make_opt(module) if make_opt else torch.optim.Adam(module.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    out = []
    for step in range(steps):
        ids, nxt = parity.batch(dump, step, (B, T))
        ids, nxt = ids.to(device), nxt.to(device)
        optimizer.zero_grad()
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
            loss = module(ids, nxt)[which]
        loss.backward()
        if make_opt:
            for group in optimizer.param_groups:
                group["lr"] = parity.nanogpt_get_lr(step)
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        out.append(loss.item())
        if noise:
            with torch.no_grad():
                for p in module.parameters():
                    p.mul_(1 + noise * torch.randn(p.shape, generator=g).to(p.device, p.dtype))
    return out


def report(name, what, ours, theirs, moved):
    """The worst step against PyTorch, and PyTorch's own spread (started
    from moved parameters) at that step and over the run."""
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, theirs)]
    spread = [max(abs(m[i] - b) / abs(b) for m in moved) for i, b in enumerate(theirs)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    print(f"import_{name}_{what}_worst_rel {rel[worst]:.3e} (step {worst}; PyTorch's own spread there "
          f"{spread[worst]:.1e}, over the run {max(spread):.1e})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--exec", default=os.environ.get("TIERMEM_EXEC", "tiermem-exec"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--only-dropout", action="store_true", help="the dropout run alone")
    args = ap.parse_args()
    parity.EXEC = args.exec
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="import-parity-"))
    daemon = Daemon(args.socket)
    print(f"# PyTorch {torch.__version__}, tiermem-exec --device {args.device}, {args.steps} Adam steps of "
          f"{B} x {T} tokens")
    for name, make, which, make_opt in [] if args.only_dropout else models():
        torch.manual_seed(11)
        module = make()
        reference = copy.deepcopy(module)
        ids = torch.randint(0, 256, (B, T))
        optimizer = make_opt(module) if make_opt else {"type": "ADAM", "learning_rate": 3e-3}
        schedule = {"warmup_steps": 5, "decay_steps": 40, "min_learning_rate": 3e-4} if make_opt else None
        path = tiermem.fx.export(module, (ids, ids), str(tmp / f"{name}.pbtxt"), dataset="text:fortunes",
                                 optimizer=optimizer, schedule=schedule, grad_clip=1.0 if make_opt else None)
        ours, dump = parity.train_with_tiermem(path, daemon, tmp, args.steps, f"{name}{os.getpid()}",
                                               ["--device", args.device])
        theirs = torch_losses(copy.deepcopy(reference), dump, args.steps, which, args.device, make_opt)
        moved = [torch_losses(copy.deepcopy(reference), dump, args.steps, which, args.device, make_opt,
                              noise=1e-7, seed=seed)
                 for seed in (1, 2)]
        report(name, "fp32_vs_torch", ours, theirs, moved)
        if args.device == "cuda":
            bf16, _ = parity.train_with_tiermem(path, daemon, tmp, args.steps, f"{name}bf{os.getpid()}",
                                                ["--device", "cuda", "--precision", "bf16"])
            auto = torch_losses(copy.deepcopy(reference), dump, args.steps, which, "cuda", make_opt, autocast=True)
            auto_moved = [torch_losses(copy.deepcopy(reference), dump, args.steps, which, "cuda", make_opt,
                                       autocast=True, noise=4e-3, seed=1)]
            report(name, "bf16_vs_torch_autocast", bf16, auto, auto_moved)
        sys.stdout.flush()
    dropout(args, tmp, daemon)


def dropout(args, tmp, daemon, steps=500, tail=100):
    """nanoGPT with dropout 0.2 (this PyTorch's export: 2.x takes SDPA's
    dropout_p): our masks against PyTorch's, the mean loss of the last
    `tail` of `steps` steps on the same batches (goal: within 3 %), and the
    same seed twice (the same bits)."""
    torch.manual_seed(11)
    module = GPT(GPTConfig(block_size=32, vocab_size=256, n_layer=2, n_head=4, n_embd=32, dropout=0.2, bias=True))
    reference = copy.deepcopy(module)
    ids = torch.randint(0, 256, (B, T))
    path = tiermem.fx.export(module, (ids, ids), str(tmp / "dropout.pbtxt"), dataset="text:fortunes",
                             optimizer={"type": "ADAM", "learning_rate": 1e-3})
    run = ["--device", args.device, "--seed", "5"]
    ours, dump = parity.train_with_tiermem(path, daemon, tmp, steps, f"drop{os.getpid()}", run)
    again, _ = parity.train_with_tiermem(path, daemon, tmp, steps, f"dropagain{os.getpid()}", run)
    module = reference.to(args.device)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    theirs = []
    for step in range(steps):
        ids, nxt = (x.to(args.device) for x in parity.batch(dump, step, (B, T)))
        optimizer.zero_grad()
        loss = module(ids, nxt)[1]
        loss.backward()
        optimizer.step()
        theirs.append(loss.item())
    mine, pytorch = sum(ours[-tail:]) / tail, sum(theirs[-tail:]) / tail
    print(f"import_nanogpt_dropout_mean_loss_vs_torch_ratio {mine / pytorch:.4f} (steps {steps - tail}-{steps}: "
          f"ours {mine:.4f}, PyTorch {pytorch:.4f}; {open(path).read().count('probability: 0.2')} ops drop out; "
          f"same seed again: {'the same bits' if again == ours else 'OTHER BITS'})")


if __name__ == "__main__":
    main()

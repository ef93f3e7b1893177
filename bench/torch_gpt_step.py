#!/usr/bin/python3
"""PyTorch on the GPU, the baseline of the GPT in bench/gpu.sh: the GPT of
config/models/gpt_tiny.pbtxt (tests/executor/gpt_torch.py), fp32 with TF32
off, Adam, on random byte sequences copied in from pinned host memory every
step, the loss read back every step (as tiermem-exec does). Eager, and the
whole step captured once as a CUDA graph and replayed (Adam
capturable=True). Prints `torch_<tag>_eager_step_ms_median V ms` and
`torch_<tag>_graph_step_ms_median V ms`.

With --cpu THREADS: on the CPU, eager only (the baseline of
bench/exec_vs_torch.sh), on that many threads. With --bf16: the forward
pass and the loss under autocast to bf16 (PyTorch's mixed precision: bf16
GEMMs, fp32 parameters and optimizer), in the graph too (its cast cache off,
as graph capture needs).

usage: torch_gpt_step.py TAG SEQUENCES LAYERS WIDTH HEADS CONTEXT MLP LR STEPS [--cpu THREADS] [--bf16]
"""
import os
import contextlib
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "executor"))
from gpt_torch import VOCAB, Gpt  # noqa: E402

tag = sys.argv[1]
sequences, layers, width, heads, context, mlp = (int(v) for v in sys.argv[2:8])
lr, steps = float(sys.argv[8]), int(sys.argv[9])
cpu = len(sys.argv) > 11 and sys.argv[10] == "--cpu"
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cpu" if cpu else "cuda")
if cpu:
    torch.set_num_threads(int(sys.argv[11]))
torch.manual_seed(1)
host = [torch.randint(0, VOCAB, (sequences, context + 1)) for _ in range(4)]
if not cpu:
    host = [h.pin_memory() for h in host]


def build():
    model = Gpt(layers, width, heads, context, mlp).to(dev)
    return model, torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.99), capturable=not cpu)


bf16 = "--bf16" in sys.argv


def autocast():
    # torch 1.13 checks for CUDA even when autocast is disabled: enter it only for bf16.
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)


def loss_of(model, batch):
    with autocast():
        logits = model(batch[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def timed(run):
    times = []
    for step in range(steps):
        start = time.perf_counter()
        run(step)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[20:])


def eager():
    model, opt = build()
    batch = torch.empty(sequences, context + 1, dtype=torch.int64, device=dev)

    def step(i):
        batch.copy_(host[i % 4], non_blocking=True)
        opt.zero_grad(set_to_none=False)
        loss = loss_of(model, batch)
        loss.backward()
        opt.step()
        loss.item()

    return timed(step)


def graph():
    model, opt = build()
    batch = torch.empty(sequences, context + 1, dtype=torch.int64, device=dev)
    batch.copy_(host[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_of(model, batch).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = loss_of(model, batch)
        static_loss.backward()
        opt.step()

    def step(i):
        batch.copy_(host[i % 4], non_blocking=True)
        g.replay()
        static_loss.item()

    return timed(step)


print(f"torch_{tag}_eager_step_ms_median {eager():.4f} ms")
if not cpu:
    print(f"torch_{tag}_graph_step_ms_median {graph():.4f} ms")

#!/usr/bin/python3
"""PyTorch on the GPU, the baseline of bench/gpu.sh: an MLP of the given
widths (ReLU between, softmax cross-entropy), fp32 with TF32 off, trained
with SGD (momentum 0.9) or Adam on random batches copied in from pinned host
memory every step, the loss read back every step (as tiermem-exec does).
Eager, and the whole step captured once as a CUDA graph and replayed
(torch.cuda.graph, Adam capturable=True). Prints the median step times as
`torch_<tag>_eager_step_ms_median V ms` and `..._graph_step_ms_median`, and
with --sgemm the TFLOP/s of a 4096^3 sgemm alone. With --bf16 the forward
pass and loss run under autocast to bf16 (cast cache off, as graph capture
needs), and --sgemm measures a bf16 GEMM (fp32 accumulation) instead.

usage: torch_gpu_step.py TAG WIDTHS BATCH sgd|adam LR STEPS [--sgemm] [--bf16]
"""
import contextlib
import statistics
import sys
import time

import torch

tag, widths = sys.argv[1], [int(w) for w in sys.argv[2].split(",")]
batch, opt_name, lr, steps = int(sys.argv[3]), sys.argv[4], float(sys.argv[5]), int(sys.argv[6])
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
torch.manual_seed(1)

bf16 = "--bf16" in sys.argv


def autocast():
    # torch 1.13 checks for CUDA even when autocast is disabled: enter it only for bf16.
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)


def loss_of(model, x, y):
    with autocast():
        return torch.nn.functional.cross_entropy(model(x), y)


host_x = [torch.rand(batch, widths[0]).pin_memory() for _ in range(4)]
host_y = [torch.randint(0, widths[-1], (batch,)).pin_memory() for _ in range(4)]


def build():
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).to(dev)
    if opt_name == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr, capturable=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return model, opt


def median_ms(times):
    return 1e3 * statistics.median(times[20:])


def eager():
    model, opt = build()
    x = torch.empty(batch, widths[0], device=dev)
    y = torch.empty(batch, dtype=torch.int64, device=dev)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        x.copy_(host_x[step % 4], non_blocking=True)
        y.copy_(host_y[step % 4], non_blocking=True)
        opt.zero_grad(set_to_none=False)
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - start)
    return median_ms(times)


def graph():
    model, opt = build()
    x = torch.empty(batch, widths[0], device=dev)
    y = torch.empty(batch, dtype=torch.int64, device=dev)
    x.copy_(host_x[0])
    y.copy_(host_y[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_of(model, x, y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = loss_of(model, x, y)
        static_loss.backward()
        opt.step()
    times = []
    for step in range(steps):
        start = time.perf_counter()
        x.copy_(host_x[step % 4], non_blocking=True)
        y.copy_(host_y[step % 4], non_blocking=True)
        g.replay()
        static_loss.item()
        times.append(time.perf_counter() - start)
    return median_ms(times)


print(f"torch_{tag}_eager_step_ms_median {eager():.4g} ms")
print(f"torch_{tag}_graph_step_ms_median {graph():.4g} ms")
if "--sgemm" in sys.argv:
    kind = torch.bfloat16 if bf16 else torch.float32
    a = torch.rand(4096, 4096, device=dev, dtype=kind)
    b = torch.rand(4096, 4096, device=dev, dtype=kind)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    runs = []
    for _ in range(20):
        start = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - start)
    print(f"torch_{'bf16_gemm' if bf16 else 'sgemm'}_4096_tflops {2 * 4096 ** 3 / statistics.median(runs) / 1e12:.4g} TFLOP/s")

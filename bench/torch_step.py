#!/usr/bin/python3
"""PyTorch eager baseline for bench/exec_vs_torch.sh: trains an MLP of the
given layer widths (ReLU between, Adam, softmax cross-entropy) on
Fashion-MNIST with the given batch and thread count, and prints the median
step time (forward, backward, optimizer) as `torch_step_ms_median V ms`.

usage: torch_step.py WIDTHS BATCH THREADS STEPS LR   (WIDTHS like 784,256,128,10)
"""
import gzip
import statistics
import sys
import time

import numpy as np
import torch

widths = [int(w) for w in sys.argv[1].split(",")]
batch, threads, steps, lr = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
torch.set_num_threads(threads)
torch.manual_seed(1)

root = "/usr/share/datasets/fashion-mnist"
with gzip.open(f"{root}/train-images-idx3-ubyte.gz") as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255
with gzip.open(f"{root}/train-labels-idx1-ubyte.gz") as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
x_all, y_all = torch.from_numpy(images), torch.from_numpy(labels)

layers = []
for i in range(len(widths) - 1):
    layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
    if i + 2 < len(widths):
        layers.append(torch.nn.ReLU())
model = torch.nn.Sequential(*layers)
optimizer = torch.optim.Adam(model.parameters(), lr=lr)
order = torch.randperm(x_all.shape[0])
times = []
for step in range(steps):
    idx = order[(step * batch) % (x_all.shape[0] - batch):][:batch]
    x, y = x_all[idx], y_all[idx]
    start = time.perf_counter()
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    times.append(time.perf_counter() - start)
print(f"torch_step_ms_median {1e3 * statistics.median(times[10:]):.4g} ms")
print(f"torch_final_loss {loss.item():.4f}")

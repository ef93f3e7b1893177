#!/usr/bin/python3
"""PyTorch reference for the parity test: trains the same MLP from the same
initial weights on the same batches that tiermem-exec dumped, and prints the
loss of every step (one per line).

usage: torch_reference.py DUMP_DIR STEPS MICRO_BATCHES LR MOMENTUM
"""
import os
import sys

import numpy as np
import torch

dump, steps, micro_batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lr, momentum = float(sys.argv[4]), float(sys.argv[5])
torch.set_num_threads(1)


def load(name, dtype, shape):
    return torch.from_numpy(np.fromfile(os.path.join(dump, name), dtype=dtype).reshape(shape))


w1 = load("w1.f32", np.float32, (64, 128))
b1 = load("b1.f32", np.float32, (128,))
w2 = load("w2.f32", np.float32, (128, 10))
b2 = load("b2.f32", np.float32, (10,))
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
with torch.no_grad():
    # tiermem keeps weights as [in, out]; torch.nn.Linear as [out, in].
    model[0].weight.copy_(w1.t())
    model[0].bias.copy_(b1)
    model[2].weight.copy_(w2.t())
    model[2].bias.copy_(b2)
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
for step in range(steps):
    xs = [load(f"batch{step}_mb{m}.x.f32", np.float32, (-1, 64)) for m in range(micro_batches)]
    ys = [load(f"batch{step}_mb{m}.y.i32", np.int32, (-1,)).long() for m in range(micro_batches)]
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(torch.cat(xs)), torch.cat(ys))
    loss.backward()
    optimizer.step()
    print(f"{loss.item():.9e}")

#!/usr/bin/python3
"""PyTorch reference for the GPT parity test: the GPT of
config/models/gpt_tiny.pbtxt written as a PyTorch module, given the initial
parameters and the batches tiermem-exec dumped (by tensor name), trained with
the same Adam; prints the loss of every step (one per line).

usage: torch_gpt_reference.py DUMP_DIR STEPS MICRO_BATCHES LAYERS WIDTH HEADS CONTEXT MLP LR BETA1 BETA2
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_torch import Gpt  # noqa: E402 (beside this script)

dump, steps, micro_batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
layers, width, heads, context, mlp = (int(v) for v in sys.argv[4:9])
lr, beta1, beta2 = (float(v) for v in sys.argv[9:12])
vocab = 256
torch.set_num_threads(1)


def load(name, dtype=np.float32, shape=(-1,)):
    return torch.from_numpy(np.fromfile(os.path.join(dump, name), dtype=dtype).reshape(shape))


model = Gpt(layers, width, heads, context, mlp)
with torch.no_grad():
    # tiermem keeps weights as [in, out]; torch.nn.Linear as [out, in].
    model.tok.weight.copy_(load("tok.f32", shape=(vocab, width)))
    model.pos.copy_(load("pos.f32", shape=(context, width)))
    for i, block in enumerate(model.blocks):
        p = f"b{i}."
        for name, linear in (("qkv", block.attn.qkv), ("proj", block.attn.proj), ("fc", block.fc), ("out", block.out)):
            linear.weight.copy_(load(p + name + ".w.f32", shape=(linear.in_features, linear.out_features)).t())
            linear.bias.copy_(load(p + name + ".b.f32"))
        for name, norm in (("ln1", block.ln1), ("ln2", block.ln2)):
            norm.weight.copy_(load(p + name + ".g.f32"))
            norm.bias.copy_(load(p + name + ".b.f32"))
    model.lnf.weight.copy_(load("lnf.g.f32"))
    model.lnf.bias.copy_(load("lnf.b.f32"))
    model.head.weight.copy_(load("head.w.f32", shape=(width, vocab)).t())
optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(beta1, beta2), eps=1e-8)
for step in range(steps):
    ids = torch.cat([load(f"batch{step}_mb{m}.ids.i32", np.int32).long() for m in range(micro_batches)])
    nxt = torch.cat([load(f"batch{step}_mb{m}.next.i32", np.int32).long() for m in range(micro_batches)])
    optimizer.zero_grad()
    logits = model(ids.view(-1, context))
    loss = F.cross_entropy(logits.reshape(-1, vocab), nxt)
    loss.backward()
    optimizer.step()
    print(f"{loss.item():.9e}")

#!/usr/bin/env python3
"""nanoGPT's model.py as published (tests/python/models/nanogpt_model.py) at
a given size, the baseline of bench/gpu.sh's GPT section (issue 49): the
model is exported by tiermem.fx for tiermem-exec (with nanoGPT's own AdamW:
decay and no-decay groups) and trained by PyTorch on the same GPU the way a
nanoGPT user trains it: autocast to bf16, its scaled_dot_product_attention,
fused AdamW; eager, and under torch.compile. Random byte sequences, copied
in every step, the loss read back every step (as tiermem-exec does).

Prints
    torch_<tag>_eager_step_ms_median V ms
    torch_<tag>_compile_step_ms_median V ms   (where torch.compile works)
    nanogpt_<tag>_flops_per_step V            (nanoGPT's estimate_mfu: 6 N + 12 L H Q T per token)
    nanogpt_<tag>_parameters V
    torch_<tag>_{eager,compile}_peak_vram_mib V MiB   (torch.cuda.max_memory_allocated)

usage: torch_nanogpt_step.py TAG LAYERS HEADS WIDTH CONTEXT SEQUENCES VOCAB STEPS OUT.pbtxt
(STEPS 0: the export alone)
"""
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python", "models"))
from nanogpt_model import GPT, GPTConfig  # noqa: E402

tag = sys.argv[1]
layers, heads, width, context, sequences, vocab, steps = (int(v) for v in sys.argv[2:9])
out = sys.argv[9]
LR, BETAS, DECAY = 1e-3, (0.9, 0.99), 0.1  # nanoGPT's shakespeare_char recipe


def make():
    torch.manual_seed(1)
    # bias=False and dropout 0 (train.py's bias default; dropout off so that
    # both sides time the same mathematics).
    return GPT(GPTConfig(block_size=context, vocab_size=vocab, n_layer=layers, n_head=heads, n_embd=width,
                         dropout=0.0, bias=False))


def export():
    import tiermem.fx
    model = make()
    ids = torch.zeros(sequences, context, dtype=torch.long)
    opt = model.configure_optimizers(DECAY, LR, BETAS, "cpu")
    tiermem.fx.export(model, (ids, ids), out, dataset="text:fortunes", optimizer=opt)
    return model


def timed(run):
    times = []
    for step in range(steps):
        start = time.perf_counter()
        run(step)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[min(20, steps // 2):])


def train(compiled):
    model = make().cuda()
    opt = model.configure_optimizers(DECAY, LR, BETAS, "cuda")
    run = torch.compile(model) if compiled else model
    host = [torch.randint(0, 256, (2, sequences, context)).pin_memory() for _ in range(4)]
    batch = torch.empty(2, sequences, context, dtype=torch.int64, device="cuda")  # inputs and targets, as train.py's x, y

    def step(i):
        batch.copy_(host[i % 4], non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = run(batch[0], batch[1])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    ms = timed(step)
    del model, opt, run
    torch.cuda.empty_cache()
    return ms


model = export()
n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
flops = (6 * n + 12 * layers * heads * (width // heads) * context) * sequences * context
print(f"nanogpt_{tag}_parameters {n}")
print(f"nanogpt_{tag}_flops_per_step {flops}")
if steps == 0 or not torch.cuda.is_available():  # 0 steps: the export alone
    sys.exit(0)
torch.backends.cuda.matmul.allow_tf32 = True  # as nanoGPT's train.py sets
torch.backends.cudnn.allow_tf32 = True
torch.cuda.reset_peak_memory_stats()
print(f"torch_{tag}_eager_step_ms_median {train(False):.4f} ms", flush=True)
print(f"torch_{tag}_eager_peak_vram_mib {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
torch.cuda.reset_peak_memory_stats()
try:
    print(f"torch_{tag}_compile_step_ms_median {train(True):.4f} ms")
    print(f"torch_{tag}_compile_peak_vram_mib {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
except Exception as e:  # no compiler toolchain on the machine, say
    print(f"# torch.compile failed: {type(e).__name__}: {str(e)[:200]}")

"""Import a PyTorch module as a tiermem-exec model (X1): run it once on
example inputs and capture what it computes at the ATen level, map that to
the graph IR, check the IR against the module, and write the model file that
`tiermem-exec train` takes, with the module's parameters beside it.

    import tiermem.fx
    from model import GPT, GPTConfig                  # nanoGPT's model.py, unchanged
    model = GPT(GPTConfig(block_size=64, vocab_size=256, n_layer=4, n_head=4, n_embd=128, dropout=0.0))
    ids = torch.zeros(8, 64, dtype=torch.long)
    tiermem.fx.export(model, (ids, ids), "gpt.pbtxt", dataset="text:fortunes",
                      optimizer={"type": "ADAM", "learning_rate": 1e-3})
    # tiermem-exec train gpt.pbtxt ...

The inputs: token ids [B, T] (or features [B, C]) and, optionally, the
targets [B, T] (the next token of each position: what tiermem-exec's text
datasets give; for features, a class per sample). B is the micro-batch. A
module given the targets returns its loss (alone or beside the logits: a
cross-entropy, as nanoGPT's does); one given only the ids returns logits
[B, T, V], and the loss is cross-entropy against the next token.

The module runs under make_fx (torch.fx.experimental.proxy_tensor) in
training mode, its parameters and buffers passed in, so code on sizes,
branches, buffers and tied parameters trace as they run; what maps
(_lower.py has the rules):

    aten.embedding (ids)                 EMBEDDING
    embedding of arange(T), or x + P[T,C] POSITION_EMBEDDING (rows 0..T-1)
    mm / addmm / + bias (Linear, Conv1D) MATMUL (+ BIAS_ADD); MATMUL_NT for a tied head
    native_layer_norm, eps 1e-5          LAYER_NORM (with or without bias)
    gelu (tanh / exact), relu, silu      GELU, GELU_EXACT, RELU, SILU
    RMS norm (any way it is written)     RMS_NORM (its eps from the graph)
    x + y, x * y                         ADD, MUL (SwiGLU's gate)
    causal self-attention                (CONCAT +) CAUSAL_ATTENTION (heads, grouped-query kv heads)
    dropout (an activation's)            DROPOUT (tiermem-exec's own masks, from counters)
    dropout of attention's probabilities CAUSAL_ATTENTION's probability (nanoGPT's attn_dropout, SDPA's
                                         dropout_p)
    rotary positions (half rotation)     ROTARY (theta from the module's inv_freq)
    log_softmax + nll_loss (mean)        SOFTMAX_CROSS_ENTROPY

Attention is whatever region of the graph, from the activations it reads to
the heads put back side by side, computes softmax(q k^T / sqrt(d)) v with a
causal mask, however it is written (a mask buffer or triu, a scale by
multiply or divide, SDPA with is_causal): the region is run on random values
against the IR's op and maps only if they agree; so are RMS norms, rotary
positions and elementwise activations written in small ops.

A parameter held under several names (nanoGPT's lm_head tied to wte) is one
parameter. Before anything is written the IR is run in PyTorch on the
example inputs: its loss and every parameter's gradient must be the
module's (dropout checked as the identity on both sides), or the export is
refused. Anything the IR cannot express (a layer norm's eps other than 1e-5,
random draws other than dropout's, ops outside these patterns) is an
UnsupportedError naming the ATen op, the module and the source line.

The optimizer is the one the user built (torch.optim's SGD, Adam, AdamW;
nanoGPT's decay and no-decay groups) or a dict of its fields, with nanoGPT's
learning-rate schedule; see export().
"""

import math
import os

import torch

from tiermem._capture import capture
from tiermem._check import check
from tiermem._lower import Lowering, UnsupportedError
from tiermem._optim import optimizer_fields

__all__ = ["CausalSelfAttention", "UnsupportedError", "export"]


class CausalSelfAttention(torch.nn.Module):
    """Multi-head causal self-attention: q, k and v from one Linear, each
    token attending to itself and those before it, then a projection. (Any
    module computing this maps; this one is here for models written for an
    earlier tiermem.fx.)"""

    def __init__(self, width, heads):
        super().__init__()
        if width % heads != 0:
            raise ValueError(f"{heads} heads do not divide the width {width}")
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        y = scores.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


def _line(t):
    line = f'tensor {{ name: "{t["name"]}" shape: [{", ".join(str(d) for d in t["shape"])}] role: {t["role"]}'
    if t["dtype"] != "F32":
        line += f" dtype: {t['dtype']}"
    return line


def _write(ir, path, header, loss, optimizer, no_decay=()):
    params_dir = path + ".params"
    lines = list(header)
    for t in ir.tensors:
        line = _line(t)
        if t["name"] in no_decay:
            line += " no_weight_decay: true"
        if t["values"] is not None:
            os.makedirs(params_dir, exist_ok=True)
            file = t["name"] + ".f32"
            t["values"].detach().to(torch.float32).contiguous().cpu().numpy().tofile(os.path.join(params_dir, file))
            line += f' init: FILE init_file: "{os.path.basename(params_dir)}/{file}"'
        lines.append(line + " }")
    for op in ir.ops:
        ins = ", ".join(f'"{i}"' for i in op["inputs"])
        fields = "".join(f" {k}: {v}" for k, v in op["fields"].items())
        lines.append(f'op {{ name: "{op["output"]}" type: {op["kind"]} input: [{ins}] output: "{op["output"]}"'
                     f"{fields} }}")
    opt = " ".join(f"{k}: {v}" for k, v in optimizer.items())
    lines += [f'loss: "{loss}"', f"optimizer {{ {opt} }}"]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


def export(module, example_input, path, *, dataset, optimizer=None, schedule=None, grad_clip=None, name=None,
           description=""):
    """Captures `module` on `example_input` (token ids [B, T] or features
    [B, C], or a tuple of them and the targets) and writes PATH (the model)
    and PATH.params/ (its parameters).

    `optimizer`: the torch.optim SGD, Adam or AdamW built for the module
    (before its first step; parameter groups may differ in weight decay
    only, as nanoGPT's configure_optimizers makes them: the group without
    decay is marked in the IR), or a dict of the IR's fields {"type":
    "ADAM"|"ADAMW"|"SGD", "learning_rate", "beta1", "beta2", "epsilon",
    "momentum", "weight_decay"} with PyTorch's defaults for what is not
    given (Adam at 1e-3 if nothing is). `schedule`: {"warmup_steps",
    "decay_steps", "min_learning_rate"}, nanoGPT's get_lr (linear warm-up,
    cosine to the floor at decay_steps); none: a constant learning rate.
    `grad_clip`: the largest global gradient norm, as the training loop's
    torch.nn.utils.clip_grad_norm_(parameters, grad_clip) (nanoGPT's
    grad_clip); none or 0: no clipping.

    Raises UnsupportedError for what the IR cannot express, and where the IR
    it made does not give the module's loss and gradients. Returns PATH."""
    # The optimizer first: a refusal costs no capture.
    opt, without = optimizer_fields(optimizer, schedule, module, grad_clip)
    inputs = tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)
    # Training feeds whole rows: a slice of a batch (strided) is traced as
    # the rows it holds.
    inputs = tuple(x.contiguous() if isinstance(x, torch.Tensor) else x for x in inputs)
    if not inputs or not isinstance(inputs[0], torch.Tensor):
        raise ValueError("example_input: a tensor of token ids or features, or a tuple (ids, targets)")
    first = inputs[0]
    tokens = first.dtype in (torch.int32, torch.int64)
    if tokens and first.dim() != 2:
        raise ValueError(f"token ids [B, T] expected, not {list(first.shape)}")
    if not tokens and first.dim() != 2:
        raise ValueError(f"features [B, C] expected, not {list(first.shape)}")
    micro_batch = int(first.shape[0])
    context = int(first.shape[1]) if tokens else 1
    was_training = module.training
    module.train()
    try:
        captured = capture(module, inputs)
    finally:
        module.train(was_training)
    lowering = Lowering(captured, tokens, micro_batch, context)
    ir = lowering.run()
    check(captured, lowering, inputs)
    no_decay = {ir_name for ir_name, (node, _) in ir.sources.items() if id(captured.params[node][1]) in without}
    title = type(module).__name__
    header = [f"# Exported by tiermem.fx from {title} ({os.path.basename(path)}.params/: its parameters)"]
    header += [f"# {note}" for note in ir.notes]
    header += [f'name: "{name or title}"', f'description: "{description or title + " from PyTorch"}"',
               f'dataset: "{dataset}"', f"micro_batch: {micro_batch}"]
    _write(ir, path, header, lowering.loss.ir, opt, no_decay)
    return path

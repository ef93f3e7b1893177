"""Import a PyTorch module as a tiermem-exec model (X1): trace it with
torch.fx, map its modules and functions to the graph IR, copy its parameters,
and write the model file that `tiermem-exec train` takes.

    import tiermem.fx
    model = MyGpt()                                    # a torch.nn.Module of token ids [B, T]
    tiermem.fx.export(model, torch.zeros(8, 32, dtype=torch.long), "gpt.pbtxt",
                      dataset="text:fortunes", optimizer={"type": "ADAM", "learning_rate": 3e-3})
    # tiermem-exec train gpt.pbtxt ...

The module takes one tensor of token ids [B, T] (or features [B, C]) and
returns logits [B, T, V] ([B, V]); the loss is softmax cross-entropy against
the next token (the label of each row). Tensors of the IR are matrices whose
rows are tokens: [B, T, C] becomes [B*T, C]. What maps:

    torch.nn.Embedding                   EMBEDDING (the first op on the ids)
    x + parameter [T, C]                 POSITION_EMBEDDING
    torch.nn.Linear                      MATMUL (+ BIAS_ADD)
    torch.nn.LayerNorm (eps 1e-5)        LAYER_NORM
    GELU (approximate='tanh'), ReLU      GELU, RELU (modules or functions)
    x + y (activations)                  ADD
    CausalSelfAttention                  MATMUL, BIAS_ADD, CAUSAL_ATTENTION, MATMUL, BIAS_ADD

CausalSelfAttention is this module's class, or any module whose class has
that name and holds `qkv` (Linear C -> 3C), `proj` (Linear C -> C) and
`heads`: traced as a whole, not through its body. Anything else is an
UnsupportedError naming the op and the line of the module that made it.
The parameters go into files beside the model (PATH.params/NAME.f32), which
the model names (`init: FILE`): training starts where the module is.
"""

import math
import operator
import os

import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.passes.shape_prop import ShapeProp

__all__ = ["CausalSelfAttention", "UnsupportedError", "export"]


class UnsupportedError(ValueError):
    """A module or function the IR has no op for (names it and where)."""


class CausalSelfAttention(torch.nn.Module):
    """Multi-head causal self-attention: q, k and v from one Linear, each
    token attending to itself and those before it, then a projection."""

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


def _is_attention(m):
    return isinstance(m, CausalSelfAttention) or (
        type(m).__name__ == "CausalSelfAttention" and isinstance(getattr(m, "qkv", None), torch.nn.Linear)
        and isinstance(getattr(m, "proj", None), torch.nn.Linear) and isinstance(getattr(m, "heads", None), int))


_LEAVES = (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm, torch.nn.GELU, torch.nn.ReLU)


class _Tracer(torch.fx.Tracer):
    def __init__(self):
        super().__init__()
        self.record_stack_traces = True

    def is_leaf_module(self, m, qualname):
        return isinstance(m, _LEAVES) or _is_attention(m) or super().is_leaf_module(m, qualname)


def _where(node):
    """The line of the module that made `node` (the last frame of its trace)."""
    trace = (node.stack_trace or "").strip().splitlines()
    frames = [l.strip() for l in trace if l.strip().startswith("File ")]
    # The frame of a module's forward (torch.fx records the whole stack).
    forward = [f for f in frames if f.endswith("in forward") and "/torch/" not in f]
    return forward[-1] if forward else frames[-1] if frames else "(no source line recorded)"


class _Writer:
    def __init__(self, path, micro_batch, context):
        self.path, self.micro_batch, self.context = path, micro_batch, context
        self.params_dir = path + ".params"
        self.tensors, self.ops, self.names = [], [], set()

    def unique(self, name):
        name = name.replace("/", ".")
        base, n = name, 1
        while name in self.names:
            name, n = f"{base}.{n}", n + 1
        self.names.add(name)
        return name

    def tensor(self, name, shape, role, dtype="F32", values=None):
        line = f'tensor {{ name: "{name}" shape: [{", ".join(str(int(d)) for d in shape)}] role: {role}'
        if dtype != "F32":
            line += f" dtype: {dtype}"
        if values is not None:
            os.makedirs(self.params_dir, exist_ok=True)
            file = name + ".f32"
            values.detach().to(torch.float32).contiguous().cpu().numpy().tofile(os.path.join(self.params_dir, file))
            line += f' init: FILE init_file: "{os.path.basename(self.params_dir)}/{file}"'
        self.tensors.append(line + " }")
        return name

    def param(self, name, value):
        return self.tensor(self.unique(name), list(value.shape), "PARAM", values=value)

    def op(self, kind, inputs, name_hint, extra=""):
        out = self.unique(name_hint)
        ins = ", ".join(f'"{i}"' for i in inputs)
        self.ops.append(f'op {{ name: "{out}" type: {kind} input: [{ins}] output: "{out}"{extra} }}')
        return out


def export(module, example_input, path, *, dataset, optimizer=None, name=None, description=""):
    """Traces `module` on `example_input` (token ids [B, T], or features
    [B, C]) and writes PATH (the model) and PATH.params/ (its parameters).
    B is the micro-batch. `optimizer`: {"type": "ADAM"|"SGD", "learning_rate",
    "beta1", "beta2", "epsilon", "momentum", "weight_decay"} (Adam, 1e-3 if
    not given). Raises UnsupportedError for what the IR cannot express.
    Returns PATH."""
    module = module.eval()
    tracer = _Tracer()
    graph = tracer.trace(module)
    gm = torch.fx.GraphModule(tracer.root, graph)
    ShapeProp(gm).propagate(example_input)
    tokens = example_input.dtype in (torch.int32, torch.int64)
    micro_batch = int(example_input.shape[0])
    context = int(example_input.shape[1]) if tokens and example_input.dim() == 2 else 1
    rows = micro_batch * context
    w = _Writer(path, micro_batch, context)
    modules = dict(gm.named_modules())
    ir = {}  # fx node -> IR tensor name (activations) or ("param", name, value)

    def shape(node):
        return list(node.meta["tensor_meta"].shape)

    def cols(node):
        return int(shape(node)[-1])

    def arg(a):
        if a not in ir:
            raise UnsupportedError(f"{a.name}: its value comes from what the importer does not map ({_where(a)})")
        return ir[a]

    def linear(lin, x, hint):
        y = w.op("MATMUL", [x, w.param(hint + ".weight", lin.weight.t())], hint)
        if lin.bias is not None:
            y = w.op("BIAS_ADD", [y, w.param(hint + ".bias", lin.bias)], hint + ".add_bias")
        return y

    logits = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if ir:
                raise UnsupportedError(f"{node.name}: the module takes one input, the ids or features ({_where(node)})")
            if tokens:
                ir[node] = w.tensor("ids", [rows], "INPUT", dtype="I32")
            else:
                ir[node] = w.tensor("x", [micro_batch, int(example_input.shape[1])], "INPUT")
        elif node.op == "get_attr":
            value = gm
            for part in node.target.split("."):
                value = getattr(value, part)
            ir[node] = ("param", node.target, value)
        elif node.op == "call_module":
            m = modules[node.target]
            x = arg(node.args[0])
            if isinstance(m, torch.nn.Embedding):
                ir[node] = w.op("EMBEDDING", [x, w.param(node.target + ".weight", m.weight)], node.target)
            elif isinstance(m, torch.nn.Linear):
                ir[node] = linear(m, x, node.target)
            elif isinstance(m, torch.nn.LayerNorm):
                if abs(m.eps - 1e-5) > 1e-12 or not m.elementwise_affine or len(m.normalized_shape) != 1:
                    raise UnsupportedError(f"{node.target}: LayerNorm with eps 1e-5 over the last dimension, "
                                           f"with weight and bias, is what maps ({_where(node)})")
                ir[node] = w.op("LAYER_NORM", [x, w.param(node.target + ".weight", m.weight),
                                               w.param(node.target + ".bias", m.bias)], node.target)
            elif isinstance(m, torch.nn.GELU):
                if m.approximate != "tanh":
                    raise UnsupportedError(f"{node.target}: GELU(approximate='tanh') maps, not '{m.approximate}' "
                                           f"({_where(node)})")
                ir[node] = w.op("GELU", [x], node.target)
            elif isinstance(m, torch.nn.ReLU):
                ir[node] = w.op("RELU", [x], node.target)
            elif _is_attention(m):
                qkv = linear(m.qkv, x, node.target + ".qkv")
                att = w.op("CAUSAL_ATTENTION", [qkv], node.target + ".attention",
                           f" heads: {m.heads} context: {context}")
                ir[node] = linear(m.proj, att, node.target + ".proj")
            else:
                raise UnsupportedError(f"module {node.target} ({type(m).__name__}) has no op in the IR ({_where(node)})")
        elif node.op in ("call_function", "call_method"):
            target = node.target
            if target in (operator.add, torch.add, "add") and len(node.args) == 2:
                a, b = (arg(v) for v in node.args)
                if isinstance(b, tuple):
                    a, b = b, a
                if isinstance(a, tuple):  # a parameter [T, C] added to every sequence
                    _, pname, value = a
                    if list(value.shape) != [context, cols(node)]:
                        raise UnsupportedError(f"{pname} {list(value.shape)} added to {node.args}: a parameter "
                                               f"added maps as a position table [context, C] ({_where(node)})")
                    ir[node] = w.op("POSITION_EMBEDDING", [b, w.param(pname, value)], node.name)
                else:
                    ir[node] = w.op("ADD", [a, b], node.name)
            elif target in (F.gelu,) and node.kwargs.get("approximate") == "tanh":
                ir[node] = w.op("GELU", [arg(node.args[0])], node.name)
            elif target in (F.relu, torch.relu, "relu"):
                ir[node] = w.op("RELU", [arg(node.args[0])], node.name)
            else:
                what = target if isinstance(target, str) else getattr(target, "__name__", str(target))
                raise UnsupportedError(f"{what} has no op in the IR ({_where(node)})")
        elif node.op == "output":
            logits = arg(node.args[0])
    if logits is None or isinstance(logits, tuple):
        raise UnsupportedError("the module returns no logits the importer made")
    label_rows = rows if tokens else micro_batch
    label = w.tensor(w.unique("next" if tokens else "y"), [label_rows], "LABEL", dtype="I32")
    loss = w.op("SOFTMAX_CROSS_ENTROPY", [logits, label], "loss")
    opt = {"type": "ADAM", "learning_rate": 1e-3}
    opt.update(optimizer or {})
    fields = " ".join(f"{k}: {v}" for k, v in opt.items())
    header = [f"# Exported by tiermem.fx from {type(module).__name__} ({os.path.basename(path)}.params/: its parameters)",
              f'name: "{name or type(module).__name__}"',
              f'description: "{description or type(module).__name__ + " from PyTorch"}"',
              f'dataset: "{dataset}"', f"micro_batch: {micro_batch}"]
    with open(path, "w") as f:
        f.write("\n".join(header + w.tensors + w.ops + [f'loss: "{loss}"', f"optimizer {{ {fields} }}"]) + "\n")
    return path

"""The export's own check, for tiermem.fx: the IR it wrote, run in PyTorch
op by op, must give the module's loss and the module's gradient for every
parameter on the example inputs, or the export is refused. A change of the
model the importer did not mean (a tie lost, a mask read wrong, a scale
dropped) shows as a loss or a gradient that differs; nothing is written then.
Dropout is checked as the identity on both sides (its draws are PyTorch's in
the module and tiermem-exec's in the IR): the module's masks keep
everything, the IR's DROPOUT passes its input, its attention keeps every
probability.
"""

import math

import torch
import torch.nn.functional as F

from tiermem._lower import UnsupportedError, _op_name, sdpa_dropout, causal_attention, rotary

# fp32 sums in a different order: far below what a changed model gives.
LOSS_TOLERANCE = 1e-4
GRAD_TOLERANCE = 1e-3


def _ir_forward(ir, tensors, context):
    """Runs the IR's ops in PyTorch; `tensors` holds the inputs and the
    parameters by name and gets every result."""
    for op in ir.ops:
        x = [tensors[i] for i in op["inputs"]]
        kind = op["kind"]
        if kind == "EMBEDDING":
            y = F.embedding(x[0].long(), x[1])
        elif kind == "POSITION_EMBEDDING":
            y = (x[0].reshape(-1, context, x[0].shape[1]) + x[1]).reshape(x[0].shape)
        elif kind == "MATMUL":
            y = x[0] @ x[1]
        elif kind == "MATMUL_NT":
            y = x[0] @ x[1].t()
        elif kind == "BIAS_ADD" or kind == "ADD":
            y = x[0] + x[1]
        elif kind == "LAYER_NORM":
            y = F.layer_norm(x[0], x[1].shape, x[1], x[2] if len(x) > 2 else None, 1e-5)
        elif kind == "GELU":
            y = F.gelu(x[0], approximate="tanh")
        elif kind == "GELU_EXACT":
            y = F.gelu(x[0])
        elif kind == "RELU":
            y = F.relu(x[0])
        elif kind == "SILU":
            y = F.silu(x[0])
        elif kind == "CONCAT":
            y = torch.cat(x, dim=1)
        elif kind == "MUL":
            y = x[0] * x[1]
        elif kind == "RMS_NORM":
            eps = op["fields"].get("epsilon", 1e-5)
            y = x[0] * torch.rsqrt(x[0].pow(2).mean(-1, keepdim=True) + eps) * x[1]
        elif kind == "ROTARY":
            f = op["fields"]
            y = rotary(x[0], f["heads"], f.get("kv_heads"), f["context"], f["theta"])
        elif kind == "CAUSAL_ATTENTION":
            f = op["fields"]
            y = causal_attention(x[0], f["heads"], f["context"], f.get("kv_heads"))
        elif kind == "DROPOUT":
            y = x[0]
        elif kind == "SOFTMAX_CROSS_ENTROPY":
            y = F.cross_entropy(x[0], x[1].long())
        else:
            raise AssertionError(f"the check has no rule for {kind}")
        tensors[op["output"]] = y
    return tensors


def check(captured, lowering, inputs):
    """Raises UnsupportedError where the IR and the module disagree."""
    ir = lowering.ir
    gm = captured.graph_module
    params = {n: t.detach().clone().requires_grad_(True) for n, (_, t) in captured.params.items()}
    # The module: its ATen graph, differentiated by PyTorch.
    args = list(params.values()) + [b for _, b in captured.buffers.values()] + list(inputs)
    values = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            self.current = n
            values[n] = super().run_node(n)
            return values[n]

        def call_function(self, target, args, kwargs):
            # Dropout keeps everything: 1.13's mask (bernoulli_ of keep, then
            # divided by keep) is keep, 2.x's native_dropout the identity,
            # SDPA's dropout_p 0.
            name = _op_name(self.current)
            if name == "bernoulli_" and len(args) > 1 and isinstance(args[1], float):
                return torch.full_like(args[0], args[1])
            if name == "native_dropout":
                return args[0], torch.ones_like(args[0], dtype=torch.bool)
            if "scaled_dot_product" in name:
                index, p = sdpa_dropout(self.current)
                if p > 0:
                    args, kwargs = list(args), dict(kwargs)
                    if index >= 0:
                        args[index] = 0.0
                    else:
                        kwargs["dropout_p"] = 0.0
            return super().call_function(target, tuple(args), kwargs)

    with torch.enable_grad():
        Recorder(gm).run(*args)
        if lowering.loss_node is not None:
            labels = inputs[1]
            theirs = values[lowering.loss_node]
        else:  # the loss the export adds, against labels of its own
            logits = values[lowering.logits[1]].reshape(lowering.rows, -1)
            labels = torch.randint(0, logits.shape[1], (lowering.rows,), generator=torch.Generator().manual_seed(7))
            theirs = F.cross_entropy(logits, labels)
        reached = [n for n in params if params[n].requires_grad]
        their_grads = dict(zip(reached, torch.autograd.grad(theirs, [params[n] for n in reached],
                                                            allow_unused=True)))
        # The IR, op by op.
        tensors = {}
        for t in ir.tensors:
            if t["role"] == "PARAM":
                tensors[t["name"]] = t["values"].detach().clone().to(torch.float32).requires_grad_(True)
            elif t["role"] == "INPUT":
                tensors[t["name"]] = inputs[0].reshape(-1) if t["dtype"] == "I32" else inputs[0]
            elif t["role"] == "LABEL":
                tensors[t["name"]] = labels.reshape(-1)
        ours_all = _ir_forward(ir, tensors, lowering.context)
        ours = ours_all[lowering.loss.ir]
        names = [t["name"] for t in ir.tensors if t["role"] == "PARAM"]
        our_grads = dict(zip(names, torch.autograd.grad(ours, [tensors[n] for n in names], allow_unused=True)))
    a, b = ours.item(), theirs.item()
    if not math.isfinite(a) or abs(a - b) > LOSS_TOLERANCE * max(1.0, abs(b)):
        raise UnsupportedError(f"the exported graph's loss on the example inputs is {a:.7g} where the module's is "
                               f"{b:.7g}: the IR does not compute what the module does, nothing was written")
    covered = {}
    for name in names:
        node, how = ir.sources[name]
        g = their_grads.get(node)
        g = torch.zeros_like(params[node]) if g is None else g
        if how == "t":
            want = g.t()
        elif how == "as_is":
            want = g
        else:
            want = g[list(how)]
            covered.setdefault(node, set()).update(how)
        got = our_grads[name]
        got = torch.zeros_like(want) if got is None else got
        scale = max(float(want.abs().max()), 1e-6) if want.numel() else 1.0
        err = float((got - want).abs().max()) if want.numel() else 0.0
        if err > GRAD_TOLERANCE * scale:
            pname = captured.params[node][0]
            raise UnsupportedError(f"the exported graph's gradient of {pname} differs from the module's by "
                                   f"{err / scale:.2e} (relative): the IR does not train what the module trains, "
                                   "nothing was written")
    # What PyTorch trains and the export does not.
    exported = {ir.sources[n][0] for n in names}
    for node, g in their_grads.items():
        if g is None:
            continue
        pname = captured.params[node][0]
        if node not in exported:
            if float(g.abs().max()) > 0:
                raise UnsupportedError(f"{pname} gets a gradient in PyTorch but the export does not use it")
            continue
        if node in covered:
            rest = [i for i in range(g.shape[0]) if i not in covered[node]]
            if rest and float(g[rest].abs().max()) > 0:
                raise UnsupportedError(f"{pname}: rows the export leaves out get a gradient in PyTorch")
    return a, b

"""Lowering of a captured ATen graph (_capture.py) to tiermem's graph IR,
for tiermem.fx.

The IR's tensors are matrices whose rows are tokens (or samples): an
activation [B, T, C] is the IR tensor [B*T, C], and a view between [B, T, C]
and [B*T, C] is the same tensor. Each ATen node gets a value:

    Rows       an IR activation (a view that keeps rows and columns keeps it)
    Param      a parameter as the module holds it, or transposed (t())
    Table      rows of a parameter picked by constant indices (positions)
    Ids, Labels  the token ids and the targets
    Const      computed from buffers and constants alone (masks, arange)
    Opaque     anything else: fine while nothing the IR needs reads it

Handlers map ATen ops to IR ops: embedding, mm/addmm (+ bias), layer norm
with or without bias, the activations, adds, log_softmax + nll_loss (the
loss). A region of opaque nodes that ends in a tensor of rows (the heads put
back side by side) is tried as causal self-attention: its q, k and v are
found among the activations it reads and it is run on random values against
the IR's CAUSAL_ATTENTION; it maps only if they agree. Whatever reaches the
loss through an opaque node is refused, naming the ATen op that made it, its
module and its line.

A parameter used in one layout is written in the layout its op reads (a
Linear's weight transposed for MATMUL); one used in two (a head tied to the
embedding) is written once as the module holds it, and its transposed use
becomes MATMUL_NT: one tensor, its gradients summed over its uses.
"""

import itertools
import math
import operator
import os

import torch


class UnsupportedError(ValueError):
    """What the IR cannot express: names the ATen op, the module and the line."""


# ---------------------------------------------------------------- values

class Rows:
    def __init__(self, ir, cols):
        self.ir, self.cols = ir, int(cols)


class Param:
    def __init__(self, node, transposed=False):
        self.node, self.transposed = node, transposed


class Table:
    """param[index] for a constant index vector (a position table)."""

    def __init__(self, node, index):
        self.node, self.index = node, index


class Ids:
    def __init__(self, ir):
        self.ir = ir


class Labels:
    def __init__(self, ir):
        self.ir = ir


class Const:
    pass


class Opaque:
    def __init__(self, origin, why=""):
        self.origin, self.why = origin, why


class Fresh:
    """empty_like of an activation: a tensor about to be filled (dropout's
    mask, on PyTorch 1.13)."""


class Mask:
    """Dropout's mask: bernoulli(keep) of a Fresh tensor, and once divided
    by keep, the factors dropout multiplies by."""

    def __init__(self, keep, scaled=False):
        self.keep, self.scaled = keep, scaled

    @property
    def probability(self):
        return float(f"{1 - self.keep:.9g}")


class Packed:
    """A tuple result some of whose parts map (layer norm, the loss)."""

    def __init__(self, parts):
        self.parts = parts


class LogProbs:
    def __init__(self, rows):
        self.rows = rows


class Loss:
    def __init__(self, ir):
        self.ir = ir


# Ops that only re-view or copy their input.
_ALIASES = {"view", "_unsafe_view", "_reshape_alias", "reshape", "clone", "contiguous", "alias",
            "lift_fresh_copy", "expand", "_to_copy", "to", "dropout"}

# Ops that move elements about (blamed only when nothing else is).
_LAYOUT = _ALIASES | {"t", "transpose", "permute", "split", "split_with_sizes", "getitem", "slice", "unsqueeze",
                      "squeeze", "select", "unbind", "chunk"}

# A region tried as one op holds at most this many nodes.
_REGION_LIMIT = 2000

# Element-wise functions a region may compute, with the IR op that does.
_UNARY = [("GELU", lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
          ("GELU_EXACT", torch.nn.functional.gelu),
          ("SILU", torch.nn.functional.silu),
          ("RELU", torch.relu)]

# Random draws (dropout's mask, noise).
_RANDOM = {"bernoulli_", "bernoulli", "native_dropout", "rand", "rand_like", "randn", "randn_like", "randint",
           "randint_like", "normal_", "uniform_", "exponential_", "multinomial"}

# What an op that is refused is, when its name alone does not say.
_HINTS = {
    "bernoulli_": "random draws other than dropout's mask (bernoulli(1 - p) / (1 - p) times an activation)",
    "native_dropout": "dropout of something other than an activation or attention's probabilities",
    "pow": "a power outside what the importer recognises (RMSNorm x * rsqrt(mean(x**2) + eps) * w, "
           "gelu_new written out)",
    "rsqrt": "a reciprocal square root outside RMSNorm (x * rsqrt(mean(x**2) + eps) * w)",
    "sigmoid": "the IR has no sigmoid op",
    "detach": "a detached tensor, which stops the gradient: the IR's ops pass it",
}


def _op_name(node):
    if node.target is operator.getitem:
        return "getitem"
    s = str(node.target)
    if s.startswith("aten."):
        return s.split(".")[1]
    return getattr(node.target, "__name__", s)


class _Ir:
    """The IR being written: tensors, ops, and parameter uses resolved at
    the end (a tied parameter is known only once every use is seen)."""

    def __init__(self):
        self.tensors, self.ops, self.names = [], [], set()
        self.param_uses = {}  # placeholder node -> set of layouts ("as_is", "t")
        self.tables = {}      # (placeholder node, index tuple) -> IR name
        self.sources = {}     # IR parameter -> (placeholder node, "as_is" | "t" | index tuple)
        self.notes = []       # what the export changed in form, for the model file's header

    def unique(self, name):
        name = name.replace("/", ".") or "t"
        base, n = name, 1
        while name in self.names:
            name, n = f"{base}.{n}", n + 1
        self.names.add(name)
        return name

    def tensor(self, name, shape, role, dtype="F32", values=None):
        self.tensors.append({"name": name, "shape": [int(d) for d in shape], "role": role, "dtype": dtype,
                             "values": values})
        return name

    def op(self, kind, inputs, hint, **fields):
        out = self.unique(hint)
        self.ops.append({"kind": kind, "inputs": list(inputs), "output": out, "fields": fields})
        return out


class Lowering:
    def __init__(self, captured, tokens, micro_batch, context):
        self.c = captured
        self.tokens, self.micro_batch, self.context = tokens, micro_batch, context
        self.rows = micro_batch * context if tokens else micro_batch
        self.ir = _Ir()
        self.values = {}
        self.loss = None       # Loss: the IR's loss
        self.loss_node = None  # the node of the module's loss (None: the module returns logits)
        self.logits = None     # (Rows, node) of the logits
        self.has_targets = len(captured.inputs) > 1

    # ------------------------------------------------------------ errors
    def where(self, node):
        return self.c.where(node)

    def refuse(self, node, why):
        raise UnsupportedError(f"{why} ({self.where(node)})")

    def refuse_opaque(self, value, reader):
        origin = value.origin
        name = _op_name(origin)
        hint = _HINTS.get(name)
        what = f"aten.{name}" if str(origin.target).startswith("aten.") else name
        why = value.why or (f"{what}: {hint}" if hint else f"{what} has no op in the IR")
        msg = f"{why} ({self.where(origin)})"
        if reader is not None and reader is not origin:
            msg += f"; its result reaches aten.{_op_name(reader)} ({self.where(reader)})"
        raise UnsupportedError(msg)

    # ------------------------------------------------------------ helpers
    def shape(self, node):
        v = self.c.values.get(node)
        return list(v.shape) if isinstance(v, torch.Tensor) else None

    def is_rows_shape(self, shape, cols):
        return shape is not None and len(shape) >= 1 and shape[-1] == cols and \
            math.prod(shape[:-1]) == self.rows and (len(shape) >= 2 or self.rows == 1)

    def value(self, a, reader):
        """The value of argument `a` of `reader` (must not be opaque)."""
        v = self.values.get(a) if isinstance(a, torch.fx.Node) else a
        if isinstance(v, Opaque):
            self.refuse_opaque(v, reader)
        return v

    def rows_of(self, a, reader, what):
        v = self.value(a, reader)
        if not isinstance(v, Rows):
            self.refuse(reader, f"aten.{_op_name(reader)}: its {what} is not a tensor of rows the IR holds")
        return v

    def hint(self, node, what=None):
        """The IR name of what `node` makes: its module's name where the
        module is a leaf (a Linear, a LayerNorm), else the module's name and
        the op's ("h.0.add_1")."""
        module = node.meta.get("tiermem_module", "")
        if what is not None:
            return f"{module}.{what}" if module else what
        if module in self.c.leaves:
            return module
        return f"{module}.{node.name}" if module else node.name

    def use_param(self, p, layout):
        self.ir.param_uses.setdefault(p.node, set()).add(layout)
        return ("param", p.node, layout)

    # ------------------------------------------------------------ the walk
    def run(self):
        c = self.c
        for node in c.graph_module.graph.nodes:
            if node.op == "placeholder":
                self.values[node] = self.placeholder(node)
            elif node.op == "get_attr":
                self.values[node] = Const()
            elif node.op == "call_function":
                self.values[node] = self.call(node)
            elif node.op == "output":
                self.output(node)
            else:
                self.values[node] = Opaque(node)
        return self.finish()

    def placeholder(self, node):
        if node in self.c.params:
            return Param(node)
        if node in self.c.buffers:
            return Const()
        i = self.c.inputs.index(node)
        v = self.c.values[node]
        if i == 0:
            if self.tokens:
                return Ids(self.ir.tensor("ids", [self.rows], "INPUT", dtype="I32"))
            return Rows(self.ir.tensor("x", [self.micro_batch, int(v.shape[1])], "INPUT"), v.shape[1])
        if i == 1:
            if v.dtype not in (torch.int32, torch.int64) or v.numel() != self.rows:
                self.refuse(node, f"the second input is taken as the targets: integers, one per row ({self.rows}), "
                                  f"not {list(v.shape)} {v.dtype}")
            return Labels(self.ir.tensor(self.ir.unique("next" if self.tokens else "y"), [self.rows], "LABEL",
                                         dtype="I32"))
        self.refuse(node, "the module takes the ids (or features) and optionally the targets, no more inputs")

    def depends_on_data(self, node):
        return any(not isinstance(self.values.get(a), Const) for a in node.all_input_nodes)

    def call(self, node):
        name = _op_name(node)
        mask = self.dropout_mask(node, name)
        if mask is not None:
            return mask
        if name in _RANDOM and name != "native_dropout":  # the IR draws dropout's masks, no other
            self.refuse_opaque(Opaque(node), None)
        for a in node.all_input_nodes:
            v = self.values.get(a)
            if isinstance(v, Fresh):
                self.refuse(node, f"aten.{name} reads a tensor empty_like made: the importer takes one as "
                                  "dropout's mask only (bernoulli_ of 1 - p)")
            if isinstance(v, Mask) and (name != "mul" or not v.scaled):
                self.refuse(node, f"aten.{name} reads dropout's mask: the IR's DROPOUT multiplies an activation "
                                  "(or attention's probabilities) by it, nothing else")
        if not self.depends_on_data(node):
            return Const()
        if name.endswith("_") and not name.startswith("_"):
            # In place: later reads of the tensor see what the graph does not say.
            self.refuse(node, f"aten.{name} changes a tensor of the model in place: the importer takes "
                              "out-of-place code (x = x + y, not x += y)")
        handler = getattr(self, "op_" + name, None)
        opaque = [self.values[a] for a in node.all_input_nodes if isinstance(self.values.get(a), Opaque)]
        if opaque:
            out = self.shape(node)
            if out is not None and len(out) >= 2 and self.is_rows_shape(out, out[-1]):
                found = self.region(node)
                if found is not None:
                    return found
            # Blamed on the first op the IR could not take.
            named = [o for o in opaque if o.why or _op_name(o.origin) not in _LAYOUT]
            if named:
                return Opaque(named[0].origin, named[0].why)
            if handler is None and name not in _LAYOUT:
                return Opaque(node)
            return Opaque(opaque[0].origin)
        if name in _ALIASES:
            return self.alias(node)
        if handler is None:
            return Opaque(node)
        return handler(node)

    def output(self, node):
        outs = [a for a in _flatten(node.args[0]) if isinstance(a, torch.fx.Node)]
        values = [self.values.get(a) for a in outs]
        losses = [(a, v) for a, v in zip(outs, values) if isinstance(v, Loss)]
        if len({id(v) for _, v in losses}) > 1:
            self.refuse(losses[1][0], "the module returns two losses")
        if losses:
            self.loss_node, self.loss = losses[0]
            return
        opaque = [v for v in values if isinstance(v, Opaque)]
        if self.has_targets:
            # Given the targets, the module's loss is what trains: it must map.
            if opaque:
                self.refuse_opaque(opaque[0], None)
            raise UnsupportedError("the module, given the targets, returns no cross-entropy loss "
                                   "(log_softmax and nll_loss, mean) the importer maps")
        if not values or isinstance(values[0], Opaque):
            if opaque:
                self.refuse_opaque(opaque[0], None)
        if not values or not isinstance(values[0], Rows):
            raise UnsupportedError("the module returns no logits (a tensor of rows) the importer made")
        self.logits = (values[0], outs[0])

    # ------------------------------------------------------------ handlers
    def alias(self, node):
        src = node.args[0]
        v = self.values.get(src)
        out = self.shape(node)
        if isinstance(v, Rows) and self.is_rows_shape(out, v.cols):
            return v
        if isinstance(v, (Ids, Labels)) and out is not None and math.prod(out) == self.rows:
            return v
        if isinstance(v, (LogProbs,)) and self.is_rows_shape(out, v.rows.cols):
            return v
        if isinstance(v, Param) and _op_name(node) in ("alias", "clone", "lift_fresh_copy"):
            return v
        return Opaque(node) if not isinstance(v, Opaque) else v

    def op_getitem(self, node):
        v = self.values.get(node.args[0])
        if isinstance(v, Packed):
            part = v.parts.get(node.args[1])
            return part if part is not None else Opaque(node)
        return v if isinstance(v, Opaque) else Opaque(node)

    def op_t(self, node):
        v = self.values.get(node.args[0])
        if isinstance(v, Param) and self.c.values[node].dim() == 2:
            return Param(v.node, not v.transposed)
        return v if isinstance(v, Opaque) else Opaque(node)

    def op_transpose(self, node):
        v = self.values.get(node.args[0])
        if isinstance(v, Param) and self.c.values[node].dim() == 2:
            return Param(v.node, not v.transposed)
        return v if isinstance(v, Opaque) else Opaque(node)

    op_permute = op_transpose

    def op_embedding(self, node):
        weight, index = node.args[0], node.args[1]
        padding_idx = node.args[2] if len(node.args) > 2 else node.kwargs.get("padding_idx", -1)
        scale = node.args[3] if len(node.args) > 3 else node.kwargs.get("scale_grad_by_freq", False)
        w = self.value(weight, node)
        if not isinstance(w, Param) or w.transposed:
            self.refuse(node, "aten.embedding: its table is not a parameter of the module")
        if padding_idx not in (None, -1) or scale:
            self.refuse(node, "aten.embedding with padding_idx or scale_grad_by_freq: the IR's EMBEDDING gives "
                              "every row its gradient")
        ix = self.values.get(index)
        if isinstance(ix, Ids):
            table = self.use_param(w, "as_is")
            return Rows(self.ir.op("EMBEDDING", [ix.ir, table], self.hint(node)), self.c.values[node].shape[-1])
        if isinstance(ix, Const):
            idx = self.c.values[index]
            flat = idx.reshape(-1).tolist()
            if len(flat) != self.context or idx.shape[-1] != self.context or len(set(flat)) != len(flat):
                self.refuse(node, f"aten.embedding of constant indices {list(idx.shape)}: a position table maps "
                                  f"when the indices are {self.context} distinct rows, one per position")
            return Table(w.node, tuple(flat))
        self.value(index, node)  # refuses an opaque one by its origin
        self.refuse(node, "aten.embedding: its indices are neither the token ids nor constant positions")

    def linear(self, node, x, w, bias):
        if not isinstance(w, Param):
            self.refuse(node, f"aten.{_op_name(node)}: its right operand is not a parameter (a Linear's weight)")
        param = self.c.params[w.node][1]
        if param.dim() != 2:
            self.refuse(node, f"aten.{_op_name(node)}: its weight is not a matrix")
        use = self.use_param(w, "t" if w.transposed else "as_is")
        hint = self.hint(node)
        y = self.ir.op("MATMUL", [x.ir, use], hint)
        cols = self.c.values[node].shape[-1]
        if bias is not None:
            y = self.ir.op("BIAS_ADD", [y, self.bias_use(bias, node, cols)], hint + ".add_bias")
        return Rows(y, cols)

    def bias_use(self, b, node, cols):
        if not isinstance(b, Param) or b.transposed or list(self.c.params[b.node][1].shape) != [cols]:
            self.refuse(node, f"aten.{_op_name(node)}: the bias is not a parameter of {cols} values")
        return self.use_param(b, "as_is")

    def op_mm(self, node):
        x = self.rows_of(node.args[0], node, "left operand")
        return self.linear(node, x, self.value(node.args[1], node), None)

    def op_addmm(self, node):
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            self.refuse(node, "aten.addmm with beta or alpha other than 1")
        x = self.rows_of(node.args[1], node, "left operand")
        return self.linear(node, x, self.value(node.args[2], node), self.value(node.args[0], node))

    def op_native_layer_norm(self, node):
        x = self.rows_of(node.args[0], node, "input")
        shape, weight, bias, eps = node.args[1], node.args[2], node.args[3], node.args[4]
        if list(shape) != [x.cols]:
            self.refuse(node, f"layer norm over {list(shape)}: the IR normalises over the last dimension alone")
        if abs(eps - 1e-5) > 1e-12:
            self.refuse(node, f"layer norm with eps {eps}: the IR's LAYER_NORM uses 1e-5")
        if weight is None:
            self.refuse(node, "layer norm without a weight (elementwise_affine=False): the IR's LAYER_NORM has one")
        ins = [x.ir, self.bias_use(self.value(weight, node), node, x.cols)]
        if bias is not None:
            ins.append(self.bias_use(self.value(bias, node), node, x.cols))
        y = self.ir.op("LAYER_NORM", ins, self.hint(node))
        return Packed({0: Rows(y, x.cols)})

    def unary(self, node, kind):
        x = self.rows_of(node.args[0], node, "input")
        return Rows(self.ir.op(kind, [x.ir], self.hint(node)), x.cols)

    def op_gelu(self, node):
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        return self.unary(node, "GELU" if approximate == "tanh" else "GELU_EXACT")

    def op_relu(self, node):
        return self.unary(node, "RELU")

    def op_silu(self, node):
        return self.unary(node, "SILU")

    def dropout_mask(self, node, name):
        """Dropout's mask as PyTorch 1.13 draws it (empty_like, bernoulli_
        of 1 - p, div_ by 1 - p), or None."""
        args = node.args
        if name == "empty_like" and self.depends_on_data(node):
            return Fresh()
        first = self.values.get(args[0]) if args and isinstance(args[0], torch.fx.Node) else None
        if name == "bernoulli_" and isinstance(first, Fresh) and len(args) > 1 and isinstance(args[1], float):
            if not 0 < args[1] <= 1:
                self.refuse(node, f"aten.bernoulli_ of {args[1]}: dropout keeps with a chance in (0, 1]")
            return Mask(args[1])
        if name in ("div_", "div") and isinstance(first, Mask) and not first.scaled and len(args) > 1 and \
                isinstance(args[1], (int, float)) and abs(args[1] - first.keep) < 1e-12:
            return Mask(first.keep, True)
        return None

    def dropout(self, x, probability, node):
        if probability == 0:
            return x
        return Rows(self.ir.op("DROPOUT", [x.ir], self.hint(node), probability=probability), x.cols)

    def op_native_dropout(self, node):
        x = self.rows_of(node.args[0], node, "input")
        p, train = node.args[1], node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
        return Packed({0: self.dropout(x, float(f"{p:.9g}") if train else 0.0, node)})

    def op_mul(self, node):
        a, b = (self.value(x, node) for x in node.args[:2])
        if isinstance(b, Mask):
            a, b = b, a
        if isinstance(a, Mask) and isinstance(b, Rows):
            if self.shape(node.args[0]) != self.shape(node.args[1]):
                self.refuse(node, "aten.mul of an activation by dropout's mask of another shape")
            return self.dropout(b, a.probability, node)
        if isinstance(a, Rows) and isinstance(b, Rows) and self.shape(node.args[0]) == self.shape(node.args[1]):
            return Rows(self.ir.op("MUL", [a.ir, b.ir], self.hint(node)), a.cols)
        return Opaque(node)

    def op_add(self, node):
        if node.kwargs.get("alpha", 1) != 1:
            self.refuse(node, "aten.add with alpha other than 1")
        a, b = (self.value(x, node) for x in node.args[:2])
        if isinstance(b, Rows) and not isinstance(a, Rows):
            a, b = b, a
        if not isinstance(a, Rows):
            self.refuse(node, "aten.add of two values none of which is a tensor of rows")
        out = self.shape(node)
        if not self.is_rows_shape(out, a.cols):
            self.refuse(node, f"aten.add gives {out}: not a tensor of {self.rows} rows")
        if isinstance(b, Rows):
            if b.cols != a.cols or self.shape(node.args[0]) != self.shape(node.args[1]):
                self.refuse(node, "aten.add of tensors of different shapes: the IR's ADD adds equal shapes")
            return Rows(self.ir.op("ADD", [a.ir, b.ir], self.hint(node)), a.cols)
        if isinstance(b, Table):
            return Rows(self.ir.op("POSITION_EMBEDDING", [a.ir, self.table_use(b, node)], self.hint(node)), a.cols)
        if isinstance(b, Param) and not b.transposed:
            shape = list(self.c.params[b.node][1].shape)
            if shape == [a.cols]:
                return Rows(self.ir.op("BIAS_ADD", [a.ir, self.use_param(b, "as_is")], self.hint(node)), a.cols)
            if self.tokens and shape == [self.context, a.cols]:
                table = Table(b.node, tuple(range(self.context)))
                return Rows(self.ir.op("POSITION_EMBEDDING", [a.ir, self.table_use(table, node)], self.hint(node)),
                            a.cols)
        self.refuse(node, "aten.add of a tensor of rows and something other than a tensor of rows, a bias [C] "
                          "or a position table [T, C]")

    def table_use(self, table, node):
        key = (table.node, table.index)
        if key not in self.ir.tables:
            name, value = self.c.params[table.node]
            if table.index == tuple(range(len(table.index))) and value.shape[0] == len(table.index):
                ir_name = self.ir.unique(name)
            else:
                ir_name = self.ir.unique(name + ".positions")
                self.ir.notes.append(f"{ir_name}: rows {_ranges(table.index)} of {name} {list(value.shape)}, "
                                     f"the positions a sequence of {self.context} reads (no other row is trained)")
            self.ir.sources[ir_name] = (table.node, table.index)
            self.ir.tensor(ir_name, [len(table.index), value.shape[1]], "PARAM",
                           values=value.detach()[list(table.index)])
            self.ir.tables[key] = ir_name
            self.ir.param_uses.setdefault(table.node, set()).add("table")
        return self.ir.tables[key]

    def op__log_softmax(self, node):
        x = self.rows_of(node.args[0], node, "input")
        if node.args[1] not in (-1, len(self.shape(node)) - 1):
            self.refuse(node, "log_softmax over a dimension other than the last")
        return LogProbs(x)

    def op_nll_loss_forward(self, node):
        lp, target, weight, reduction, ignore_index = node.args[:5]
        p = self.value(lp, node)
        t = self.value(target, node)
        if not isinstance(p, LogProbs) or not isinstance(t, Labels):
            self.refuse(node, "a negative log-likelihood loss maps when it reads log_softmax(logits) and the targets")
        if weight is not None or reduction != 1:
            self.refuse(node, "cross-entropy with class weights or a reduction other than the mean")
        vocab = p.rows.cols
        if 0 <= ignore_index < vocab:
            self.refuse(node, f"cross-entropy with ignore_index={ignore_index}, a class the labels hold: the "
                              "executor's loss counts every label")
        loss = self.ir.op("SOFTMAX_CROSS_ENTROPY", [p.rows.ir, t.ir], "loss")
        return Packed({0: Loss(loss)})

    op_nll_loss = op_nll_loss_forward

    # ------------------------------------------------------------ attention
    def region(self, end):
        """The opaque nodes `end` (a tensor of rows) is computed from, back to
        the activations and parameters they read: mapped as one op if they
        compute one the IR has (checked on random values). Returns Rows, an
        Opaque saying why the region is not the op it looks like, or None."""
        region, sources, params, blocked, masks = [], [], [], [], []
        seen = set()
        stack = [(a, False) for a in reversed(end.all_input_nodes)]
        while stack:  # post-order, iteratively (a region may be long)
            n, done = stack.pop()
            if done:
                region.append(n)
                continue
            if n in seen:
                continue
            seen.add(n)
            v = self.values.get(n)
            if isinstance(v, Rows):
                sources.append(n)
            elif isinstance(v, Const):
                pass
            elif isinstance(v, Mask):
                masks.append(n)
            elif isinstance(v, Param) and not v.transposed and n in self.c.params:
                params.append(n)
            elif v is not None and not isinstance(v, Opaque):
                blocked.append(n)
            elif len(seen) > _REGION_LIMIT:
                return None
            else:
                stack.append((n, True))
                stack.extend((a, False) for a in reversed(n.all_input_nodes))
        if blocked or not sources:
            return None
        first = self.first_opaque(region)
        region.append(end)
        names = {_op_name(n) for n in region}
        if any(("softmax" in n and "log_softmax" not in n) or "scaled_dot_product" in n for n in names):
            return None if params else self.attention(region, sources, end, first, masks)
        if masks or "native_dropout" in names:
            return None
        if len(sources) != 1 or self.shape(sources[0]) != self.shape(end):
            return None
        if not params:
            return self.elementwise(region, sources[0], end)
        if len(params) == 1 and list(self.c.params[params[0]][1].shape) == [self.values[sources[0]].cols]:
            return self.rms_norm(region, sources[0], params[0], end)
        return None

    def run_region(self, region, inputs, patches=None):
        """Evaluates `region` with `inputs` (node -> tensor) in place of the
        values it was traced with, and `patches` (node -> function of its
        args and kwargs) in place of what some nodes run; None if it does not
        run."""
        env = dict(inputs)
        patches = patches or {}
        for n in region:
            if n in env:
                continue
            args = torch.fx.node.map_arg(n.args, lambda a: env[a] if a in env else self.c.values[a])
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a] if a in env else self.c.values[a])
            try:
                env[n] = patches[n](args, kwargs) if n in patches else n.target(*args, **kwargs)
            except Exception:  # noqa: BLE001 - a hypothesis that does not run is not the op
                return None
        return env

    @staticmethod
    def agrees(got, want, tolerance):
        return isinstance(got, torch.Tensor) and got.numel() == want.numel() and \
            float((got.reshape(want.shape) - want).abs().max()) <= tolerance * max(1.0, float(want.abs().max()))

    def elementwise(self, region, source, end):
        """An element-wise function the IR has (gelu_new written out, x *
        sigmoid(x), ...)."""
        x = torch.randn(self.shape(source), generator=torch.Generator().manual_seed(99)) * 3
        env = self.run_region(region, {source: x})
        if env is None:
            return None
        for kind, fn in _UNARY:
            if self.agrees(env.get(end), fn(x), 1e-5):
                v = self.values[source]
                return Rows(self.ir.op(kind, [v.ir], self.hint(end)), v.cols)
        return None

    def rms_norm(self, region, source, param, end):
        """RMS norm, x / sqrt(mean(x^2) + eps) * w, written out (Llama's
        LlamaRMSNorm): eps is one of the region's own constants."""
        gen = torch.Generator().manual_seed(98)
        x = torch.randn(self.shape(source), generator=gen) * 2
        w = torch.randn(self.c.params[param][1].shape, generator=gen)
        env = self.run_region(region, {source: x, param: w})
        if env is None:
            return None
        for eps in _constants(region) + [1e-5, 1e-6]:
            want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
            if 0 < eps < 1 and self.agrees(env.get(end), want, 1e-5):
                v = self.values[source]
                y = self.ir.op("RMS_NORM", [v.ir, self.use_param(Param(param), "as_is")], self.hint(end),
                               epsilon=eps)
                return Rows(y, v.cols)
        return None

    def attention_dropout(self, region, masks, first):
        """The dropout inside an attention region: PyTorch 1.13's mask
        (a Mask leaf), 2.x's native_dropout, or SDPA's dropout_p. Returns
        (probability, how to run the region without it, how with a mask M
        of its own in its place, or None where SDPA draws it inside), (0,
        ...) where there is none, or an Opaque where it cannot map."""
        sites = [(self.values[n].probability, n, "mask", -1) for n in masks]
        for n in region:
            name = _op_name(n)
            if name == "native_dropout":
                train = n.args[2] if len(n.args) > 2 else n.kwargs.get("train", True)
                if train and n.args[1] > 0:
                    sites.append((float(f"{n.args[1]:.9g}"), n, "native", -1))
            elif "scaled_dot_product" in name:
                index, p = sdpa_dropout(n)
                if p > 0:
                    sites.append((float(f"{p:.9g}"), n, "sdpa", index))
        if not sites:
            return 0.0, lambda: ({}, {}), None
        if len(sites) > 1:
            return Opaque(first, f"attention with dropout in {len(sites)} places: the IR's CAUSAL_ATTENTION "
                                 "drops its probabilities once")
        p, n, kind, index = sites[0]
        if kind == "mask":
            return p, lambda: ({n: torch.ones(self.shape(n))}, {}), (lambda m: ({n: m}, {}), self.shape(n))
        if kind == "native":  # (output, mask) of its input's shape
            def native(m):
                return {}, {n: lambda a, k: (a[0] * m, m != 0)}
            shape = self.shape(n.args[0])
            return p, lambda: native(torch.ones(shape)), (native, shape)

        def without(a, k):  # SDPA draws its mask inside: run without it
            a, k = list(a), dict(k)
            if index >= 0:
                a[index] = 0.0
            else:
                k["dropout_p"] = 0.0
            return n.target(*a, **k)
        return p, lambda: ({}, {n: without}), None

    def attention(self, region, sources, end, first, masks=()):
        """Causal self-attention, if the region computes what
        CAUSAL_ATTENTION does from q, k and v among its sources: with key and
        value heads shared by groups of query heads, and with rotary
        positions on the queries and keys, where it does; and with dropout
        of its probabilities (checked with a mask of ours in its place)."""
        dropout = self.attention_dropout(region, masks, first)
        if isinstance(dropout, Opaque):
            return dropout
        probability, plain, masked = dropout
        width = self.shape(end)[-1]
        widths = [self.values[s].cols for s in sources]
        if len(sources) == 1:
            orders = [(sources[0],)]
            kv_width = (widths[0] - width) // 2
        elif len(sources) == 3:
            orders = [o for o in itertools.permutations(sources)
                      if self.values[o[0]].cols == width and self.values[o[1]].cols == self.values[o[2]].cols]
            kv_width = min(widths)
        else:
            orders = []
        if not orders or kv_width <= 0 or (len(sources) == 1 and 2 * kv_width + width != widths[0]):
            return Opaque(first, f"attention at aten.{_op_name(first)} reads {len(sources)} activations of "
                                 f"{widths} columns: the IR's CAUSAL_ATTENTION takes queries of {width} columns "
                                 "and keys and values of one width, side by side or as three activations")
        hypotheses = []
        for heads in self.head_candidates(region, width):
            dh = width // heads
            if kv_width % dh or heads % (kv_width // dh):
                continue
            kv = kv_width // dh
            hypotheses.append((heads, kv, None))
            if dh % 2 == 0:
                hypotheses += [(heads, kv, theta) for theta in self.theta_candidates(dh)]
        for order in orders:
            for heads, kv, theta in hypotheses:
                if self.computes_attention(region, end, order, heads, kv, theta, plain()):
                    if masked is not None and not self.drops_probabilities(region, end, order, heads, kv, theta,
                                                                           *masked):
                        return Opaque(first, f"the dropout in the attention at aten.{_op_name(first)} does not "
                                             "drop its probabilities (softmax(q k^T / sqrt(d)) before they weigh "
                                             "v), which is the dropout CAUSAL_ATTENTION has")
                    qkv = self.values[order[0]].ir
                    if len(order) == 3:
                        qkv = self.ir.op("CONCAT", [self.values[s].ir for s in order], self.hint(end, "qkv"))
                    fields = {"heads": heads}
                    if kv != heads:
                        fields["kv_heads"] = kv
                    fields["context"] = self.context
                    if theta is not None:
                        qkv = self.ir.op("ROTARY", [qkv], self.hint(end, "rotary"), **fields, theta=theta)
                    if probability > 0:
                        fields["probability"] = probability
                    y = self.ir.op("CAUSAL_ATTENTION", [qkv], self.hint(end, "attention"), **fields)
                    return Rows(y, width)
        tried = sorted({h for h, _, _ in hypotheses})
        return Opaque(first, f"the attention at aten.{_op_name(first)} is not causal softmax attention "
                             f"softmax(q k^T / sqrt(d)) v (over {tried} heads, with or without rotary positions) "
                             "of its q, k and v: run on random values, it gives something else")

    def theta_candidates(self, dh):
        """Rotary bases to try: those of the module's inv_freq-like buffers
        (1, theta^(-2/dh), ...), then Llama's usual ones."""
        found = []
        for _, b in self.c.buffers.values():
            v = b.detach().reshape(-1).double()
            if b.dim() == 1 and v.numel() == dh // 2 and v.numel() > 1 and abs(float(v[0]) - 1) < 1e-6 and \
                    0 < float(v[1]) < 1:
                theta = float(v[1]) ** (-dh / 2)
                found.append(float(round(theta)) if abs(theta - round(theta)) < 1e-3 * theta else theta)
        return list(dict.fromkeys(found + [10000.0, 500000.0, 1000000.0]))

    def first_opaque(self, region):
        for n in region:
            if _op_name(n) not in _LAYOUT:
                return n
        return region[0] if region else None

    def head_candidates(self, region, width):
        heads = set()
        b = self.micro_batch
        for n in region:
            s = self.shape(n)
            if s is None:
                continue
            if len(s) == 4 and s[0] == b:
                for h, d in ((s[1], s[3]), (s[2], s[3])):
                    if h * d == width and h > 0:
                        heads.add(h)
            if len(s) == 3 and s[0] % b == 0 and s[0] // b > 1 and (s[0] // b) * s[-1] == width:
                heads.add(s[0] // b)
        return sorted(heads) or [1]

    def computes_attention(self, region, end, order, heads, kv_heads, theta, replaced, dropped=None):
        """Whether the region, its dropout `replaced` ((inputs, patches) for
        run_region), computes CAUSAL_ATTENTION of `order`, its probabilities
        times `dropped` [B, heads, T, T] where given."""
        gen = torch.Generator().manual_seed(1234)
        src = {s: torch.randn(self.shape(s), generator=gen) for s in set(order)}
        inputs, patches = replaced
        env = self.run_region(region, {**src, **inputs}, patches)
        if env is None:
            return False
        qkv = torch.cat([src[s].reshape(self.rows, -1) for s in order], dim=1)
        if theta is not None:
            qkv = rotary(qkv, heads, kv_heads, self.context, theta)
        want = causal_attention(qkv, heads, self.context, kv_heads, dropped)
        return self.agrees(env.get(end), want, 1e-4)

    def drops_probabilities(self, region, end, order, heads, kv_heads, theta, replace, shape):
        """Whether the region's dropout mask multiplies the probabilities: a
        mask of ours in its place must give the attention of the
        probabilities times it."""
        if shape != [self.rows // self.context, heads, self.context, self.context]:
            return False
        gen = torch.Generator().manual_seed(4321)
        m = (torch.rand(shape, generator=gen) >= 0.3).float() / 0.7
        return self.computes_attention(region, end, order, heads, kv_heads, theta, replace(m), m)

    # ------------------------------------------------------------ the end
    def finish(self):
        ir = self.ir
        if self.loss is None:
            logits, node = self.logits
            label = ir.tensor(ir.unique("next" if self.tokens else "y"), [self.rows], "LABEL", dtype="I32")
            self.loss = Loss(ir.op("SOFTMAX_CROSS_ENTROPY", [logits.ir, label], "loss"))
        # Parameters: one tensor each, in the layout its uses read.
        resolved = {}
        for node, layouts in ir.param_uses.items():
            name, value = self.c.params[node]
            plain = layouts - {"table"}
            if "table" in layouts and plain:
                raise UnsupportedError(f"{name} is used as a position table and otherwise: the IR cannot share "
                                       "a table's rows with another op")
            if not plain:
                continue
            transposed = plain == {"t"}
            values = value.detach().t() if transposed else value.detach()
            ir_name = ir.tensor(ir.unique(name), list(values.shape), "PARAM", values=values)
            resolved[node] = (ir_name, transposed)
            ir.sources[ir_name] = (node, "t" if transposed else "as_is")
            if len(self.c.aliases.get(name, [])) > 1:
                ir.notes.append(f"{ir_name}: one parameter for {', '.join(self.c.aliases[name])} (tied): "
                                "one tensor, its gradients summed over every use, one optimizer state")
        for op in ir.ops:
            ins = []
            for i in op["inputs"]:
                if isinstance(i, tuple) and i[0] == "param":
                    _, node, layout = i
                    tensor, stored_transposed = resolved[node]
                    if layout == "t" and not stored_transposed:
                        assert op["kind"] == "MATMUL"
                        op["kind"] = "MATMUL_NT"
                    ins.append(tensor)
                else:
                    ins.append(i)
            op["inputs"] = ins
        self.prune()
        return ir

    def prune(self):
        """Drops ops the loss does not read (logits of a second head, etc.)."""
        producer = {op["output"]: op for op in self.ir.ops}
        needed, stack = set(), [self.loss.ir]
        while stack:
            t = stack.pop()
            if t in needed:
                continue
            needed.add(t)
            op = producer.get(t)
            if op is not None:
                stack.extend(op["inputs"])
        self.ir.ops = [op for op in self.ir.ops if op["output"] in needed]
        self.ir.tensors = [t for t in self.ir.tensors if t["name"] in needed or t["role"] in ("INPUT", "LABEL")]


def _ranges(index):
    if index == tuple(range(index[0], index[0] + len(index))):
        return f"{index[0]}..{index[-1]}"
    return ", ".join(str(i) for i in index)


def _flatten(tree):
    if isinstance(tree, (list, tuple)):
        for x in tree:
            yield from _flatten(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from _flatten(x)
    else:
        yield tree


def causal_attention(qkv, heads, context, kv_heads=None, dropped=None):
    """The IR's CAUSAL_ATTENTION: qkv [R, (heads + 2 kv_heads) d] -> [R, heads
    d]; its probabilities times `dropped` [B, heads, T, T] where given (a
    dropout's mask)."""
    kv = kv_heads or heads
    rows = qkv.shape[0]
    d = qkv.shape[1] // (heads + 2 * kv)
    b = rows // context
    q = qkv[:, :heads * d].reshape(b, context, heads, d).transpose(1, 2)
    k = qkv[:, heads * d:(heads + kv) * d].reshape(b, context, kv, d).transpose(1, 2)
    v = qkv[:, (heads + kv) * d:].reshape(b, context, kv, d).transpose(1, 2)
    k = k.repeat_interleave(heads // kv, dim=1)
    v = v.repeat_interleave(heads // kv, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    mask = torch.ones(context, context, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    y = (probs if dropped is None else probs * dropped) @ v
    return y.transpose(1, 2).reshape(rows, heads * d)


def sdpa_dropout(node):
    """(the place of dropout_p among the args, its value) of a
    scaled_dot_product op (any of PyTorch's), by its schema; (-1, 0)
    where it has none."""
    schema = getattr(node.target, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else []):
        if arg.name == "dropout_p":
            if i < len(node.args):
                return i, float(node.args[i])
            return -1, float(node.kwargs.get("dropout_p", 0.0))
    return -1, 0.0


def rotary(qkv, heads, kv_heads, context, theta):
    """The IR's ROTARY: the query and key heads of qkv turned, pairs (c, c +
    d/2) by position * theta^(-2c/d) (Hugging Face's rotate_half)."""
    rows, cols = qkv.shape
    kv = kv_heads or heads
    d = cols // (heads + 2 * kv)
    half, turned = d // 2, (heads + kv) * d
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    angles = (torch.arange(rows) % context).float()[:, None] * inv[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x = qkv[:, :turned].reshape(rows, heads + kv, d)
    a, b = x[..., :half], x[..., half:]
    y = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    return torch.cat([y.reshape(rows, turned), qkv[:, turned:]], dim=1)


def _constants(region):
    """The float constants the region's ops take (an epsilon among them)."""
    found = []
    for n in region:
        for a in list(n.args) + list(n.kwargs.values()):
            if isinstance(a, float) and a not in found:
                found.append(a)
    return found

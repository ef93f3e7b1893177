"""Capture of a PyTorch module at the ATen level, for tiermem.fx.

The module runs once on the example inputs under
torch.fx.experimental.proxy_tensor.make_fx (PyTorch 1.13 and 2.x alike), its
parameters and buffers passed in as inputs (functional_call), so that Python
code on sizes, branches on configuration, buffers and parameter sharing trace
as they run. Every node of the graph is told which module made it and from
which line of the user's code (what refusals name). A parameter the module
holds under several names (a tied head) is one input, used by every op that
reads it under any of its names.
"""

import contextlib
import os
import sys

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

try:  # PyTorch >= 2.0
    from torch.func import functional_call as _functional_call
except ImportError:  # 1.13
    from torch.nn.utils.stateless import functional_call as _functional_call

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_HERE = os.path.dirname(os.path.abspath(__file__))


class Captured:
    """The ATen graph of one call of the module, with what its inputs are.

    graph_module: the torch.fx.GraphModule make_fx produced.
    params: placeholder node -> (name, tensor) for every parameter (one per
        tensor: tied names share one placeholder; `aliases` lists them).
    buffers: placeholder node -> (name, tensor).
    inputs: the placeholders of the example inputs, in order.
    values: node -> its value on the example inputs (tensors, tuples).
    output: the module's output (a tree of values).
    """

    def __init__(self):
        self.graph_module = None
        self.params, self.buffers, self.inputs = {}, {}, []
        self.aliases = {}
        self.leaves = set()  # modules with no submodules, by name
        self.values = {}
        self.output = None

    def where(self, node):
        """'model.py:64 in forward (transformer.h.0.attn): y = att @ v'."""
        meta = node.meta.get("tiermem_where")
        return meta or "(no source line recorded)"


def _user_frame():
    """The innermost frame of the user's code (not torch's, not ours)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_TORCH_DIR) and not path.startswith(_HERE) and "<" not in path:
            return frame
        frame = frame.f_back
    return None


def _describe(frame, module_path):
    if frame is None:
        return f"module {module_path or '(the root)'}"
    import linecache
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
    if module_path:
        where += f" ({module_path})"
    return where + (f": {line}" if line else "")


@contextlib.contextmanager
def _recording(root):
    """Tags every node made while the block runs with the module being run
    and the user's line that made it."""
    names = {}
    for name, m in root.named_modules():
        names.setdefault(id(m), name)
    stack = []

    def pre(module, args):
        stack.append(names.get(id(module), type(module).__name__))

    def post(module, args, result):
        if stack:
            stack.pop()

    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
             torch.nn.modules.module.register_module_forward_hook(post)]
    original = torch.fx.Graph.create_node

    def create_node(self, op, target, args=None, kwargs=None, name=None, type_expr=None):
        node = original(self, op, target, args, kwargs, name, type_expr)
        if op in ("call_function", "call_method", "call_module"):
            node.meta["tiermem_where"] = _describe(_user_frame(), stack[-1] if stack else "")
            node.meta["tiermem_module"] = stack[-1] if stack else ""
        return node

    torch.fx.Graph.create_node = create_node
    try:
        yield
    finally:
        torch.fx.Graph.create_node = original
        for h in hooks:
            h.remove()


def all_parameters(module):
    """(name, tensor) under every name (named_parameters drops the second
    name of a tied tensor; PyTorch 1.13 has no remove_duplicate=False)."""
    for prefix, m in module.named_modules(remove_duplicate=False):
        for name, p in m._parameters.items():
            if p is not None:
                yield (f"{prefix}.{name}" if prefix else name), p


def capture(module, inputs):
    """Runs `module(*inputs)` under make_fx; returns a Captured."""
    named = {}
    aliases = {}
    for name, p in all_parameters(module):
        key = id(p)
        if key not in named:
            named[key] = (name, p)
        aliases.setdefault(key, []).append(name)
    # Detached aliases (the same memory) are what the trace sees: make_fx
    # tags the tensors it is given (PyTorch 1.13 in their __dict__), and the
    # user's parameters must come out of an export as they went in (a
    # tagged one no longer deep-copies).
    params = {name: p.detach() for name, p in named.values()}
    buffers = {name: b.detach() for name, b in module.named_buffers()}

    def call(params, buffers, *args):
        # Every name of a tied tensor gets the one placeholder.
        everything = dict(buffers)
        for key, (name, _) in named.items():
            for alias in aliases[key]:
                everything[alias] = params[name]
        return _functional_call(module, everything, tuple(args))

    # Distinct tensors, so that each input is its own placeholder (make_fx
    # tells inputs apart by the tensor: (ids, ids) would be one).
    inputs = tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)
    with _recording(module), torch.no_grad():
        gm = make_fx(call)(params, buffers, *inputs)
    c = Captured()
    c.graph_module = gm
    c.leaves = {name for name, m in module.named_modules() if name and not any(True for _ in m.children())}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    expected = len(params) + len(buffers) + len(inputs)
    if len(placeholders) != expected:
        raise RuntimeError(f"make_fx gave {len(placeholders)} inputs for {len(params)} parameters, "
                           f"{len(buffers)} buffers and {len(inputs)} inputs")
    it = iter(placeholders)
    for key, (name, p) in named.items():
        node = next(it)
        c.params[node] = (name, p)
        c.aliases[name] = aliases[key]
    for name, b in buffers.items():
        c.buffers[next(it)] = (name, b)
    c.inputs = list(it)
    # Every node's value on the example inputs (the attention check and the
    # constants read them).
    values = c.values

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            values[n] = result
            return result

    with torch.no_grad():
        c.output = Recorder(gm).run(*params.values(), *buffers.values(), *inputs)
    return c

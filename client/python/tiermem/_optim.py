"""The optimizer of an export: graph.proto's OptimizerDef from a dict of its
fields or from the torch.optim optimizer the user built (SGD, Adam, AdamW,
with parameter groups that differ in weight decay only), and the learning
rate schedule (nanoGPT's get_lr: linear warm-up, cosine decay to a floor).
What the IR cannot express is refused, naming it: nothing is changed
silently."""

import torch

from tiermem._capture import all_parameters
from tiermem._lower import UnsupportedError

_TYPES = {"SGD": torch.optim.SGD, "ADAM": torch.optim.Adam, "ADAMW": torch.optim.AdamW}
_SCHEDULE = ("warmup_steps", "decay_steps", "min_learning_rate")


def _defaults(kind):
    """PyTorch's defaults for what is not given."""
    opt = {"type": kind, "learning_rate": 1e-3}
    if kind in ("ADAM", "ADAMW"):
        opt.update(beta1=0.9, beta2=0.999, epsilon=1e-8)
    if kind == "ADAMW":
        opt["weight_decay"] = 1e-2
    return opt


def _schedule(given):
    given = dict(given or {})
    unknown = set(given) - set(_SCHEDULE)
    if unknown:
        raise ValueError(f"schedule fields {sorted(unknown)}: the IR's are {list(_SCHEDULE)}")
    out = {k: int(given[k]) for k in ("warmup_steps", "decay_steps") if k in given}
    if "min_learning_rate" in given:
        out["min_learning_rate"] = float(given["min_learning_rate"])
    return out


def _from_dict(given):
    given = dict(given)
    kind = str(given.get("type", "ADAM")).upper()
    if kind not in _TYPES:
        raise ValueError(f"optimizer type {kind!r}: ADAM, ADAMW or SGD")
    opt = _defaults(kind)
    known = set(opt) | {"weight_decay", "momentum", "max_grad_norm"} | set(_SCHEDULE)
    unknown = set(given) - known
    if unknown:
        raise ValueError(f"optimizer fields {sorted(unknown)}: the IR's are {sorted(known)}")
    opt.update(given)
    opt["type"] = kind
    return opt


def _same(groups, key, what):
    values = {repr(_plain(g[key])) for g in groups}
    if len(values) > 1:
        raise UnsupportedError(f"the optimizer's parameter groups differ in {what} ({', '.join(sorted(values))}): "
                               "the IR has one (groups may differ in weight decay only)")
    return _plain(groups[0][key])


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _from_torch(optimizer, names_of):
    """(fields, ids of the parameters without weight decay) of a torch.optim
    optimizer. `names_of`: id(parameter) -> its names in the module."""
    kind = next((k for k, t in _TYPES.items() if type(optimizer) is t), None)
    if kind is None:
        raise UnsupportedError(f"optimizer {type(optimizer).__name__}: tiermem-exec runs torch.optim's SGD, Adam "
                               "and AdamW")
    if any(optimizer.state.get(p) for g in optimizer.param_groups for p in g["params"]):
        raise UnsupportedError("the optimizer has taken steps: its state (moments, momentum) would not carry into "
                               "the IR; export before the first step")
    groups = optimizer.param_groups
    for flag, why in (("amsgrad", "AMSGrad"), ("maximize", "maximize"), ("nesterov", "Nesterov momentum")):
        if any(g.get(flag) for g in groups):
            raise UnsupportedError(f"{why} is not in the IR's {kind}")
    if any(g.get("dampening", 0) for g in groups):
        raise UnsupportedError("SGD with dampening is not in the IR's SGD (momentum without dampening)")
    if any("initial_lr" in g for g in groups):
        raise UnsupportedError("a learning-rate scheduler is attached to the optimizer: it does not carry into "
                               "the IR; give export(schedule={warmup_steps, decay_steps, min_learning_rate}) "
                               "(nanoGPT's get_lr) instead")
    opt = {"type": kind, "learning_rate": float(_same(groups, "lr", "learning rate"))}
    if kind == "SGD":
        opt["momentum"] = float(_same(groups, "momentum", "momentum"))
    else:
        beta1, beta2 = _same(groups, "betas", "betas")
        opt.update(beta1=float(beta1), beta2=float(beta2), epsilon=float(_same(groups, "eps", "eps")))
    decays = {float(g["weight_decay"]) for g in groups} - {0.0}
    if len(decays) > 1:
        raise UnsupportedError(f"the optimizer's parameter groups have weight decays {sorted(decays)}: the IR has "
                               "one, and a group without")
    opt["weight_decay"] = decays.pop() if decays else 0.0
    without = set()
    seen = set()
    for g in groups:
        for p in g["params"]:
            if id(p) not in names_of:
                raise UnsupportedError(f"the optimizer holds a tensor {list(p.shape)} that is not a parameter of "
                                       "the module")
            seen.add(id(p))
            if opt["weight_decay"] and not g["weight_decay"]:
                without.add(id(p))
    missing = [names[0] for key, names in names_of.items() if key not in seen]
    if missing:
        raise UnsupportedError(f"{', '.join(missing)} not in the optimizer: tiermem-exec trains every parameter "
                               "(a frozen one is not in the IR)")
    return opt, without


def optimizer_fields(optimizer, schedule, module, grad_clip=None):
    """(OptimizerDef's fields, ids of the module's parameters in the group
    without weight decay) for `export`'s optimizer=, schedule= and
    grad_clip=."""
    if optimizer is None or isinstance(optimizer, dict):
        opt, without = _from_dict(optimizer or {"type": "ADAM"}), set()
    elif isinstance(optimizer, torch.optim.Optimizer):
        names_of = {}
        for name, p in all_parameters(module):
            names_of.setdefault(id(p), []).append(name)
        opt, without = _from_torch(optimizer, names_of)
    else:
        raise ValueError(f"optimizer: a torch.optim optimizer or a dict of the IR's fields, not "
                         f"{type(optimizer).__name__}")
    given = _schedule({k: opt.pop(k) for k in _SCHEDULE if k in opt})
    if schedule:
        if given:
            raise ValueError("the schedule is given twice: in optimizer= and in schedule=")
        given = _schedule(schedule)
    opt.update(given)
    if grad_clip is not None:
        if "max_grad_norm" in opt:
            raise ValueError("the clipping is given twice: max_grad_norm in optimizer= and grad_clip=")
        opt["max_grad_norm"] = float(grad_clip)
    if not opt.get("max_grad_norm", 0.0) >= 0:
        raise ValueError(f"grad_clip {opt['max_grad_norm']}: the largest global gradient norm (> 0), or 0: none")
    warmup, decay = opt.get("warmup_steps", 0), opt.get("decay_steps", 0)
    if warmup < 0 or decay < 0 or (decay and decay <= warmup):
        raise ValueError(f"schedule: warmup_steps {warmup} and decay_steps {decay} (past the warm-up, or 0: none)")
    if opt.get("min_learning_rate", 0) and not decay:
        raise ValueError("schedule: min_learning_rate is where decay_steps ends; give decay_steps")
    return opt, without


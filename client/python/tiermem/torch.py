"""PyTorch helpers: a model's and an optimizer's state in tiermem, with atomic steps.

    store = tiermem.torch.StateStore(client, "fashion.rank0")
    step = store.resume(model, optimizer)       # None: nothing committed yet
    for step in range(step or 0, steps):
        train_one_step(...)
        store.commit_training(step + 1, model, optimizer)

A StateStore is one named allocation holding a commit word and two slots.
Commit n writes the whole state (every tensor of any nested dict/list of
tensors, and the rest pickled) into slot n % 2, then bumps the commit word
from n to n + 1 with one compare-and-swap: that is the commit. A process
killed at any instruction leaves the word at n and slot (n - 1) % 2 whole, so
a restarted process loads exactly the last committed step. The tensors load()
returns are views of the tier's memory where the allocation can be mapped
here (zero-copy); they stay valid until the second commit after the load.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, Optional

import torch

from . import _tiermem

_MAGIC = 0x31455254534D4954  # "TIMSTRE1"
_SLOT_MAGIC = 0x31544F4C534D4954  # "TIMSLOT1"
_STORE_HEADER = 64  # commit word at 0, store magic at 8, slot size at 16
_SLOT_HEADER = 32  # slot magic, step, pickled skeleton's length, data offset
_ALIGN = 64


def _align(n: int, to: int = _ALIGN) -> int:
    return (n + to - 1) // to * to


class _TensorRef:
    """Where a tensor of the state lies in a slot (pickled in its place)."""

    __slots__ = ("offset", "dtype", "shape", "nbytes")

    def __init__(self, offset: int, dtype: torch.dtype, shape: tuple, nbytes: int):
        self.offset, self.dtype, self.shape, self.nbytes = offset, dtype, shape, nbytes

    def __getstate__(self):
        return (self.offset, str(self.dtype).removeprefix("torch."), self.shape, self.nbytes)

    def __setstate__(self, state):
        self.offset, dtype, self.shape, self.nbytes = state
        self.dtype = getattr(torch, dtype)


def _flatten(value: Any, tensors: list) -> Any:
    """The state with every tensor replaced by a _TensorRef (offsets filled later)."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        tensors.append(t)
        return _TensorRef(0, t.dtype, tuple(t.shape), t.numel() * t.element_size())
    if isinstance(value, dict):
        return type(value)((k, _flatten(v, tensors)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_flatten(v, tensors) for v in value)
    return value


def _unflatten(value: Any, tensor_of) -> Any:
    if isinstance(value, _TensorRef):
        return tensor_of(value)
    if isinstance(value, dict):
        return type(value)((k, _unflatten(v, tensor_of)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_unflatten(v, tensor_of) for v in value)
    return value


def _refs(value: Any, out: list) -> list:
    if isinstance(value, _TensorRef):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _refs(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _refs(v, out)
    return out


class StateStore:
    """Training state in one named tiermem allocation, committed atomically.

    client: a tiermem.Client. name: the allocation's name (one store per name
    and node). The allocation is made by the first commit, sized for that
    state (`headroom` extra bytes per slot for the pickled part to grow);
    tier, node and replicas are passed to Client.alloc (replicas=N keeps
    copies on N other nodes, so the state outlives its node).
    """

    def __init__(self, client: _tiermem.Client, name: str, tier: str = "auto", node: Optional[int] = None,
                 replicas: int = 0, headroom: int = 64 << 10):
        self.client, self.name = client, name
        self._tier, self._node, self._replicas, self._headroom = tier, node, replicas, headroom
        self._alloc: Optional[_tiermem.Allocation] = None
        self._slot_size = 0
        self._seen = 0  # the commit word as this store last read or set it
        self._mapping: Optional[_tiermem.Mapping] = None
        self._mapped: Optional[torch.Tensor] = None
        self.extra: Any = None  # `extra` of the commit resume() loaded
        self._find()

    # --- the allocation -----------------------------------------------------------
    def _find(self) -> None:
        try:
            a = self.client.lookup(self.name, self._node or 0)
        except _tiermem.RequestError as e:
            if e.code != "not_found":
                raise
            return
        magic, slot_size = struct.unpack("<QQ", self.client.read(a.gva + 8, 16))
        if magic != _MAGIC:
            raise ValueError(f"allocation '{self.name}' ({a.gva}) is not a tiermem.torch.StateStore "
                             f"(magic {magic:#x})")
        self._alloc, self._slot_size = a, slot_size
        self._seen = self.commits()

    def _create(self, need: int) -> None:
        slot_size = _align(need + self._headroom, 4096)
        a = self.client.alloc(_STORE_HEADER + 2 * slot_size, tier=self._tier, node=self._node, name=self.name,
                              replicas=self._replicas)
        # The magic and slot size before the allocation is ever looked up by
        # a restarted process: the word stays 0 (nothing committed) until then.
        self.client.write(a.gva + 8, struct.pack("<QQ", _MAGIC, slot_size))
        self._alloc, self._slot_size = a, slot_size
        self._seen = 0

    @property
    def gva(self) -> Optional[_tiermem.Gva]:
        return self._alloc.gva if self._alloc else None

    def commits(self) -> int:
        """How many commits the store holds (0: none)."""
        if self._alloc is None:
            return 0
        return struct.unpack("<Q", self.client.read(self._alloc.gva, 8))[0]

    def _slot(self, k: int) -> _tiermem.Gva:
        return self._alloc.gva + (_STORE_HEADER + k * self._slot_size)

    # --- commit ---------------------------------------------------------------------
    def commit(self, step: int, state: Any) -> int:
        """Writes `state` (nested dicts/lists/tuples of tensors and picklable values) as step `step`.

        Returns the number of commits. Raises ValueError when the state no
        longer fits the store's slots, RuntimeError when another writer
        committed since this store opened or last committed (one writer per
        store: a second one is caught at its next commit, before it writes,
        but for the moment between that check and the swap).
        """
        tensors: list = []
        skeleton = _flatten(state, tensors)
        refs = _refs(skeleton, [])
        offset = 0
        for r in refs:
            offset = _align(offset)
            r.offset = offset
            offset += r.nbytes
        data_bytes = offset
        meta = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
        data_at = _align(_SLOT_HEADER + len(meta))
        need = data_at + data_bytes
        if self._alloc is None:
            self._create(need)
        if need > self._slot_size:
            raise ValueError(f"state of step {step} needs {need} bytes, more than the {self._slot_size} of a slot "
                             f"of store '{self.name}' (made for a smaller state): use another name")
        # One writer per store: a word that moved since this store last saw
        # it means another process commits here too (a replacement of this
        # one, say); writing on would overwrite its last commit's slot.
        n = self.commits()
        if n != self._seen:
            raise RuntimeError(f"store '{self.name}': another writer committed since this one "
                               f"(commit word {n}, this store last saw {self._seen})")
        slot = self._slot(n % 2)
        self.client.write(slot, struct.pack("<QQQQ", _SLOT_MAGIC, step, len(meta), data_at) + meta)
        for t, r in zip(tensors, refs):
            if r.nbytes:
                self.client.write(slot + (data_at + r.offset), t)
        before = self.client.compare_swap(self._alloc.gva, n, n + 1)
        if before != n:
            raise RuntimeError(f"store '{self.name}': another writer committed (commit word {before}, expected {n})")
        self._seen = n + 1
        return n + 1

    def commit_training(self, step: int, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                        extra: Any = None) -> int:
        """commit() of a model's state_dict, an optimizer's and anything `extra` (e.g. an RNG state)."""
        state = {"model": model.state_dict(), "extra": extra}
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        return self.commit(step, state)

    # --- load -------------------------------------------------------------------------
    def _view_base(self) -> Optional[torch.Tensor]:
        if self._mapped is None:
            try:
                self._mapping = self.client.map(self._alloc.gva)
            except _tiermem.RequestError as e:  # not_supported: another node's memory, VRAM without CUDA here
                if e.code != "not_supported":
                    raise
                return None
            self._mapped = torch.from_dlpack(self._mapping)
        return self._mapped

    def _slot_header(self, k: int) -> tuple[int, int, int, int]:
        return struct.unpack("<QQQQ", self.client.read(self._slot(k), _SLOT_HEADER))

    def steps(self) -> list[int]:
        """The steps that load() can return, the last committed first (at most two)."""
        n = self.commits()
        return [self._slot_header((n - 1 - i) % 2)[1] for i in range(min(n, 2))]

    def load(self, step: Optional[int] = None, copy: bool = False) -> Optional[tuple[int, Any]]:
        """(step, state) of the last commit (or of commit `step`, one of steps()), None when none.

        The tensors view the tier's memory where it can be mapped here (unless
        `copy`); else they are read into new tensors.
        """
        n = self.commits()
        if n == 0:
            return None
        candidates = [(n - 1 - i) % 2 for i in range(min(n, 2))]
        if step is not None:
            candidates = [k for k in candidates if self._slot_header(k)[1] == step]
            if not candidates:
                raise ValueError(f"store '{self.name}' holds steps {self.steps()}, not {step}")
        k = candidates[0]
        slot = self._slot(k)
        magic, found, meta_len, data_at = self._slot_header(k)
        if magic != _SLOT_MAGIC or data_at > self._slot_size or meta_len > self._slot_size:
            raise ValueError(f"store '{self.name}': slot {k} of commit {n} is damaged (magic {magic:#x})")
        skeleton = pickle.loads(self.client.read(slot + _SLOT_HEADER, meta_len))
        base = None if copy else self._view_base()
        slot_offset = _STORE_HEADER + k * self._slot_size + data_at

        def tensor_of(r: _TensorRef) -> torch.Tensor:
            if base is not None:
                start = slot_offset + r.offset
                return base[start:start + r.nbytes].view(r.dtype).view(r.shape)
            t = torch.empty(r.shape, dtype=r.dtype)
            if r.nbytes:
                self.client.read_into(slot + (data_at + r.offset), t)
            return t

        return found, _unflatten(skeleton, tensor_of)

    def resume(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
               step: Optional[int] = None) -> Optional[int]:
        """Loads the last commit_training() (or that of `step`) into `model` and `optimizer`.

        Returns its step, or None when nothing is committed.
        """
        loaded = self.load(step)
        if loaded is None:
            return None
        step, state = loaded
        model.load_state_dict(state["model"])
        if optimizer is not None and "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
        self.extra = state.get("extra")
        del state
        return step

    def close(self) -> None:
        """Unmaps the store (refused while tensors load() returned are alive)."""
        self._mapped = None
        if self._mapping is not None:
            self._mapping.close()
            self._mapping = None

    def free(self) -> None:
        """Frees the store's allocation (after close())."""
        self.close()
        if self._alloc is not None:
            self._alloc.free()
            self._alloc = None

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

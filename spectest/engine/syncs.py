"""Counting the places where the host waits for the device, on any device (the CPU included).

Owns: :class:`HostSyncCounter`, a context manager that counts every operation which, on a GPU,
makes the host wait for the device: a tensor read back into Python (``.tolist()``,
``.item()``, ``int()`` / ``float()`` / ``bool()`` of a tensor, a tensor used as a list index,
``.numpy()``, ``np.asarray``, ``.cpu()``) and the operators whose output size depends on the
data (``nonzero``, boolean-mask indexing and assignment, ``masked_select``, ``unique``,
``repeat_interleave`` without an output size). ``torch.cuda.set_sync_debug_mode`` does this on a
GPU only; this works wherever the tests run, because the engine keeps its bookkeeping in
Python and NumPy (``engine.device``): every tensor is device data, so reading one is a sync.

It records where each one happened (the innermost ``spectest`` frame), so a test that fails
says which line added a wait.

Does not know: the engine. Built on torch's function and dispatch modes (thread-local: count on
the thread that runs the engine). For tests and diagnosis, not for serving: every torch call
goes through it while it is active.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Tensor methods that hand a tensor's values to Python
_READS = frozenset({"tolist", "item", "numpy", "__array__", "__bool__", "__int__", "__float__",
                    "__index__", "__format__", "__repr__", "cpu"})
# operators whose output shape depends on the values (the device must finish first)
_DATA_DEPENDENT = frozenset({"nonzero", "nonzero_static_unsized", "masked_select", "unique",
                             "_unique", "_unique2", "unique_consecutive", "unique_dim",
                             "equal", "is_nonzero", "item", "_local_scalar_dense"})


@dataclass
class Sync:
    what: str  # the operation
    where: str  # file:line of the innermost spectest frame


@dataclass
class HostSyncCounter:
    """``with HostSyncCounter() as syncs: …`` then ``syncs.count`` / ``syncs.events``."""

    events: list[Sync] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.events)

    def describe(self) -> str:
        return "; ".join(f"{e.what} at {e.where}" for e in self.events) or "none"

    def _record(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-2]
                  if "/spectest/" in f.filename and "/syncs.py" not in f.filename]
        where = f"{frames[-1].filename.rsplit('/spectest/', 1)[-1]}:{frames[-1].lineno}" \
            if frames else "outside spectest"
        self.events.append(Sync(what, where))

    def __enter__(self) -> HostSyncCounter:
        self._inside = 0  # a counted read runs operators of its own: count it once
        self._modes = (_Reads(self), _Operators(self))
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class _Reads(TorchFunctionMode):
    def __init__(self, counter: HostSyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        counted = name in _READS or (name == "to" and _to_host(args, kwargs))
        if counted and not self.counter._inside:
            self.counter._record(f"Tensor.{name}")
        if counted:
            self.counter._inside += 1
        try:
            return func(*args, **kwargs)
        finally:
            if counted:
                self.counter._inside -= 1


class _Operators(TorchDispatchMode):
    def __init__(self, counter: HostSyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if not self.counter._inside and (
                name in _DATA_DEPENDENT
                or (name in ("index", "index_put", "index_put_", "_index_put_impl_")
                    and _bool_index(args))
                or (name == "repeat_interleave" and kwargs.get("output_size") is None
                    and isinstance(args[0], torch.Tensor) and len(args) < 3)):
            self.counter._record(f"aten.{name}")
        return func(*args, **kwargs)


def _to_host(args, kwargs) -> bool:
    """Is this ``Tensor.to(...)`` a copy to the host?"""
    for value in list(args[1:]) + list(kwargs.values()):
        if isinstance(value, torch.device) and value.type == "cpu":
            return True
        if isinstance(value, str) and value.startswith("cpu"):
            return True
    return False


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in (indices or ()))

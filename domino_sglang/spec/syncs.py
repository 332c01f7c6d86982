"""Counting host-device synchronisations and transfers in a block of torch code (the decode
round's host-sync budget; tests/server/test_sync_budget.py).

A CPU has no device to wait for, so the counter counts the operations that WOULD synchronise or
copy between host and device on a GPU, by what they are, whatever the device:

    item      .item(), bool(t) / int(t) / float(t) / t.__index__ (a scalar read to the host)
    tolist    .tolist(), .numpy()
    d2h       .cpu() of a device tensor
    h2d       torch.tensor / torch.as_tensor from host data with a device argument; .to(<device>)
              / .cuda() of a host tensor
    nonzero   nonzero / argwhere / masked_select / unique, and indexing or index_put with a
              boolean mask (output shape depends on the data: a synchronisation)

Host tensors are told from device tensors by provenance, as they would be on a GPU: a tensor
is on the host when a factory made it without a `device` argument (torch.tensor(data),
torch.zeros(n), ...), when `.cpu()` made it, when the caller declared it (`host(t)`: SGLang's
`seq_lens_cpu`), or when an op made it from host tensors only; everything else (weights, the
batch's tensors, anything made with device=...) counts as on the device. Reads and data-shaped
ops of host tensors are free and not counted; `.to(device)` of a host tensor is an h2d copy,
`.to(device)` of a device tensor nothing.

Each event is attributed to the first Python frame outside torch and this module: `cpu_backend`
(domino_sglang/cpu/: the CPU attention backend, replaced by SGLang's on a GPU), `domino` (the
rest of domino_sglang), `sglang` (SGLang's own code), or `other`. Torch only.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_HERE = os.path.abspath(__file__)
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))

_SCALAR = {torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
           torch.Tensor.__float__, torch.Tensor.__index__}
_LIST = {torch.Tensor.tolist, torch.Tensor.numpy}
_CREATE = {torch.tensor, torch.as_tensor}
_FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full, torch.empty,
              torch.arange, torch.randint, torch.rand, torch.randn, torch.linspace}
_DATA_SHAPED = {"nonzero", "argwhere", "masked_select", "_unique2", "unique_dim",
                "unique_consecutive", "_unique"}


def _origin() -> str:
    """Who made the call: the first frame outside torch and this module."""
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path != _HERE and not path.startswith(_TORCH):
            if f"{os.sep}domino_sglang{os.sep}cpu{os.sep}" in path:
                return "cpu_backend"
            if f"{os.sep}domino_sglang{os.sep}" in path:
                return "domino"
            if f"{os.sep}sglang{os.sep}" in path:
                return "sglang"
            return "other"
        frame = frame.f_back
    return "other"


def _flat(items) -> list:
    """Tensors in nested lists / tuples (an op's arguments or outputs)."""
    out = []
    for x in items:
        if isinstance(x, (list, tuple)):
            out.extend(_flat(x))
        else:
            out.append(x)
    return out


def _moves_device(args, kwargs) -> bool:
    """Whether a Tensor.to call names a device (not only a dtype)."""
    if "device" in kwargs:
        return True
    return any(isinstance(a, (torch.device, str)) or (isinstance(a, int) and not
                                                      isinstance(a, bool)) for a in args[1:])


class SyncCounter:
    """`with SyncCounter() as c:` ... then `c.counts` (Counter of (origin, kind)), `c.total(o)`,
    `c.sites` (Counter of (origin, kind, file:line) for the first frame outside torch)."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.sites: Counter = Counter()
        # tensors known to live on the host: id -> weak reference (tensors compare by value)
        self._host: dict[int, weakref.ref] = {}
        counter = self

        def on_host(t) -> bool:
            ref = counter._host.get(id(t)) if isinstance(t, torch.Tensor) else None
            return ref is not None and ref() is t

        class _Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                kind, result_host = None, None
                first = args[0] if args else None
                if func in _SCALAR or func in _LIST:
                    if not on_host(first):
                        kind = "item" if func in _SCALAR else "tolist"
                elif func is torch.Tensor.cpu:
                    kind, result_host = (None if on_host(first) else "d2h"), True
                elif func is torch.Tensor.cuda or (func is torch.Tensor.to
                                                   and _moves_device(args, kwargs)):
                    kind, result_host = ("h2d" if on_host(first) else None), False
                elif func in _FACTORIES:
                    from_tensor = isinstance(first, torch.Tensor)
                    if kwargs.get("device") is None:
                        result_host = not from_tensor or on_host(first)
                    else:
                        result_host = False
                        if func in _CREATE and (not from_tensor or on_host(first)):
                            kind = "h2d"
                if result_host is None and func not in _SCALAR and func not in _LIST:
                    # any other function of host tensors only makes host tensors (composite
                    # ops such as pad_sequence allocate inside, out of the dispatch's sight)
                    tensors = [t for t in _flat(list(args)) + _flat(list(kwargs.values()))
                               if isinstance(t, torch.Tensor)]
                    sized = [t for t in tensors if t.dim() > 0] or tensors
                    if sized and all(on_host(t) for t in sized):
                        result_host = True
                if kind is not None:
                    counter._count(kind)
                out = func(*args, **kwargs)
                if result_host is not None:
                    for t in _flat([out]):
                        if not isinstance(t, torch.Tensor):
                            continue
                        # on a CPU, .cpu() / .to(device) return the tensor itself: it keeps
                        # counting as a device tensor (conservative: its reads count)
                        if result_host and t is not first:
                            counter._add(t)
                        elif not result_host:
                            counter._host.pop(id(t), None)
                return out

        class _Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                tensors = [t for t in _flat(args) + _flat(list(kwargs.values()))
                           if isinstance(t, torch.Tensor)]
                # 0-d tensors do not decide: a Python scalar argument (torch.where(m, x, 0))
                # arrives as a fresh 0-d tensor of unknown provenance
                sized = [t for t in tensors if t.dim() > 0] or tensors
                host = bool(sized) and all(on_host(t) for t in sized)
                name = func.overloadpacket.__name__
                if not host:
                    if name in _DATA_SHAPED:
                        counter._count("nonzero")
                    elif name in ("index", "index_put", "index_put_", "_index_put_impl_"):
                        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
                        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                               for i in indices or ()):
                            counter._count("nonzero")
                out = func(*args, **kwargs)
                if host:
                    for t in _flat([out]):
                        if isinstance(t, torch.Tensor):
                            counter._add(t)
                return out

        self._modes = (_Functions(), _Dispatch())

    def _add(self, t: torch.Tensor) -> None:
        key = id(t)
        self._host[key] = weakref.ref(t, lambda _, k=key, d=self._host: d.pop(k, None))

    def host(self, *tensors: torch.Tensor | None) -> None:
        """Declare tensors that live on the host (e.g. SGLang's `seq_lens_cpu`)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t)

    def _count(self, kind: str) -> None:
        origin = _origin()
        self.counts[(origin, kind)] += 1
        frame = sys._getframe(2)
        while frame is not None:
            path = os.path.abspath(frame.f_code.co_filename)
            if path != _HERE and not path.startswith(_TORCH):
                site = f"{os.path.basename(path)}:{frame.f_lineno}"
                self.sites[(origin, kind, site)] += 1
                break
            frame = frame.f_back

    def total(self, origin: str = "domino") -> int:
        """Events attributed to `origin` (domino / sglang / other)."""
        return sum(n for (o, _), n in self.counts.items() if o == origin)

    def by_kind(self, origin: str = "domino") -> dict[str, int]:
        return {k: n for (o, k), n in sorted(self.counts.items()) if o == origin}

    def __enter__(self) -> SyncCounter:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

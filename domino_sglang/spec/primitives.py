"""The round's device-chosen primitives, picked once at start-up by the runtime that serves it.

The device-neutral round (rollout.py, sampling.py, verify.py, the worker's accept) calls these;
it never imports a device runtime. By default they are plain torch; the CPU runtime installs its
own exact, faster versions at start-up (worker.py: cpu/argmax.py's blocked argmax, cpu/linear.py's
packed lm_head for the base logits), through `install`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_argmax: Callable[[torch.Tensor], torch.Tensor] | None = None


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) for x [..., V] (int64 [...]), by the installed kernel."""
    return x.argmax(dim=-1) if _argmax is None else _argmax(x)


def install(*, argmax: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
    """Use `argmax` (exactly torch.argmax's result, first maximal index) from now on; None:
    torch's own."""
    global _argmax
    _argmax = argmax

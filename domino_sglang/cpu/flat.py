"""Tensors addressed as the flat, row-major buffers a Triton kernel's pointer arithmetic sees:
the helpers the `sgl_kernel` stand-in ops (kernels.py, tree_kernels.py) share."""

from __future__ import annotations

import torch

I64 = torch.int64


def flat_in(t: torch.Tensor) -> torch.Tensor:
    """Read-only flat view (a copy only if `t` is not contiguous)."""
    return t.reshape(-1)


def flat_out(t: torch.Tensor, name: str) -> torch.Tensor:
    """Flat view of a tensor that is written in place; it must be contiguous."""
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (it is written in place)")
    return t.view(-1)

"""A tensor-parallel rank's share of the drafter's layers: which rows and columns it keeps.

The decode round's side of tensor parallelism (who computes what, what keeps ranks in step)
is spec/tp.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Shard:
    """This rank's part of a sharded layer: `rank` of `size`, `all_reduce` summing a partial
    output over the ranks (in place or not; its result is used)."""

    rank: int
    size: int
    all_reduce: Callable[[torch.Tensor], torch.Tensor]

    def rows(self, n: int) -> slice:
        """The slice of n output rows (or input columns) this rank holds; n % size == 0."""
        per = n // self.size
        return slice(self.rank * per, (self.rank + 1) * per)


def shard_linear_out(linear: nn.Linear, shard: Shard, units: int) -> None:
    """Keep this rank's output rows of `linear` (in place): `units` equal groups (heads, or
    single rows) split evenly over the ranks."""
    per_unit = linear.out_features // units
    keep = shard.rows(units)
    rows = slice(keep.start * per_unit, keep.stop * per_unit)
    linear.weight = nn.Parameter(linear.weight.data[rows].contiguous(), requires_grad=False)
    linear.out_features = rows.stop - rows.start


def shard_linear_in(linear: nn.Linear, shard: Shard, units: int) -> None:
    """Keep this rank's input columns of `linear` (in place), split as shard_linear_out."""
    per_unit = linear.in_features // units
    keep = shard.rows(units)
    cols = slice(keep.start * per_unit, keep.stop * per_unit)
    linear.weight = nn.Parameter(linear.weight.data[:, cols].contiguous(), requires_grad=False)
    linear.in_features = cols.stop - cols.start

"""The draft context of plain rounds: written late, in one batched projection.

A decode round writes the K/V of its target features into the draft KV cache (the context the
next block is drafted against). A plain round (L = 1) drafts nothing, so nothing reads that
cache until the next speculative round: its write can wait. Deferred, the writes of many plain
rounds become one `context_kv` over all their rows, instead of one small projection per round
(launch-bound linears, whose cost hardly grows with their rows; the context write's share of a
round: docs/benchmarks.md).

The rows are written before anything could read or overwrite their slots:
  - a speculative round (its draft pass attends to the context);
  - a prefill (a new request may be handed a freed slot, or read a radix-cached prefix);
  - a change in the batch's requests (a finished request's slots may go to another request);
  - `limit` deferred rounds (bounded memory).
Inside an unchanged batch every row has its own slot (one per request and position), so the
order of the rows in one write does not matter, and later writes to a slot are later rounds'.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

Write = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]  # (hidden, positions, slots)


class DeferredContext:
    """Plain rounds' context rows, held until something could read or reuse their slots."""

    def __init__(self, write: Write, limit: int = 64):
        if limit < 1:
            raise ValueError(f"limit: must be >= 1, got {limit}")
        self.write = write
        self.limit = limit
        self.batch_key: Hashable = None  # the requests the held rows belong to
        self.rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def before_round(self, batch_key: Hashable, speculative: bool) -> None:
        """Called at a decode round's start, before its draft pass."""
        if speculative or batch_key != self.batch_key:
            self.flush()
        self.batch_key = batch_key

    def defer(self, hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """Hold a plain round's rows: features [bs, K*H], positions [bs], slots [bs]. The
        features are copied: a replayed graph's output buffer is overwritten by the next round."""
        self.rows.append((hidden.clone(), positions, slots))
        if len(self.rows) >= self.limit:
            self.flush()

    def flush(self) -> None:
        """Write every held row, in one projection."""
        if not self.rows:
            return
        hidden, positions, slots = (torch.cat(parts) for parts in zip(*self.rows))
        self.rows = []
        self.write(hidden, positions, slots)

    def clear(self) -> None:
        """Drop the held rows (the KV pool was emptied)."""
        self.rows = []
        self.batch_key = None

    def __len__(self) -> int:
        return len(self.rows)

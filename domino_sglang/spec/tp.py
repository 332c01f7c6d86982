"""What a DOMINO worker's tensor-parallel ranks compute, and what makes their rounds identical.

At `--tp-size N` SGLang runs one scheduler and one worker per rank, each fed the same batches.
Every rank runs every round, and every collective below is entered by every rank at the same
point of the same round, with the same shapes:
  - the target: SGLang's own, sharded; its all-reduces make the hidden states whole on every
    rank (the draft context features are read after them) and its logits processor gathers
    the vocabulary-parallel logits the verifier reads;
  - the drafter's backbone: sharded as the target's layers are (model/shard.py `Shard`: q/k/v
    and gate/up
    split by output rows, o/down by input columns, one all-reduce after each), so each rank
    writes num_kv_heads / N heads into the draft KV pool, which SGLang sizes that way; memory
    per rank: the backbone's / N. The context projection, norms, GRU head, low-rank
    correction and copy gate are small and replicated;
  - the base logits: over the full vocabulary, each rank's rows of the target's
    vocabulary-parallel lm_head; with the head over a candidate pool (the default) a rank
    gathers only what the rollout reads (`pooled_logits`: position 0, each rank's top-K
    candidates, each position's best), else the whole logits (`gathered_logits`); over a
    draft vocabulary, its Vd rows gathered once at start-up (`vocab_rows`) and replicated
    (Vd x H per rank), so a round gathers nothing;
  - the embeddings the block and the head read: the target's vocabulary-parallel embedding
    (one all-reduce per call).
Why every rank takes the same decisions: each input to a decision is whole on every rank
(all-reduced or gathered tensors, the requests' tokens and seeds, the scheduler's batch, torch's
generator seeded alike on every rank and drawn in the same order, as SGLang's own sampling at
TP > 1 assumes), except one: the round's wall time, from which the adaptive policy learns its
costs (costs.py) and so chooses L. `RankAgreement.seconds` hands every rank rank 0's time
(one broadcast of one float over the TP group's CPU group per timed round), so the policies of all
ranks hold the same state and choose the same L; without it ranks would verify different
lengths and deadlock in the target's collectives (tests/spec/test_tp.py plants such a difference).
The start-up's decisions take the group's view the same way (`RankAgreement.least`: the group's
least free device memory gates every capture; `every`: a capture counts where it succeeded on
every rank), so all ranks capture the same graphs and replay them at the same rounds. The
verdict is identical by construction (whole logits, seeded generators); as SGLang's DFLASH
worker does, rank 0's verdict is also broadcast where SGLANG_SPEC_TP_SYNC asks it (by
default), so a rank whose sampling drifted (a non-deterministic kernel) cannot commit other
tokens than its peers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def vocab_range(lm_head: nn.Module) -> tuple[int, int]:
    """[start, end): the token ids whose rows of a vocabulary-parallel lm_head (or embedding)
    this rank holds, at local rows 0 .. end - start."""
    idx = lm_head.shard_indices
    return int(idx.org_vocab_start_index), int(idx.org_vocab_end_index)


def vocab_rows(local: torch.Tensor, start: int, end: int, ids: torch.Tensor,
               all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The rows [len(ids), H] of token ids `ids` of a vocabulary-parallel weight whose rows
    [start, end) are `local` [>= end - start, H] on this rank: each rank fills its own, zeros
    elsewhere, summed over the ranks (exact: x + 0 = x)."""
    mine = (ids >= start) & (ids < end)
    rows = local.new_zeros(len(ids), local.shape[1])
    rows[mine] = local[ids[mine] - start]
    return all_reduce(rows)


def gathered_logits(local_linear: Callable[[torch.Tensor], torch.Tensor], vocab: int,
                    all_gather: Callable[[torch.Tensor], torch.Tensor]
                    ) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [.., H] -> logits [.., V]: this rank's logits over its (padded) vocabulary rows,
    gathered along the last dimension in rank order (SGLang's padded layout) and cut to the V
    real tokens, as SGLang's logits processor does for the target."""
    def linear(x: torch.Tensor) -> torch.Tensor:
        return all_gather(local_linear(x))[..., :vocab]
    return linear


def pooled_logits(local_linear: Callable[[torch.Tensor], torch.Tensor], real_rows: int,
                  vocab: int, pool: int, all_gather: Callable[[torch.Tensor], torch.Tensor]
                  ) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [bs, n, H] -> base logits [bs, n, V] holding what a rollout over a candidate pool of
    `pool` tokens reads (rollout.make_candidates), -inf elsewhere: position 0 whole (its draft
    is the argmax, or q, over the full vocabulary), each rank's `pool` best columns (by their
    max over positions 1..) at every position, and each rank's best column at each position.
    The pool made from them is the whole logits' (a token among the global top-K by that max
    is among its own rank's top-K), each position's argmax is the whole logits' (ties to the
    lowest id, as one rank's), so drafts and q equal one rank's. One all-gather per round of
    bs x (V/N + K (n + 1) + 2n) values a rank instead of bs x n x V/N. `real_rows`: this
    rank's rows that are real tokens (SGLang pads the vocabulary; the last rank's padding is
    never a candidate). A request's logit_bias is added after: its pool is chosen unbiased."""
    if vocab >= 1 << 24:
        raise ValueError(f"pooled_logits: token ids up to {vocab} do not fit float32 exactly")

    def linear(x: torch.Tensor) -> torch.Tensor:
        bs, n, _ = x.shape
        local = local_linear(x).float()  # [bs, n, W] this rank's padded rows
        width = local.shape[-1]
        local[..., real_rows:] = float("-inf")
        if n < 2:  # position 0 alone (a one-token draft): it is read whole
            return all_gather(local)[..., :vocab]
        k = min(pool, width)
        cols = torch.topk(local[:, 1:].amax(dim=1), k, dim=-1, sorted=False).indices  # [bs, k]
        vals = local.gather(2, cols[:, None, :].expand(-1, n, -1))  # [bs, n, k]
        best = local.max(dim=-1)  # [bs, n]: the first maximum
        # one message: ids travel as float32 (exact below 2^24), columns local to each rank
        parts = (local[:, 0], cols.float(), vals.flatten(1), best.values, best.indices.float())
        sizes = [p.shape[1] for p in parts]
        every = all_gather(torch.cat(parts, dim=1))  # [bs, N * sum(sizes)], rank order
        ranks = every.shape[1] // sum(sizes)
        row0, ids, pooled, best_val, best_col = every.view(bs, ranks, -1).split(sizes, dim=2)
        offset = (torch.arange(ranks, device=x.device) * width)[None, :, None]  # [1, N, 1]
        ids = (ids.long() + offset).reshape(bs, 1, ranks * k).expand(-1, n, -1)
        pooled = pooled.reshape(bs, ranks, n, k).transpose(1, 2).reshape(bs, n, ranks * k)
        best_col = (best_col.long() + offset).transpose(1, 2)  # [bs, n, N]
        base = local.new_full((bs, n, ranks * width), float("-inf"))
        base.scatter_(2, ids, pooled).scatter_(2, best_col, best_val.transpose(1, 2))
        base[:, 0] = row0.reshape(bs, ranks * width)
        return base[..., :vocab]
    return linear


def group_first(group=None) -> Callable[[float], float]:
    """Rank 0's value of a float each rank measured, on every rank of `group` (a CPU process
    group, gloo; None: the default one): one broadcast of one float64 on the host, no
    pickling."""
    def first(value: float) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64)
        torch.distributed.broadcast(t, group=group, group_src=0)
        return float(t.item())
    return first


def group_minimum(group=None) -> Callable[[int], int]:
    """The minimum over the ranks of `group` (a torch.distributed process group; None: the
    default one) of an int each rank measured: one all-reduce of one int64 on the host (the
    group should be a CPU one, gloo), as SGLang's get_available_gpu_memory(distributed=True)
    reduces free memory."""
    def minimum(value: int) -> int:
        t = torch.tensor([int(value)], dtype=torch.int64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=group)
        return int(t.item())
    return minimum


class RankAgreement:
    """One value on every rank for what a rank measures or draws itself (module docstring).
    `broadcast(float) -> float`: rank 0's value (group_first); `minimum(int) -> int`:
    the group's minimum; `verdict(values, sampled) -> values`: rank 0's verdict tensor on every
    rank (SGLang's SpecTpSync), None where SGLang's switch leaves verdicts to the ranks. All
    None at N = 1 (identity)."""

    def __init__(self, broadcast: Callable[[float], float] | None = None,
                 minimum: Callable[[int], int] | None = None,
                 verdict: Callable[[torch.Tensor, bool], torch.Tensor] | None = None):
        self.broadcast, self.minimum, self.verdict = broadcast, minimum, verdict

    def seconds(self, value: float) -> float:
        """A round's wall time as rank 0 measured it."""
        if self.broadcast is None:
            return value
        return float(self.broadcast(value))

    def least(self, value: int | None) -> int | None:
        """The group's least of a per-rank measurement (free device memory). None (no such
        measurement: not a CUDA device) is None on every rank, as every rank runs on the same
        kind of device."""
        if value is None or self.minimum is None:
            return value
        return self.minimum(int(value))

    def every(self, ok: bool) -> bool:
        """Whether `ok` holds on every rank (a capture that succeeded everywhere)."""
        return ok if self.minimum is None else bool(self.minimum(int(ok)))

    def same_verdict(self, tokens: torch.Tensor, accept_lens: torch.Tensor,
                     judged: torch.Tensor, sampled: bool
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [bs, L], accept_lens [bs], judged [bs] as rank 0 decided them (one broadcast
        of [bs, L + 2] int64); unchanged where verdicts are not broadcast."""
        if self.verdict is None:
            return tokens, accept_lens, judged
        width = tokens.shape[1]
        packed = torch.cat([tokens.long(), accept_lens.long()[:, None], judged.long()[:, None]],
                           dim=1)  # [bs, L + 2]
        packed = self.verdict(packed, sampled)
        return (packed[:, :width].to(tokens.dtype), packed[:, width].to(accept_lens.dtype),
                packed[:, width + 1].to(judged.dtype))

"""The proposers' one interface: what a decode round asks of a drafter, and what it gets back.

A round (worker.py `decode_round`) has a plan (planner.py: L, the rows that copy, whether the
drafter runs) and the chain [bs, B] = [x_t, MASK x (B-1)]. Each proposer fills chain[:, 1:L] of
the rows it drafts and says what the verifier needs of them: for sampled rounds the
distribution q each draft was drawn from (exactness needs the true q), for greedy rounds
nothing but the tokens (the backbone's own picks and the copied positions are kept for the
metrics). Two proposers serve a round, in order, each seeing the proposal so far:
  - the Domino drafter (drafter.py): backbone pass, head rollout, pointer copy;
  - prompt lookup (lookup.py): rows whose history repeats take the tokens that followed,
    proposed with a one-hot q, over the drafter's rows.
The verifier (verify.py) serves every proposer alike, as vLLM v1 keeps its proposers apart from
its rejection sampler. Depends on torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from domino_sglang.planner import RoundPlan
    from domino_sglang.sampling import RoundUniforms, SamplingRows


@dataclass(frozen=True)
class DraftSlots:
    """Where a round drafts: chain [bs, B] (x_t first; proposers fill 1..L-1 in place),
    positions [bs, B] and KV slots [bs, B] of its tokens; rows / u: the round's sampling rows
    and uniforms (None in a greedy round)."""

    chain: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    rows: SamplingRows | None = None
    u: RoundUniforms | None = None


@dataclass(frozen=True)
class Proposal:
    """A round's drafts beyond the chain itself (all None: nothing drafted).

    q          [bs, L-1, V] sampled rounds: what each draft was drawn from (copies one-hot)
    base_pick  [bs, L-1] greedy rounds: the backbone's own argmax picks (the head's metrics)
    copied     [bs, L-1] bool greedy rounds: the positions the pointer copy drafted (metrics)
    pointer    whether the drafter's copy path ran
    """

    q: torch.Tensor | None = None
    base_pick: torch.Tensor | None = None
    copied: torch.Tensor | None = None
    pointer: bool = False


class Proposer(Protocol):
    """Fills chain[:, 1:plan.length] of the rows it drafts, if the plan asks it to, and returns
    `proposal` with what its rows add; a proposer the plan does not ask returns it unchanged."""

    def propose(self, batch, plan: RoundPlan, at: DraftSlots, proposal: Proposal) -> Proposal:
        ...

"""The proposers' one interface: what a decode round asks of a proposer, and what it gets back.

A round (worker.py `decode_round`) has a plan (planner.py: L, the rows that take offered drafts,
whether the drafter runs) and the chain [bs, B] = [x_t, MASK x (B-1)]. Each proposer fills
chain[:, 1:L] of the rows it drafts and says what the verifier needs of them: for sampled rounds
the distribution q each draft was drawn from (exactness needs the true q), for greedy rounds
nothing but the tokens. What a proposer reports for the metrics is apart (`Proposal.reports`).

Two kinds serve a round, in order, each seeing the proposal so far:
  - the drafter (domino.py): a draft pass for every row, its length L chosen by the policy;
  - offering proposers (lookup.py, ...): before any model work the planner asks each for what
    it can draft cheaply on the host (`offer`: some rows' drafts, no model pass); the rows it
    found then take its drafts over the drafter's (`OfferingProposer.propose`), sampled ones
    with a one-hot q. A round whose every row has an offer runs no draft pass, sized by the
    policy from that proposer's own acceptance (policy.offer_len, priced by `name`).
A new offering proposer is one file (a class with `name`, `may_cover` and `offer`) and one line
in proposers/__init__.py's REGISTRY. The verifier (verify.py) serves every proposer alike, as
vLLM v1 keeps its proposers apart from its rejection sampler. A tree round (tree.py) verifies
the drafter's tree instead of its chain. Depends on torch, sampling.py and tree.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from domino_sglang.spec.sampling import SparseQ
from domino_sglang.spec.tree import DraftTree

if TYPE_CHECKING:
    from domino_sglang.spec.plan import Offer, RoundPlan
    from domino_sglang.spec.sampling import RoundUniforms, SamplingRows


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
    """A round's drafts beyond the chain itself (nothing drafted: q None, no reports).

    q          [bs, L-1, V] sampled rounds: what each draft was drawn from (offers one-hot),
               dense or kept as its support (sampling.SparseQ): all the verifier needs besides
               the chain
    reports    proposer name -> what it reports for the metrics (the drafter's DominoReport)
    tree       a tree round's draft trees (plan.tree_width > 0; tree.py): chain[:, :L] holds
               their tokens and positions[:, :L] their positions, node by node
    """

    q: torch.Tensor | SparseQ | None = None
    reports: dict[str, Any] = field(default_factory=dict)
    tree: DraftTree | None = None

    def with_report(self, name: str, report: Any) -> Proposal:
        return replace(self, reports={**self.reports, name: report})


class Proposer(Protocol):
    """Fills chain[:, 1:plan.length] of the rows it drafts, if the plan asks it to, and returns
    `proposal` with what its rows add; a proposer the plan does not ask returns it unchanged."""

    name: str

    def propose(self, batch, plan: RoundPlan, at: DraftSlots, proposal: Proposal) -> Proposal:
        ...


class OfferingProposer:
    """A proposer whose drafts are found on the host before the round, without a model pass.
    Subclasses set `name` and implement `may_cover` and `offer`; `propose` writes the offer."""

    name: str = ""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size  # V, the size of its one-hot q

    def keep_only(self, reqs) -> None:
        """Forget what it keeps for requests not in `reqs` (the round's batch; asked every
        round, offers or not). Nothing by default."""

    def may_cover(self, batch, capped: list[bool] | None) -> bool:
        """Whether every request not `capped` might get an offer this round, asked on the host
        before a plain round offers (so a plain round under load pays for no search whose
        drafts it could not use). May be optimistic; never falsely pessimistic where
        the round could use the offer."""
        raise NotImplementedError

    def offer(self, batch, bonus: torch.Tensor, capped: list[bool] | None) -> Offer | None:
        """The drafts this proposer can make for the batch's requests (bonus [bs] x_t on the
        device), capped requests taking none; None when no request has one."""
        raise NotImplementedError

    def propose(self, batch, plan: RoundPlan, at: DraftSlots, proposal: Proposal) -> Proposal:
        """The offered rows' drafts over the chain, [x_t, offer, MASK..]; in a sampled round
        their q one-hot on them (one_hot_proposal), the other rows keeping theirs. A tree
        round's offers are branches of the drafter's trees: nothing written here."""
        offer = plan.offers.get(self.name)
        if offer is None or plan.tree_width:
            return proposal
        chain = at.chain
        chain[:, 1:] = torch.where(offer.found[:, None], offer.drafts, chain[:, 1:])
        if not plan.sampled:
            return proposal
        q = one_hot_proposal(chain[:, 1:plan.length], offer.found, proposal.q, self.vocab_size)
        return replace(proposal, q=q)


def one_hot_proposal(drafts: torch.Tensor, rows: torch.Tensor, q: torch.Tensor | SparseQ | None,
                     vocab: int) -> torch.Tensor | SparseQ:
    """q [bs, n, V] with `rows` [bs] replaced by one-hot distributions on their drafts [bs, n]
    (q None: every row one-hot, kept as its support of one token: SparseQ). A draft fixed before
    verification, whatever chose it, is a proposal drawn from its one-hot q: verify_sampled
    keeps it with probability p(d) and recovers from p without d, exact as for any q."""
    if q is None:
        return SparseQ.one_hot(drafts, vocab)
    on = rows[:, None, None]  # no boolean indexing
    if isinstance(q, SparseQ):  # entry 0 the draft at probability 1, the others 0
        first = torch.arange(q.ids.shape[2], device=drafts.device) == 0  # [S]
        return SparseQ(torch.where(on & first, drafts[..., None], q.ids),
                       torch.where(on, first.to(q.probs.dtype).expand_as(q.probs), q.probs),
                       vocab)
    one_hot = torch.zeros(*drafts.shape, vocab, dtype=torch.float32, device=drafts.device)
    one_hot.scatter_(2, drafts[..., None], 1.0)
    return torch.where(on, one_hot.to(q.dtype), q)

"""The Domino drafter as a proposer (spec/proposers/domino.py) over a stand-in backbone: a sampled
round drafts from q, or, with sampled drafts off (SGLang's DFLASH at T > 0), greedily with a
one-hot q on its drafts; a greedy round is the greedy rollout."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from domino_sglang.spec.plan import RoundPlan
from domino_sglang.spec.proposers.domino import DominoProposer
from domino_sglang.spec.proposers.protocol import DraftSlots, Proposal
from domino_sglang.spec.rollout import greedy_rollout, sampled_rollout
from domino_sglang.spec.sampling import RoundUniforms, SparseQ
from tests.spec.test_rollout import B, H, V, make_head
from tests.spec.test_sampling import make_rows


def _proposer(z: torch.Tensor, sampled_drafts: bool) -> DominoProposer:
    options = SimpleNamespace(candidate_pool=0, head=True, short_draft=False,
                              draft_temperature_scale=1.0, sampled_drafts=sampled_drafts)
    return DominoProposer(lambda batch, chain, positions, slots: z, make_head(1), None,
                          options, B, metrics=None)


@pytest.mark.parametrize("sampled_drafts", [True, False])
def test_sampled_rounds_draft_from_q_or_greedily_with_a_one_hot_q(sampled_drafts):
    bs, length = 6, 4
    g = torch.Generator().manual_seed(2)
    z = torch.randn(bs, B, H, generator=g)
    bonus = torch.randint(0, V, (bs,), generator=g)
    rows = make_rows(bs, temperature=0.9, top_k=5)
    u = RoundUniforms.for_round(rows.seed, torch.full((bs,), 10), length)
    batch = SimpleNamespace(reqs=[None] * bs, sampling_info=SimpleNamespace(logit_bias=None))
    plan = RoundPlan(length=length, draft_pass=True, offers={}, capped_host=None, capped=None,
                     sampled=True, seeds=[None] * bs, asked=False)
    chain = torch.zeros(bs, B, dtype=torch.int64)
    chain[:, 0] = bonus
    at = DraftSlots(chain, torch.zeros(bs, B, dtype=torch.int64),
                    torch.zeros(bs, B, dtype=torch.int64), rows, u)
    head = make_head(1)
    got = _proposer(z, sampled_drafts).propose(batch, plan, at, Proposal())
    if sampled_drafts:
        drafts, q = sampled_rollout(z[:, :length], bonus, head, rows, u.draft)
        assert torch.equal(chain[:, 1:length], drafts) and torch.equal(got.q, q)
    else:
        drafts = greedy_rollout(z[:, :length], bonus, head)
        assert torch.equal(chain[:, 1:length], drafts)
        assert isinstance(got.q, SparseQ) and tuple(got.q.shape) == (bs, length - 1, V)
        one_hot = torch.zeros(bs, length - 1, V).scatter_(2, drafts[..., None], 1.0)
        assert torch.equal(got.q.dense(), one_hot)


@pytest.mark.parametrize("sampled", [False, True])
def test_a_tree_round_verifies_the_grown_tree_at_any_temperature(sampled):
    """plan.tree_width > 0: the chain's first L slots hold the tree's tokens (x_t first), the
    positions prefix + depth, and the greedy chain's first L // 2 drafts are one of its paths,
    sampled requests too (tree drafts are deterministic)."""
    bs, length, prefix = 5, 6, 20
    g = torch.Generator().manual_seed(3)
    z = torch.randn(bs, B, H, generator=g)
    bonus = torch.randint(0, V, (bs,), generator=g)
    rows = make_rows(bs, temperature=0.9, top_k=5) if sampled else None
    u = RoundUniforms.for_round(rows.seed, torch.full((bs,), prefix), length) if sampled else None
    batch = SimpleNamespace(reqs=[None] * bs, sampling_info=SimpleNamespace(logit_bias=None))
    plan = RoundPlan(length=length, draft_pass=True, offers={}, capped_host=None, capped=None,
                     sampled=sampled, seeds=[None] * bs, asked=False, tree_width=3)
    chain = torch.zeros(bs, B, dtype=torch.int64)
    chain[:, 0] = bonus
    positions = prefix + torch.arange(B).expand(bs, B).clone()
    at = DraftSlots(chain, positions, torch.zeros(bs, B, dtype=torch.int64), rows, u)
    got = _proposer(z, True).propose(batch, plan, at, Proposal())
    tree = got.tree
    assert plan.kind == "tree" and tree is not None and tree.size == length and got.q is None
    assert torch.equal(chain[:, :length], tree.tokens)
    assert torch.equal(positions[:, :length], prefix + tree.depths)
    drafts = greedy_rollout(z[:, :length], bonus, make_head(1))  # [bs, L-1]
    for b in range(bs):
        at_node = 0
        for k in range(length // 2):
            kids = [j for j in range(1, length) if int(tree.parents[b, j]) == at_node
                    and int(tree.tokens[b, j]) == int(drafts[b, k])]
            assert len(kids) == 1, (b, k)
            at_node = kids[0]

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


def test_an_offer_is_a_branch_of_the_tree_and_written_nowhere_else():
    """A tree round with an offer (planner step 7): the offered rows' drafts, to each draft's
    own end, are a path of their tree (branch 1); the rows without one have no node on branch
    1; the offering proposer leaves the chain to the drafter's tree."""
    from domino_sglang.spec.plan import Offer
    from tests.spec.toy_proposer import RepeatLast

    bs, length, prefix = 3, B, 10
    g = torch.Generator().manual_seed(5)
    z = torch.randn(bs, B, H, generator=g)
    chain = torch.zeros(bs, B, dtype=torch.int64)
    chain[:, 0] = torch.randint(0, V, (bs,), generator=g)
    drafts = torch.randint(0, V, (bs, B - 1), generator=g)
    offer = Offer([True, False, True], torch.tensor([True, False, True]), drafts, 4,
                  torch.tensor([4, 0, 2]))  # row 1's drafts are not its offer
    plan = RoundPlan(length=length, draft_pass=True, offers={"toy": offer}, capped_host=None,
                     capped=None, sampled=False, seeds=[None] * bs, asked=True, tree_width=3)
    positions = prefix + torch.arange(B).expand(bs, B).clone()
    at = DraftSlots(chain, positions, torch.zeros(bs, B, dtype=torch.int64))
    batch = SimpleNamespace(reqs=[None] * bs, sampling_info=SimpleNamespace(logit_bias=None))
    got = _proposer(z, True).propose(batch, plan, at, Proposal())
    toy = RepeatLast(B, "cpu", V)
    toy.name = "toy"
    before = chain.clone()
    assert toy.propose(batch, plan, at, got) is got and torch.equal(chain, before)
    tree = got.tree

    def path(b, node):
        tokens = []
        while node:
            tokens.append(int(tree.tokens[b, node]))
            node = int(tree.parents[b, node])
        return tokens[::-1]

    for b, n in enumerate([4, 0, 2]):  # drafts past a row's length are offered nowhere
        paths = [path(b, j) for j in range(1, length)]
        # two kept branches share the N - 1 nodes level by level, the chain first: the
        # offer keeps (N - 1) // 2 levels at least
        for k in range(1, min(n, (length - 1) // 2) + 1):
            assert paths.count(drafts[b, :k].tolist()) == 1, (b, k)
        for j in range(1, length):  # branch 1: a prefix of the offer (branch 0 where the
            if int(tree.branch[b, j]) == 1:  # chain drafted it too)
                assert n and paths[j - 1] == drafts[b, :len(paths[j - 1])].tolist()

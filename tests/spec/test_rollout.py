"""The batched head rollout against a plain one-request reference loop, on tiny dimensions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from domino_sglang.spec.rollout import HeadParams, greedy_rollout, gru_step

H, G, E, V, B = 8, 6, 5, 11, 6


def make_head(seed: int = 0) -> HeadParams:
    torch.manual_seed(seed)
    embed = nn.Embedding(V, H)
    gru = nn.GRU(H, G, bias=False, batch_first=True)
    proj = nn.Sequential(nn.Linear(H + G, E, bias=False), nn.SiLU(), nn.Linear(E, V, bias=False))
    for p in [*gru.parameters(), *proj.parameters()]:
        nn.init.normal_(p, std=1.5)  # strong head so it really changes choices
    return HeadParams(embed=embed, lm_head_weight=torch.randn(V, H), prefix_gru=gru,
                      embed_proj=proj)


def reference_rollout(z, bonus, head, use_head=True, vocab=None):
    """Straight from the method: one request at a time, nn.GRU over the whole prefix each step;
    a draft vocabulary is -inf logits outside it."""
    mask = torch.zeros(V)
    if vocab is not None:
        mask = torch.full((V,), float("-inf")).index_fill_(0, vocab, 0.0)
    out = []
    for b in range(z.shape[0]):
        base = z[b, :-1] @ head.lm_head_weight.T + mask  # [B-1, V]
        chain = [int(base[0].argmax())]
        for i in range(1, B - 1):
            logits = base[i].clone()
            if use_head:
                prefix = torch.tensor([int(bonus[b]), *chain])
                _, s = head.prefix_gru(head.embed(prefix)[None])  # s [1, 1, G]
                logits = logits + head.embed_proj(torch.cat([z[b, i], s[0, 0]]))
            chain.append(int(logits.argmax()))
        out.append(chain)
    return torch.tensor(out)


@pytest.mark.parametrize("use_head", [True, False])
@pytest.mark.parametrize("pool", [0, 5])  # 5: a pool of the whole draft vocabulary
@pytest.mark.parametrize("seed", [0, 1])
def test_draft_vocabulary_equals_masked_reference(pool, seed, use_head):
    """A draft vocabulary = the full vocabulary with -inf logits outside it."""
    head, vocab = make_head(seed), torch.tensor([9, 2, 5, 0, 7])
    z, bonus = torch.randn(5, B, H), torch.randint(0, V, (5,))
    with torch.no_grad():
        expected = reference_rollout(z, bonus, head, use_head=use_head, vocab=vocab)
        got, base_pick = greedy_rollout(z, bonus, head.with_vocab(vocab), candidate_pool=pool,
                                        use_head=use_head, return_base_pick=True)
    assert torch.equal(got, expected)
    assert torch.isin(got, vocab).all() and torch.isin(base_pick, vocab).all()


def test_gru_step_equals_nn_gru():
    head = make_head()
    x, h = torch.randn(3, H), torch.randn(3, G)
    _, ref = head.prefix_gru(x[:, None], h[None])
    torch.testing.assert_close(gru_step(head.prefix_gru, x, h), ref[0])


@pytest.mark.parametrize("pool", [0, V])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_greedy_equals_reference(pool, seed):
    head = make_head(seed)
    z, bonus = torch.randn(5, B, H), torch.randint(0, V, (5,))
    with torch.no_grad():
        expected = reference_rollout(z, bonus, head)
        got = greedy_rollout(z, bonus, head, candidate_pool=pool)
    assert got.shape == (5, B - 1)
    assert torch.equal(got, expected)


def test_head_changes_choices_and_can_be_switched_off():
    head = make_head(0)
    z, bonus = torch.randn(16, B, H), torch.randint(0, V, (16,))
    with torch.no_grad():
        with_head = greedy_rollout(z, bonus, head)
        backbone = greedy_rollout(z, bonus, head, use_head=False)
        assert torch.equal(backbone, reference_rollout(z, bonus, head, use_head=False))
    assert torch.equal(with_head[:, 0], backbone[:, 0])  # position 0 is pure base logits
    assert not torch.equal(with_head[:, 1:], backbone[:, 1:])


def test_small_pool_restricts_choices_to_candidates():
    head = make_head(1)
    z, bonus = torch.randn(4, B, H), torch.randint(0, V, (4,))
    with torch.no_grad():
        got = greedy_rollout(z, bonus, head, candidate_pool=3)
        base = (z[:, 1:-1] @ head.lm_head_weight.T).amax(dim=1)  # [bs, V]
        allowed = base.topk(3, dim=-1).indices
    for b in range(4):
        assert set(got[b, 1:].tolist()) <= set(allowed[b].tolist())

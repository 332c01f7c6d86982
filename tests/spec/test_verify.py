"""Greedy chain verification (domino_sglang/spec/verify.py) against a direct scan, the plain
round's one-token chain included."""

from __future__ import annotations

import pytest
import torch

from domino_sglang.spec.verify import verify_greedy


def scan(chain: list[int], choice: list[int]) -> int:
    """a + 1: the drafts d_1..d_a that equal the target's choices before them, plus the bonus."""
    a = 0
    while a + 1 < len(chain) and chain[a + 1] == choice[a]:
        a += 1
    return a + 1


@pytest.mark.parametrize("block", [1, 2, 3, 5, 16])
def test_greedy_verdict_is_the_longest_matching_prefix(block):
    g = torch.Generator().manual_seed(block)
    bs, vocab = 64, 3  # a small vocabulary: every accepted length occurs
    chain = torch.randint(0, vocab, (bs, block), generator=g)
    choice = torch.randint(0, vocab, (bs, block), generator=g)
    tokens, accept_lens = verify_greedy(chain, choice)
    assert torch.equal(tokens, choice)  # accepted drafts, then the bonus, are the choices
    assert accept_lens.dtype == torch.int64 and accept_lens.shape == (bs,)
    assert accept_lens.tolist() == [scan(c, y) for c, y in zip(chain.tolist(), choice.tolist())]
    if block > 2:
        assert len(set(accept_lens.tolist())) > 2

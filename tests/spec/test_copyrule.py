"""copyrule.suffix_matches, the match lengths both copying proposers share, equals its definition
computed directly, on random left-aligned batches with garbage after each row's end."""

from __future__ import annotations

import random

import torch

from domino_sglang.spec.suffix_match import suffix_matches


def _direct(h: list[int], e: int, max_match: int) -> int:
    n = 0
    while n < max_match and e - n >= 0 and h[e - n] == h[-1 - n]:
        n += 1
    return n


def test_suffix_matches_equal_the_definition():
    rng = random.Random(0)
    for _ in range(200):
        rows = [[rng.randrange(4) for _ in range(rng.randrange(1, 30))] for _ in range(3)]
        t_cap = max(map(len, rows)) + 3
        seq = torch.tensor([r + [rng.randrange(4) for _ in range(t_cap - len(r))] for r in rows])
        last = torch.tensor([len(r) - 1 for r in rows])
        max_match = rng.choice([1, 2, 5, 12])
        match = suffix_matches(seq, last, max_match)
        want = [[_direct(r, e, max_match) if e < len(r) - 1 else 0 for e in range(t_cap)]
                for r in rows]
        assert match.tolist() == want, (rows, max_match)

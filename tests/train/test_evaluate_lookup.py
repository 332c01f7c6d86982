"""The offline replay's prompt lookup (train/evaluate.lookup_draft): the served rule, stated
against the whole-history reference (tests/harness/lookup_reference.py), at every round of a
repetitive record."""

from __future__ import annotations

import random

import torch

from domino_sglang.train.evaluate import lookup_draft
from tests.harness import lookup_reference


def test_lookup_draft_is_the_served_rule_at_every_round():
    rng = random.Random(3)
    motif = [rng.randrange(20) for _ in range(7)]
    ids = [rng.randrange(20) for _ in range(5)] + motif * 4 + [rng.randrange(20) for _ in range(9)]
    rec = {"ids": ids, "start": 8}
    found = 0
    for a in range(rec["start"], len(ids) - 1):
        for n in (3, 7, 15):
            want = lookup_reference.lookup_draft(torch.tensor(ids[:a + 1]), n).tolist()
            assert lookup_draft(rec, a, n) == want, (a, n)
            found += bool(want)
    assert found > 20  # the motif recurs: most rounds have a draft

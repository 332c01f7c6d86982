"""The target's features for training, batched: records grouped by length into right-padded
forwards equal the one-record path (float32, to the GEMMs' rounding), with and without the
distillation top-k, cached or not, and the cache then serves them."""

from __future__ import annotations

import random

import pytest
import torch

from domino_sglang.train.features import TargetFeatures
from tests.harness.train_fixtures import VOCAB, make_tiny_target

# float32: a padded batch runs the same math over more rows; the tiny target's features reach
# ~100, so the difference is measured relative to each record's largest feature
TOL = 1e-5


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("feat") / "target")


def records(n: int = 11, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": i, "ids": [rng.randrange(VOCAB) for _ in range(rng.randrange(5, 60))]}
            for i in range(n)]


@pytest.mark.parametrize("topk", [0, 8])
@pytest.mark.parametrize("cached", [False, True])
def test_batched_features_equal_one_record_forwards(target, tmp_path, topk, cached):
    recs = records()
    one = TargetFeatures(target, [0, 2], torch.float32, topk=topk)
    want = [one(rec) for rec in recs]
    want_soft = [one.soft(rec) for rec in recs] if topk else None
    cache = tmp_path / "features" if cached else None
    batched = TargetFeatures(target, [0, 2], torch.float32, cache_dir=cache, topk=topk)
    got = batched.many(recs, max_tokens=128)  # several groups of mixed lengths
    for rec, w, g in zip(recs, want, got):
        assert g.shape == w.shape == (len(rec["ids"]), 2 * 32)
        assert float((g - w).abs().max()) <= TOL * float(w.abs().max()), rec["id"]
    if topk:
        for rec, (wi, wv) in zip(recs, want_soft):
            gi, gv = batched.soft(rec)
            assert float((gv - wv).abs().max()) <= TOL * float(wv.abs().max())
            assert (gi == wi).float().mean() > 0.95  # near-ties may swap within the top-k
    if cached:  # a second call reads every record from the cache
        again = TargetFeatures(target, [0, 2], torch.float32, cache_dir=cache, topk=topk)
        again._batch_forward = None  # any forward would fail
        assert all(torch.equal(a, g) for a, g in zip(again.many(recs), got))

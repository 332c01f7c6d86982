"""The feature cache as a run writes it: safetensors files whose size `train --plan` states
before the run (checked against the bytes written), a run that would not fit the disk refused
before anything is written, and online features writing nothing while training the same drafter."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple

import pytest
import torch

from domino_sglang.train import recipe
from domino_sglang.train.config import TrainConfigError, load_train_config
from domino_sglang.train.features import FILE_OVERHEAD, cache_bytes, feature_plan
from domino_sglang.train.loop import train
from tests.harness.train_fixtures import tiny_overrides

Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize("distill", [0.0, 0.5])
def test_the_planned_cache_is_the_bytes_written(tmp_path, distill):
    # 10 training records, 2 a step: 5 steps are an epoch, every record's features written
    conf = load_train_config(None, tiny_overrides(tmp_path, steps=5, eval_every=5,
                                                  distill=distill, distill_topk=8))
    plan = feature_plan(conf)
    assert plan.records == 12 and plan.tokens == 12 * 48
    assert plan.files == 12 * (2 if distill else 1)
    # float32 features of the one target layer the tiny drafter reads (spread_layer_ids over 4
    # layers) x hidden 32, and 8 int32 ids + 8 float32 logits a token
    assert plan.tensor_bytes == plan.tokens * (1 * 32 * 4 + (8 * 8 if distill else 0))
    listed = recipe.plan(*recipe.load_recipe(None, tiny_overrides(
        tmp_path, steps=5, eval_every=5, distill=distill, distill_topk=8)))
    assert f"cache {plan.bytes / 1e9:.3f} GB" in listed and "576 tokens" in listed
    train(conf, progress=False)
    cache = tmp_path / "run" / "features"
    files = sorted(cache.glob("*.safetensors"))
    assert len(files) == plan.files and not list(cache.glob("*.pt"))  # no pickles
    written = cache_bytes(cache)
    assert plan.tensor_bytes < written <= plan.bytes  # headers: under FILE_OVERHEAD a file
    assert written > plan.bytes - plan.files * FILE_OVERHEAD


def test_a_cache_the_disk_cannot_hold_is_refused_before_anything_is_written(tmp_path,
                                                                            monkeypatch):
    conf = load_train_config(None, tiny_overrides(tmp_path, steps=3, eval_every=3))
    need = feature_plan(conf).bytes
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**12, 0, need - 1))
    with pytest.raises(TrainConfigError, match=r"feature cache needs .* GB .* features = online"):
        train(conf, progress=False)
    assert not (tmp_path / "run" / "features").exists()
    assert not (tmp_path / "run" / "checkpoint").exists()
    listed = recipe.plan(*recipe.load_recipe(None, tiny_overrides(tmp_path, steps=3)))
    assert "DOES NOT FIT" in listed
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**12, 0, need))
    train(conf, progress=False)  # exactly enough room: it runs


def test_online_features_write_nothing_and_train_the_same_drafter(tmp_path):
    runs = {}
    for mode in ("cache", "online"):
        (tmp_path / mode).mkdir()
        conf = load_train_config(None, tiny_overrides(tmp_path / mode, steps=6, features=mode))
        train(conf, progress=False)
        run = tmp_path / mode / "run"
        runs[mode] = torch.load(run / "checkpoint" / "drafter.pt", weights_only=True)
        logs = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
        runs[mode + "-eval"] = [x["eval"] for x in logs if "eval" in x][-1]
    assert not (tmp_path / "online" / "run" / "features").exists()
    for name, value in runs["cache"].items():  # the cache holds exactly what online computes
        assert torch.equal(value, runs["online"][name]), name
    assert runs["cache-eval"] == runs["online-eval"]


def test_features_mode_is_validated_with_the_key_named(tmp_path):
    with pytest.raises(TrainConfigError, match="'features' must be cache or online"):
        load_train_config(None, tiny_overrides(tmp_path, features="disk"))

"""Drafter checkpoints: the upstream layout loads; every malformed variant names its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from domino_sglang.config import (
    DrafterConfigError,
    check_against_target,
    load_draft_config,
    load_draft_weights,
)
from domino_sglang.model import DominoDrafter, init_drafter_weights

# The released Qwen3-8B Domino drafter's config.json layout, every size scaled down
# (hidden 4096 -> 32, 5 draft layers -> 2, vocab 151936 -> 64, GRU 1024 -> 16, emb 256 -> 8).
UPSTREAM_LIKE = {
    "architectures": ["DFlashDraftModel"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "block_size": 16,
    "dflash_config": {
        "emb_dim": 8,
        "gru_hidden_dim": 16,
        "mask_token_id": 63,
        "projector_type": "domino",
        "pure_draft_prefix_len": 1,
        "shift_label": True,
        "target_layer_ids": [1, 2, 3],
    },
    "head_dim": 8,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "max_position_embeddings": 40960,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_target_layers": 6,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 64,
}


def write(path: Path, cfg: dict, weights: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    if weights is None:
        weights = init_drafter_weights(load_draft_config(path))
    if weights:
        save_file({k: v.to(torch.bfloat16) for k, v in weights.items()},
                  str(path / "model.safetensors"))
    return path


def test_upstream_layout_loads_and_runs(tmp_path):
    path = write(tmp_path / "d", UPSTREAM_LIKE)
    conf = load_draft_config(path)
    check_against_target(conf, target_hidden=32, target_vocab=64, target_layers=6)
    model = DominoDrafter.from_pretrained(conf)
    assert conf.block_size == 16 and conf.target_layer_ids == (1, 2, 3)
    assert conf.candidate_pool == 2048  # upstream's default when the config does not say
    full = write(tmp_path / "full", mutate(UPSTREAM_LIKE, "dflash_config.candidate_pool", 0))
    assert load_draft_config(full).candidate_pool == 0  # 0 = full vocabulary, kept
    assert conf.draft_temperature_scale == 1.0  # sampled drafts at the request's temperature
    sharp = write(tmp_path / "sharp",
                  mutate(UPSTREAM_LIKE, "dflash_config.draft_temperature_scale", 0.7))
    assert load_draft_config(sharp).draft_temperature_scale == 0.7
    ctx_kv = model.context_kv(torch.randn(5, 3 * 32), torch.arange(5))
    assert len(ctx_kv) == 2 and ctx_kv[0][0].shape == (5, 2, 8)


def test_head_dtype_converts_only_the_head(tmp_path):
    """The CPU worker keeps the head in fp32 beside a bf16 backbone and bf16 target weights."""
    from domino_sglang.rollout import greedy_rollout

    conf = load_draft_config(write(tmp_path / "d", UPSTREAM_LIKE))
    model = DominoDrafter.from_pretrained(conf, dtype=torch.bfloat16)
    embed = torch.nn.Embedding(64, 32).to(torch.bfloat16)
    head = model.head(embed, torch.randn(64, 32, dtype=torch.bfloat16), torch.float32)
    assert head.prefix_gru.weight_hh_l0.dtype == head.embed_proj[2].weight.dtype == torch.float32
    assert model.fc.weight.dtype == model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    z = torch.randn(3, 16, 32, dtype=torch.bfloat16)
    chain = greedy_rollout(z, torch.tensor([1, 2, 3]), head, candidate_pool=8)
    assert chain.shape == (3, 15) and int(chain.max()) < 64


def mutate(cfg: dict, dotted: str, value) -> dict:
    cfg = json.loads(json.dumps(cfg))
    node = cfg
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[leaf]
    else:
        node[leaf] = value
    return cfg


@pytest.mark.parametrize("dotted,value,message", [
    ("architectures", ["Qwen3ForCausalLM"], "field 'architectures'"),
    ("dflash_config.projector_type", "mlp", "projector_type must be \"domino\""),
    ("dflash_config", KeyError, "missing field 'dflash_config'"),
    ("dflash_config.gru_hidden_dim", KeyError, "missing field 'gru_hidden_dim'"),
    ("dflash_config.target_layer_ids", [], "target_layer_ids must be a non-empty list"),
    ("dflash_config.mask_token_id", 64, "mask_token_id 64 is outside the vocabulary"),
    ("hidden_size", "32", "field 'hidden_size' must be an integer"),
    ("block_size", 1, "block size must be in [2, 64]"),
    ("block_size", 65, "block size must be in [2, 64]"),
    ("num_key_value_heads", 3, "'num_key_value_heads' (3) must divide"),
    ("auto_map", {"AutoModel": "x.Y"}, "asks for remote code"),
    ("dflash_config.candidate_pool", -1, "field 'candidate_pool' must be an integer >= 0"),
    ("dflash_config.candidate_pool", "2048", "field 'candidate_pool' must be an integer >= 0"),
    ("dflash_config.short_draft", "yes", "field 'short_draft' must be true/false"),
    ("dflash_config.draft_temperature_scale", 0,
     "field 'draft_temperature_scale' must be positive"),
    ("dflash_config.draft_temperature_scale", "0.7",
     "field 'draft_temperature_scale' must be a number"),
    ("dflash_config.draft_temperature_scale", True,
     "field 'draft_temperature_scale' must be a number"),
])
def test_malformed_config_is_rejected_naming_the_field(tmp_path, dotted, value, message):
    write(tmp_path / "ok", UPSTREAM_LIKE)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(mutate(UPSTREAM_LIKE, dotted, value)))
    with pytest.raises(DrafterConfigError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        load_draft_config(bad)


@pytest.mark.parametrize("kwargs,message", [
    ({"target_hidden": 64, "target_vocab": 64, "target_layers": 6},
     "field 'hidden_size' is 32 but the target's is 64"),
    ({"target_hidden": 32, "target_vocab": 100, "target_layers": 6},
     "field 'vocab_size' is 64 but the target's is 100"),
    ({"target_hidden": 32, "target_vocab": 64, "target_layers": 3},
     r"target_layer_ids \[3\] out of range for a target with 3 layers"),
])
def test_mismatch_with_target(tmp_path, kwargs, message):
    conf = load_draft_config(write(tmp_path / "d", UPSTREAM_LIKE))
    with pytest.raises(DrafterConfigError, match=message):
        check_against_target(conf, **kwargs)


def test_bad_weights(tmp_path):
    conf_ok = load_draft_config(write(tmp_path / "ok", UPSTREAM_LIKE))
    good = init_drafter_weights(conf_ok)

    missing = dict(good)
    del missing["prefix_gru.weight_hh_l0"]
    with pytest.raises(DrafterConfigError, match="missing weight 'prefix_gru.weight_hh_l0'"):
        load_draft_weights(load_draft_config(write(tmp_path / "m", UPSTREAM_LIKE, missing)))

    shaped = dict(good, **{"embed_proj.0.weight": torch.zeros(8, 40)})
    with pytest.raises(DrafterConfigError, match=r"'embed_proj.0.weight' has shape \(8, 40\)"):
        load_draft_weights(load_draft_config(write(tmp_path / "s", UPSTREAM_LIKE, shaped)))

    nan = dict(good, **{"fc.weight": torch.full((32, 96), float("nan"))})
    with pytest.raises(DrafterConfigError, match="'fc.weight' has NaN/inf"):
        load_draft_weights(load_draft_config(write(tmp_path / "n", UPSTREAM_LIKE, nan)))

    pickled = write(tmp_path / "p", UPSTREAM_LIKE, {})
    torch.save(good, pickled / "pytorch_model.bin")
    with pytest.raises(DrafterConfigError, match="pickle weights are refused"):
        load_draft_weights(load_draft_config(pickled))

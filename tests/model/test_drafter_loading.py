"""Drafter checkpoints: the upstream layout loads; every malformed variant names its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from domino_sglang.model.config import (
    DrafterConfigError,
    check_against_target,
    load_draft_config,
    load_draft_weights,
)
from domino_sglang.model.drafter import DominoDrafter, init_drafter_weights

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
    from domino_sglang.spec.rollout import HeadParams, greedy_rollout

    conf = load_draft_config(write(tmp_path / "d", UPSTREAM_LIKE))
    model = DominoDrafter.from_pretrained(conf, dtype=torch.bfloat16)
    embed = torch.nn.Embedding(64, 32).to(torch.bfloat16)
    head = HeadParams.of(model, embed, torch.randn(64, 32, dtype=torch.bfloat16), torch.float32)
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
    ("dflash_config", KeyError, "projector_type must be \"domino\", got None"),
    ("dflash_config", [1], "field 'dflash_config' must be an object"),
    ("emb_dim", 9, "field 'emb_dim' is 9 but dflash_config.emb_dim is 8"),
    ("dflash_config.target_layer_ids", [1, -1], "target_layer_ids must be a non-empty list"),
    ("attention_bias", True, "field 'attention_bias' = True is not supported"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "field 'rope_scaling' = "),
    ("hidden_act", "gelu", "field 'hidden_act' = 'gelu' is not supported"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6}, "'rope_parameters.rope_type'"),
    ("layer_types", ["sliding_attention", "full_attention"], "field 'layer_types' must list"),
    ("dflash_config.conv_kernel_size", 3, "field 'dflash_config.conv_kernel_size' = 3"),
    ("dflash_config.attention_value_scale", 0.5, "'dflash_config.attention_value_scale' = 0.5"),
    ("dflash_config.gru_hidden_dim", KeyError, "missing field 'gru_hidden_dim'"),
    ("dflash_config.target_layer_ids", [], "target_layer_ids must be a non-empty list"),
    ("dflash_config.mask_token_id", 64, "mask_token_id 64 is outside the vocabulary"),
    ("hidden_size", "32", "field 'hidden_size' must be an integer"),
    ("block_size", 1, "block size must be in [2, 64]"),
    ("block_size", 65, "block size must be in [2, 64]"),
    ("num_key_value_heads", 3, "'num_key_value_heads' (3) must divide"),
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


# --- issue 63: every variant SGLang 0.5.23's own DFLASH/Domino loader loads ------------------

def _tiny_released(name: str) -> dict:
    from tests.harness.released_drafters import TINY, released, scaled

    return scaled(released(name), **TINY)


@pytest.mark.parametrize("name", ["qwen3-8b-domino.json", "qwen3-4b-domino.json"])
def test_released_config_loads_and_runs(tmp_path, name):
    """The released layout (auto_map, top-level + nested emb_dim, `model.`-prefixed weights),
    sizes scaled down, loads and drafts. Shown to fail on 780c26f ('asks for remote code')."""
    from domino_sglang.spec.rollout import HeadParams, greedy_rollout
    from tests.harness.released_drafters import write_released_drafter

    cfg = _tiny_released(name)
    assert cfg["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    want = write_released_drafter(tmp_path / "d", cfg)
    conf = load_draft_config(tmp_path / "d")
    assert conf.ignored_metadata == ("auto_map",)
    assert (conf.block_size, conf.mask_token_id, conf.target_layer_ids) == (16, 63, (1, 3))
    check_against_target(conf, target_hidden=32, target_vocab=64, target_layers=6)
    model = DominoDrafter.from_pretrained(conf)
    got = model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)  # every `model.` weight landed
    z = torch.randn(2, 16, 32)
    chain = greedy_rollout(z, torch.tensor([1, 2]), HeadParams.of(
        model, torch.nn.Embedding(64, 32), torch.randn(64, 32)))
    assert chain.shape == (2, 15)


def test_auto_map_anywhere_is_metadata(tmp_path):
    """auto_map / trust_remote_code, top level or nested in dflash_config, are recorded and
    ignored (nothing executes them). On 780c26f the top-level one was refused and the nested
    one not looked at (no `ignored_metadata`)."""
    cfg = mutate(UPSTREAM_LIKE, "auto_map", {"AutoModel": "dflash.DFlashDraftModel"})
    cfg = mutate(cfg, "dflash_config.auto_map", {"AutoModel": "evil.Model"})
    cfg = mutate(cfg, "trust_remote_code", True)
    conf = load_draft_config(write(tmp_path / "d", cfg))
    assert conf.ignored_metadata == ("auto_map", "trust_remote_code", "dflash_config.auto_map")


def test_top_level_fallbacks_as_upstream(tmp_path):
    """upstream `parse_dflash_draft_config`: dflash_config first, then the top level; no
    target_layer_ids: spread over num_target_layers."""
    d = dict(UPSTREAM_LIKE["dflash_config"])
    flat = {k: v for k, v in UPSTREAM_LIKE.items() if k != "dflash_config"}
    flat.update(d)
    conf = load_draft_config(write(tmp_path / "flat", flat))
    assert (conf.mask_token_id, conf.target_layer_ids, conf.gru_hidden_dim, conf.emb_dim) == (
        63, (1, 2, 3), 16, 8)
    nested_block = mutate(UPSTREAM_LIKE, "dflash_config.block_size", 8)
    assert load_draft_config(write(tmp_path / "nb", nested_block)).block_size == 8
    no_block = mutate(UPSTREAM_LIKE, "block_size", KeyError)
    assert load_draft_config(write(tmp_path / "b", no_block)).block_size == 16  # upstream's default
    spread = mutate(UPSTREAM_LIKE, "dflash_config.target_layer_ids", KeyError)
    conf = load_draft_config(write(tmp_path / "s", mutate(spread, "dflash_config.emb_dim", 8)))
    assert conf.target_layer_ids == (1, 3)  # build_target_layer_ids(6, 2)


def test_mask_token_id_from_the_tokenizer(tmp_path, target_path):
    """No mask_token_id: upstream resolves mask_token (default <|MASK|>) with the target's
    tokenizer; an id outside vocab_size is refused, naming the token."""
    cfg = mutate(UPSTREAM_LIKE, "dflash_config.mask_token_id", KeyError)
    cfg = mutate(cfg, "vocab_size", 49152)
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(mutate(cfg, "dflash_config.mask_token",
                                                          "<|im_end|>")))
    conf = load_draft_config(folder, tokenizer_path=target_path)
    assert (conf.mask_token_id, conf.mask_token_source) == (2, "tokenizer")
    (folder / "config.json").write_text(json.dumps(cfg))  # <|MASK|>: the next id, 49152
    with pytest.raises(DrafterConfigError, match=r"'<\|MASK\|>' resolves to id 49152 .* outside"):
        load_draft_config(folder, tokenizer_path=target_path)
    with pytest.raises(DrafterConfigError, match="no mask_token_id, and no target tokenizer"):
        load_draft_config(folder)


def test_weight_name_variants_load_the_same(tmp_path):
    """upstream `DFlashDraftModel.load_weights` names: `model.` prefix, the `encoder.` aliases
    and SGLang's fused qkv_proj / gate_up_proj give the same drafter as our names."""
    conf = load_draft_config(write(tmp_path / "ref", UPSTREAM_LIKE))
    ref = load_draft_weights(conf)
    variant = {}
    for k, v in ref.items():
        name = {"fc.weight": "encoder.fc.weight",
                "hidden_norm.weight": "encoder.output_norm_enc.weight"}.get(k, "model." + k)
        variant[name] = v
    for i in range(conf.num_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        variant[a + "qkv_proj.weight"] = torch.cat([variant.pop(a + x + "_proj.weight")
                                                    for x in "qkv"])
        variant[m + "gate_up_proj.weight"] = torch.cat([variant.pop(m + "gate_proj.weight"),
                                                        variant.pop(m + "up_proj.weight")])
    variant["model.rotary_emb.inv_freq"] = torch.ones(4)  # unknown names are ignored
    got = load_draft_weights(load_draft_config(write(tmp_path / "v", UPSTREAM_LIKE, variant)))
    assert set(ref) <= set(got) and all(torch.equal(got[k], ref[k]) for k in ref)


def test_pickles_beside_safetensors_are_refused(tmp_path):
    """A pickle beside the safetensors is refused, naming it (780c26f ignored it), and so is
    upstream's mask_embedding.pt (a torch.load pickle), naming the file."""
    path = write(tmp_path / "d", UPSTREAM_LIKE)
    (path / "training_args.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(DrafterConfigError, match=r"pickle weights are refused \(training_args"):
        load_draft_weights(load_draft_config(path))
    (path / "training_args.bin").unlink()
    (path / "mask_embedding.pt").write_bytes(b"\x80\x04pickle")
    with pytest.raises(DrafterConfigError, match="mask_embedding.pt: a trained mask embedding"):
        load_draft_weights(load_draft_config(path))


# --- issue 68 item 7: `serve --dry-run` edges: one line, exit 2 ------------------------------

def _dry_run(tmp_path, drafter: Path, capsys) -> str:
    from domino_sglang import cli

    target = tmp_path / "target"
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps(
        {"hidden_size": 32, "vocab_size": 64, "num_hidden_layers": 6}))
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--dry-run", "--device", "cpu", "--model-path", str(target),
                  "--drafter", str(drafter), "--port", "1"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.count("\n") == 0, (exc.value.code, err)
    assert err.startswith("domino-sglang: error: serve: ")
    return err


@pytest.mark.parametrize("content,message", [
    (b"[1, 2, 3]", "must be a JSON object, got a JSON list"),
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary", "not UTF-8 text"),
])
def test_dry_run_config_not_an_object(tmp_path, capsys, content, message):
    """780c26f: a traceback, exit 1."""
    path = write(tmp_path / "d", UPSTREAM_LIKE)
    (path / "config.json").write_bytes(content)
    assert message in _dry_run(tmp_path, path, capsys)


def test_dry_run_checks_the_draft_vocabulary(tmp_path, capsys):
    """780c26f: --dry-run passed a draft_vocab.json linked to /etc/passwd, or with ids
    outside the vocabulary; both now fail with one line (the worker would have failed later)."""
    path = write(tmp_path / "d", UPSTREAM_LIKE)
    (path / "draft_vocab.json").symlink_to("/etc/passwd")
    assert "draft_vocab.json: invalid JSON" in _dry_run(tmp_path, path, capsys)
    (path / "draft_vocab.json").unlink()
    (path / "draft_vocab.json").symlink_to("/dev/zero")
    assert "draft_vocab.json: not a regular file" in _dry_run(tmp_path, path, capsys)
    (path / "draft_vocab.json").unlink()
    (path / "draft_vocab.json").write_text(json.dumps({"ids": [1, 2, 64]}))
    assert "distinct token ids in [0, 64)" in _dry_run(tmp_path, path, capsys)


def test_dry_run_refuses_a_pickle_beside_the_safetensors(tmp_path, capsys):
    path = write(tmp_path / "d", UPSTREAM_LIKE)
    torch.save({"x": torch.zeros(1)}, path / "pytorch_model.bin")
    assert "pickle weights are refused (pytorch_model.bin)" in _dry_run(tmp_path, path, capsys)


def test_sglang_candidate_pool_flag():
    """SGLang's --speculative-domino-candidate-pool-size sets the pool when given a value other
    than its default (2048), else the drafter's config holds. 780c26f ignored the flag."""
    from types import SimpleNamespace

    from domino_sglang.spec.options import DominoOptionError, resolve

    def pool(config_pool: int, flag: int | None) -> int:
        drafter = SimpleNamespace(candidate_pool=config_pool, short_draft=False,
                                  draft_temperature_scale=1.0)
        return resolve(drafter, 16, pool_flag=flag).candidate_pool

    assert pool(0, None) == 0  # no server
    assert pool(0, 2048) == 0  # the flag's default: the drafter's config is kept
    assert pool(2048, 256) == 256
    with pytest.raises(DominoOptionError, match="candidate-pool-size must be"):
        pool(2048, -1)

"""The released Domino drafter configs, verbatim, and their copies scaled down in sizes only.

Fixtures (tests/harness/fixtures/):
  qwen3-8b-domino.json  VERBATIM copy of SpecForge's `configs/qwen3-8b-domino.json`
                        (github.com/sgl-project/SpecForge, commit 70e241aee3d0), the layout of
                        `Huang2020/Qwen3-8B-Domino-b16` (auto_map, top-level and nested emb_dim,
                        num_target_layers, layer_types).
  qwen3-4b-domino.json  RECONSTRUCTED, not a verbatim copy: no public copy of the released
                        Qwen3-4B Domino config.json could be retrieved here (the one public
                        `qwen3-4b-domino.json` found, in a fork, names a different architecture).
                        It is the 8B file above with the Qwen3-4B sizes of SpecForge's
                        `configs/qwen3-4b-dflash.json` (hidden_size 2560, intermediate_size 9728),
                        every other field unchanged.

`scaled` changes sizes only (hidden, heads, head_dim, intermediate, draft layers and their
layer_types, vocabulary, GRU and embedding widths, the target depth the layer ids are spread
over) and keeps every other field, `auto_map` included. Two values that are ids, not sizes,
must move with the vocabulary: `mask_token_id` (151669, Qwen3's first free row, is outside a
small vocabulary) and `target_layer_ids`, re-spread over the smaller target as upstream's
`build_target_layer_ids` spreads [1, 9, 17, 25, 33] over 36 layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from domino_sglang.model.config import load_draft_config, spread_layer_ids
from domino_sglang.model.drafter import init_drafter_weights

FIXTURES = Path(__file__).parent / "fixtures"
RELEASED = ("qwen3-8b-domino.json", "qwen3-4b-domino.json")

# unit-test sizes: a 6-layer target with hidden 32 and a 64-token vocabulary
TINY = dict(hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=48, layers=2, vocab=64,
            gru=16, emb=8, target_layers=6, mask_token_id=63)
# the CPU demo target (SmolLM2-135M: hidden 576, 30 layers, vocabulary 49152); mask = token 0
# (<|endoftext|>, which the chat never produces), as `make_draft_config` picks
SMOL = dict(hidden=576, heads=4, kv_heads=2, head_dim=64, intermediate=1728, layers=2,
            vocab=49152, gru=64, emb=32, target_layers=30, mask_token_id=0)


def released(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def scaled(cfg: dict, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
           layers: int, vocab: int, gru: int, emb: int, target_layers: int,
           mask_token_id: int) -> dict:
    """A copy of a released config with new sizes (see the module docstring)."""
    out = json.loads(json.dumps(cfg))
    out.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
               head_dim=head_dim, intermediate_size=intermediate, num_hidden_layers=layers,
               vocab_size=vocab, num_target_layers=target_layers)
    if "layer_types" in out:
        out["layer_types"] = out["layer_types"][:1] * layers
    if "max_window_layers" in out:
        out["max_window_layers"] = layers
    if "emb_dim" in out:
        out["emb_dim"] = emb
    d = out["dflash_config"]
    d.update(gru_hidden_dim=gru, emb_dim=emb, mask_token_id=mask_token_id,
             target_layer_ids=spread_layer_ids(target_layers, layers))
    return out


def write_released_drafter(out: Path, cfg: dict, seed: int = 0, prefix: str = "model.",
                           dtype: torch.dtype = torch.float32) -> dict:
    """config.json + model.safetensors with random weights named `prefix` + our names (the
    released checkpoints carry `model.`); returns the weights under our names."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    weights = init_drafter_weights(load_draft_config(out), seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    for name, w in weights.items():  # norms away from 1, so that a dropped norm shows
        if name.endswith("norm.weight"):
            weights[name] = w + 0.1 * torch.randn(w.shape, generator=g)
    save_file({prefix + k: v.to(dtype).contiguous() for k, v in weights.items()},
              str(out / "model.safetensors"))
    return {k: v.to(dtype).float() for k, v in weights.items()}

"""Test drafters for the real SmolLM2 target: random (from init-drafter) and a constructed
"repeat the last token" drafter whose acceptance is predictable.

The repeat drafter (every value set by hand, justified line by line):
  - draft layers add nothing (o_proj = down_proj = 0), final norm weight 1, so
    z_i = RMSNorm(embed(block_i)); position 0 (pure base logits) proposes
    argmax_v <E_v, RMSNorm(E_{x_t})>, which is x_t itself for tokens like " cat" (checked in the
    test: tied embeddings make many tokens their own nearest neighbour);
  - the GRU keeps a running average of the embeddings it consumes: r and u gates at 0.5
    (W_ir = W_hr = W_iz = W_hz = 0), W_hn = 0, W_in = a I, so after consuming x_t, d_1..d_i (all
    equal to x) the state is s = c tanh(a E_x), nearly proportional to E_x;
  - the head reads s only: embed_proj.0 = [[0, I], [0, -I]], SiLU, embed_proj.2 = beta [E, -E],
    so the correction is beta E (silu(s) - silu(-s)) = beta E s, whose argmax is x again, and
    beta makes it dominate the MASK position's base logits.
So on a prompt whose greedy continuation repeats " cat", every draft is accepted (tau -> B);
elsewhere it is wrong almost always. Verification must stay lossless either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from domino_sglang.model.config import load_draft_config, make_draft_config
from domino_sglang.model.drafter import init_drafter_weights, save_drafter


def _target(target_dir: Path) -> tuple[dict, torch.Tensor]:
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    embed = load_file(str(Path(target_dir) / "model.safetensors"))["model.embed_tokens.weight"]
    return cfg, embed.float()


def make_random_drafter(target_dir: Path, out: Path, block_size: int = 16, seed: int = 0) -> Path:
    cfg, _ = _target(target_dir)
    conf_dict = make_draft_config(cfg, num_layers=2, block_size=block_size)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(conf_dict))
    save_drafter(out, conf_dict, init_drafter_weights(load_draft_config(out), seed=seed))
    return out


def make_repeat_drafter(target_dir: Path, out: Path, block_size: int = 4) -> Path:
    cfg, embed = _target(target_dir)  # embed [V, H]
    h = cfg["hidden_size"]
    conf_dict = make_draft_config(cfg, num_layers=1, block_size=block_size, gru_hidden_dim=h,
                                  emb_dim=2 * h)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(conf_dict))
    w = init_drafter_weights(load_draft_config(out), seed=0)
    w["layers.0.self_attn.o_proj.weight"].zero_()
    w["layers.0.mlp.down_proj.weight"].zero_()
    a = 1.0 / float(embed.abs().max())
    w["prefix_gru.weight_ih_l0"] = torch.cat([torch.zeros(2 * h, h), a * torch.eye(h)])
    w["prefix_gru.weight_hh_l0"] = torch.zeros(3 * h, h)
    eye = torch.eye(h)
    w["embed_proj.0.weight"] = torch.cat([torch.cat([torch.zeros(h, h), eye], 1),
                                          torch.cat([torch.zeros(h, h), -eye], 1)])
    beta = 1e3
    w["embed_proj.2.weight"] = beta * torch.cat([embed, -embed], 1)
    save_drafter(out, conf_dict, w, dtype=torch.float32)
    return out


def make_eos_drafter(target_dir: Path, out: Path, block_size: int = 4,
                     token: int | None = None) -> Path:
    """A drafter that proposes EOS (or `token`) at every position, so a draft is accepted exactly
    when the target itself emits that token there: EOS (or a stop token) lands INSIDE an accepted
    block and every token the round commits after it must be dropped.

    Construction: attention adds nothing (o_proj = 0); the MLP adds a large constant direction u
    to every position: gate = up = W, so silu(Wy) * (Wy) = g^2 sigmoid(g) >= 0 whatever the
    input, and down_proj = c u 1^T turns its sum into c' u with c' > 0. After the final RMSNorm
    z is ~ u, and u is chosen so that argmax_v <E_v, u> = EOS (tied lm_head: EOS is not its own
    nearest neighbour, so a few perceptron steps move E_eos away from its nearest rivals). The
    head correction is zero (embed_proj.2 = 0), so every draft is EOS."""
    cfg, embed = _target(target_dir)  # embed [V, H]
    eos = cfg["eos_token_id"] if token is None else token
    conf_dict = make_draft_config(cfg, num_layers=1, block_size=block_size)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(conf_dict))
    w = init_drafter_weights(load_draft_config(out), seed=0)
    u = embed[eos].clone()
    for _ in range(100):
        scores = embed @ u  # [V]
        rival = int(scores.index_fill(0, torch.tensor([eos]), -torch.inf).argmax())
        if scores[eos] - scores[rival] > 0.05 * float(u.norm()):
            break
        u += embed[eos] - embed[rival]
    w["layers.0.self_attn.o_proj.weight"].zero_()
    w["layers.0.mlp.up_proj.weight"] = w["layers.0.mlp.gate_proj.weight"].clone()
    inter = w["layers.0.mlp.down_proj.weight"].shape[1]
    w["layers.0.mlp.down_proj.weight"] = (1e4 / inter) * u[:, None].expand(-1, inter).clone()
    w["embed_proj.2.weight"].zero_()
    save_drafter(out, conf_dict, w, dtype=torch.float32)
    return out

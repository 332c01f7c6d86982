"""The Domino drafter: parallel block backbone (DFlash) + causal head (GRU + low-rank correction).

    target features  f [T, K*H]  (outputs of the target layers `target_layer_ids`)
    context          c = RMSNorm(fc(f))                               [T, H]
    per draft layer  K/V of the context: k = RoPE(k_norm(k_proj(c))), v = v_proj(c); written once
                     into the draft KV cache at the same slots as the target's tokens
    block            x = embed([x_t, MASK x (B-1)])                   [bs*B, H]
    draft layers     Qwen3 decoder layers; the block attends to all context K/V and to itself
                     NON-causally (every block position sees every other)
    z                final RMSNorm                                    [bs*B, H]
    head             see rollout.py (prefix_gru, embed_proj); embedding and lm_head are the
                     TARGET's, shared, never copied into the drafter

Attention is injected: `attend(layer_idx, q, k, v) -> out`. In SGLang it is a `RadixAttention`
(ENCODER_ONLY) over the draft KV pool, so any SGLang backend runs it (FlashInfer on GPU,
`domino_cpu` on CPU); training passes a plain SDPA over explicit context K/V.
Weight names follow the upstream checkpoint; the variants SGLang's own loader accepts (`model.`
prefix, aliases, fused projections) are mapped onto them (config.py `canonical_weights`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from domino_sglang.model.config import (
    COPY_MAX_MATCH,
    DraftConfig,
    load_draft_weights,
)
from domino_sglang.model.shard import Shard, shard_linear_in, shard_linear_out

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each [T, 1, D] float32


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> Rope:
    """Rotate-half RoPE (Llama/Qwen3) tables for `positions` [T]; computed once per pass and
    shared by every layer's q and k (one table costs as much as rotating a block on CPU)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
    angles = torch.cat([freqs, freqs], -1)[:, None, :]  # [T, 1, D]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x [T, heads, D] rotated by the tables of `rope_cos_sin`: x*cos + rotate_half(x)*sin."""
    cos, sin = rope
    d = x.shape[-1]
    xf = x.float()
    rotated = torch.cat([-xf[..., d // 2 :], xf[..., : d // 2]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class DraftAttention(nn.Module):
    def __init__(self, conf: DraftConfig):
        super().__init__()
        h, d = conf.hidden_size, conf.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = conf.num_heads, conf.num_kv_heads, d
        self.q_proj = nn.Linear(h, conf.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, conf.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, conf.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(conf.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, conf.rms_norm_eps)
        self.k_norm = RMSNorm(d, conf.rms_norm_eps)
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None  # see shard
        # apply_rope, or the same rotation on the CPU runtime's native kernel (cpu/native.py)
        self.rotate: Callable[[torch.Tensor, Rope], torch.Tensor] = apply_rope

    def kv(self, x: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of inputs x [T, H] -> k, v [T, Hkv, D] (k normed and rotated)."""
        t = x.shape[0]
        k = self.k_norm(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        return self.rotate(k, rope), v

    def forward(self, x: torch.Tensor, rope: Rope, attend: Attend, layer_idx: int
                ) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.num_heads, self.head_dim))
        q = self.rotate(q, rope)
        k, v = self.kv(x, rope)
        out = attend(layer_idx, q, k, v)  # [T, Hq, D]
        out = self.o_proj(out.reshape(t, self.num_heads * self.head_dim))
        return out if self.reduce is None else self.reduce(out)  # tensor parallel: summed

    def shard(self, shard: Shard) -> None:
        """Keep this rank's heads (tp.py): q/k/v by output heads, o_proj by input heads."""
        shard_linear_out(self.q_proj, shard, self.num_heads)
        shard_linear_out(self.k_proj, shard, self.num_kv_heads)
        shard_linear_out(self.v_proj, shard, self.num_kv_heads)
        shard_linear_in(self.o_proj, shard, self.num_heads)
        self.num_heads //= shard.size
        self.num_kv_heads //= shard.size
        self.reduce = shard.all_reduce


class DraftMLP(nn.Module):
    def __init__(self, conf: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(conf.hidden_size, conf.intermediate_size, bias=False)
        self.up_proj = nn.Linear(conf.hidden_size, conf.intermediate_size, bias=False)
        self.down_proj = nn.Linear(conf.intermediate_size, conf.hidden_size, bias=False)
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None  # see shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out if self.reduce is None else self.reduce(out)  # tensor parallel: summed

    def shard(self, shard: Shard) -> None:
        """Keep this rank's intermediate rows (tp.py): gate/up by output, down by input."""
        inter = self.gate_proj.out_features
        shard_linear_out(self.gate_proj, shard, inter)
        shard_linear_out(self.up_proj, shard, inter)
        shard_linear_in(self.down_proj, shard, inter)
        self.reduce = shard.all_reduce


class DraftLayer(nn.Module):
    def __init__(self, conf: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(conf.hidden_size, conf.rms_norm_eps)
        self.self_attn = DraftAttention(conf)
        self.post_attention_layernorm = RMSNorm(conf.hidden_size, conf.rms_norm_eps)
        self.mlp = DraftMLP(conf)

    def forward(self, x: torch.Tensor, rope: Rope, attend: Attend, layer_idx: int
                ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attend, layer_idx)
        return x + self.mlp(self.post_attention_layernorm(x))


class DominoDrafter(nn.Module):
    """Backbone + head weights. The target's embedding and lm_head are passed in, not owned."""

    def __init__(self, conf: DraftConfig):
        super().__init__()
        self.conf = conf
        h = conf.hidden_size
        self.fc = nn.Linear(conf.num_context_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, conf.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(conf) for _ in range(conf.num_layers))
        self.norm = RMSNorm(h, conf.rms_norm_eps)
        self.prefix_gru = nn.GRU(h, conf.gru_hidden_dim, bias=False, batch_first=True)
        self.embed_proj = nn.Sequential(
            nn.Linear(h + conf.gru_hidden_dim, conf.emb_dim, bias=False),
            nn.SiLU(),
            nn.Linear(conf.emb_dim, conf.vocab_size, bias=False),
        )
        # pointer-generator drafters only: g = sigmoid(w . [z ; onehot(match)] + b) (pointer.py)
        self.copy_gate = (nn.Linear(h + COPY_MAX_MATCH + 1, 1) if conf.copy_gate else None)

    @classmethod
    def from_pretrained(cls, conf: DraftConfig, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> DominoDrafter:
        """Load validated safetensors weights (extra upstream keys, if any, are ignored)."""
        model = cls(conf)
        weights = load_draft_weights(conf)
        own = model.state_dict()
        model.load_state_dict({k: v for k, v in weights.items() if k in own}, strict=True)
        return model.to(device=device, dtype=dtype).eval()

    def shard(self, shard: Shard) -> None:
        """Serve as rank `shard.rank` of `shard.size` tensor-parallel ranks (tp.py): every
        draft layer keeps its share of heads and MLP rows; the rest stays replicated."""
        for layer in self.layers:
            layer.self_attn.shard(shard)
            layer.mlp.shard(shard)

    def project_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[T, K*H] target-layer features -> [T, H] context states."""
        return self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))

    def context_kv(self, target_hidden: torch.Tensor, positions: torch.Tensor
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the K/V [T, Hkv, D] of the context features at `positions`."""
        ctx = self.project_context(target_hidden)
        rope = rope_cos_sin(positions, self.conf.head_dim, self.conf.rope_theta)
        return [layer.self_attn.kv(ctx, rope) for layer in self.layers]

    def backbone(self, block_embeds: torch.Tensor, positions: torch.Tensor,
                 attend: Attend) -> torch.Tensor:
        """Block inputs [T, H] (T = bs * B) -> z [T, H]; attention over context + block."""
        x = block_embeds.to(self.fc.weight.dtype)
        rope = rope_cos_sin(positions, self.conf.head_dim, self.conf.rope_theta)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, attend, i)
        return self.norm(x)


def init_drafter_weights(conf: DraftConfig, seed: int = 0, std: float = 0.02) -> dict:
    """Random weights for a fresh drafter (norms at 1), in the upstream names."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in conf.expected_shapes().items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        else:
            out[name] = torch.randn(shape, generator=g) * std
    return out


def save_drafter(out, config: dict, state: dict, dtype: torch.dtype = torch.bfloat16,
                 extra_files: dict[str, str] | None = None) -> None:
    """Write config.json + model.safetensors (+ extra_files: name -> text, e.g. the draft
    vocabulary) atomically (temp folder, then rename)."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from safetensors.torch import save_file

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file({k: v.detach().to(dtype).contiguous() for k, v in state.items()},
                  str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

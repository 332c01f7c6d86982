"""The drafter as an SGLang model class: what SGLang's model loader builds for DOMINO's draft side.

Private SGLang internals (sglang_compat.py): `RadixAttention`, `AttentionType`,
`LogitsProcessorOutput`, the TP group (`tp_shard`), the server arguments (`get_server_args`).
"""

from __future__ import annotations

import torch
from torch import nn

from domino_sglang.model.config import canonical_weights, parse_draft_config
from domino_sglang.model.drafter import DominoDrafter


def served_tokenizer_path() -> str | None:
    """The tokenizer of the model SGLang serves in this process (the drafter's mask token is
    read from it where its config names no id)."""
    from domino_sglang.sglang_compat import get_server_args

    try:
        args = get_server_args()
    except Exception:  # not published in this process: the config must name the id
        return None
    return getattr(args, "tokenizer_path", None) or getattr(args, "model_path", None)


def sglang_draft_model_class() -> type:
    """The drafter as an SGLang model class (built lazily: SGLang is imported only here).

    SGLang's model loader constructs it from the draft config and feeds it the checkpoint's
    (name, tensor) pairs; the worker passes the target's embeddings of the block as
    `input_embeds`. Attention goes through `RadixAttention` (ENCODER_ONLY = non-causal inside
    the block) over the draft KV pool, so it runs on whatever backend SGLang picked.
    """
    from domino_sglang.sglang_compat import (
        AttentionType,
        LogitsProcessorOutput,
        RadixAttention,
        tp_shard,
    )

    class DominoDraftModel(nn.Module):
        def __init__(self, config, quant_config=None, prefix: str = "") -> None:
            super().__init__()
            self.conf = parse_draft_config(config.to_dict(),
                                           getattr(config, "_name_or_path", "drafter"),
                                           tokenizer_path=served_tokenizer_path())
            c = self.conf
            self.drafter = DominoDrafter(c)
            # tensor parallel (tp.py): this rank's heads, sharded once the weights are loaded
            self.shard = tp_shard()
            n = 1 if self.shard is None else self.shard.size
            self.heads = c.num_heads // n
            self.attn = nn.ModuleList(
                RadixAttention(self.heads, c.head_dim, c.head_dim ** -0.5, c.num_kv_heads // n,
                               layer_id=i, attn_type=AttentionType.ENCODER_ONLY,
                               prefix=f"{prefix}attn.{i}")
                for i in range(c.num_layers)
            )

        @torch.no_grad()
        def forward(self, input_ids, positions, forward_batch, input_embeds=None, **kwargs):
            def attend(i: int, q, k, v):
                t = q.shape[0]
                out = self.attn[i](q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1),
                                   forward_batch)
                return out.view(t, self.heads, self.conf.head_dim)

            z = self.drafter.backbone(input_embeds, positions, attend)  # [T, H]
            return LogitsProcessorOutput(next_token_logits=None, hidden_states=z)

        def load_weights(self, weights) -> None:
            own = self.drafter.state_dict()
            seen = set()
            # upstream's name rules (config.py `canonical_weights`): `model.` prefix, aliases,
            # fused qkv/gate_up split back
            for name, tensor in canonical_weights(self.conf, weights).items():
                if name in own:  # extra upstream keys (if any) are not ours to use
                    own[name].copy_(tensor.to(own[name].dtype))
                    seen.add(name)
            missing = sorted(set(own) - seen)
            if missing:
                raise ValueError(f"drafter checkpoint lacks weights: {missing[:4]}")
            if self.shard is not None:
                self.drafter.shard(self.shard)

    return DominoDraftModel

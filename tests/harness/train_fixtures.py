"""A tiny Llama target and synthetic regenerated records for fast training tests (CPU, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 64


def make_tiny_target(path: Path) -> Path:
    """A random 4-layer Llama (hidden 32) saved as safetensors, like a prepared target."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2,
                      initializer_range=0.5)  # a frozen lm_head with room for confident logits
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return path


def make_records(path: Path, n: int = 12, length: int = 48, prompt: int = 8) -> Path:
    """Learnable sequences: x_{t+1} = x_t + stride (mod VOCAB), one stride per record."""
    with path.open("w") as f:
        for i in range(n):
            stride = 1 + i % 3
            ids = [(3 + i + stride * t) % VOCAB for t in range(length)]
            f.write(json.dumps({"id": i, "prompt_ids": ids[:prompt], "output_ids": ids[prompt:],
                                "finish": "length"}) + "\n")
    return path


def tiny_overrides(tmp: Path, **kw) -> dict:
    base = {"data": str(make_records(tmp / "data.jsonl")), "out": str(tmp / "run"),
            "target": str(make_tiny_target(tmp / "target")), "num_layers": 1, "block_size": 4,
            "num_features": 2, "gru_hidden_dim": 8, "emb_dim": 4, "steps": 6, "batch_size": 2,
            "anchors": 4, "max_seq_len": 64, "lr": 3e-3, "eval_records": 2, "eval_every": 3,
            "log_every": 3, "save_every": 3, "threads": 1, "feature_dtype": "float32"}
    base.update(kw)
    return base

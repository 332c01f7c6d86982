"""A tiny random Qwen3 target with its own word-level tokenizer and chat template, built offline.

Used by tests/server/test_train_new_target.py: a target of another architecture than SmolLM2 (Qwen3:
q/k norms, tied embeddings off), small enough for a CPU server to start in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = [f"w{i}" for i in range(250)]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


def make_tokenizer(path: Path):
    """A word-level fast tokenizer (ids: specials first, then WORDS) saved to `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", bos_token=None,
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    return tok


def make_qwen3_target(path: Path, layers: int = 4, seed: int = 0, hidden: int = 64,
                      head_dim: int = 16) -> Path:
    """A random Qwen3 (hidden 64, `layers` layers) + its tokenizer, saved as safetensors."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = make_tokenizer(path)
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=hidden // head_dim,
                      num_key_value_heads=max(1, hidden // head_dim // 2),
                      head_dim=head_dim, max_position_embeddings=1024, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, initializer_range=0.3,
                      torch_dtype="float32")
    Qwen3ForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    gen = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    (path / "generation_config.json").write_text(json.dumps(gen))
    return path


def conversations(n: int, seed: int = 0) -> list[dict]:
    """n ShareGPT-style conversations of random words (one user turn, one written answer)."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        user = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
        answer = " ".join(rng.choice(WORDS) for _ in range(8))
        out.append({"id": i, "conversations": [{"from": "human", "value": user},
                                               {"from": "gpt", "value": answer}]})
    return out

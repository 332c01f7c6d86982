"""The draft vocabulary: which tokens the drafter may propose, built from the target's answers.

The reduced draft vocabulary of EAGLE-3 (our own code): the drafter's base logits are computed
over the Vd most frequent tokens of the target's regenerated answers only, so the draft pass
reads Vd rows of the lm_head instead of V (rollout.py, `HeadParams.with_vocab`). Lossless either
way: a greedy draft outside it would only have been accepted if the target chose it, and for
sampling q is zero outside it (the residual max(p - q, 0) covers those tokens).

    draft_vocab.json (next to config.json, optional; absent = the full vocabulary)
        {"ids": [token ids, ascending], "size": Vd, "source": "...", "max_id": N}

Ascending ids make the draft vocabulary's argmax break ties as the full vocabulary's does.
A server takes another file with `--speculative-token-map PATH`, or serves the full vocabulary
even when the file is there with `--speculative-domino-draft-vocab off` (options.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from domino_sglang.model.config import DrafterConfigError

FILE = "draft_vocab.json"
MAX_BYTES = 64 << 20  # the ids of a 151k vocabulary take ~1 MB


def load_draft_vocab(folder: str | Path, vocab_size: int) -> torch.Tensor | None:
    """The draft vocabulary of the drafter in `folder` as token ids [Vd] (int64, ascending), or
    None (no file: the full vocabulary). A bad file raises, naming the field."""
    path = Path(folder) / FILE
    if not (path.exists() or path.is_symlink()):
        return None
    return load_draft_vocab_file(path, vocab_size)


def load_draft_vocab_file(path: str | Path, vocab_size: int) -> torch.Tensor:
    """A draft vocabulary file (draft_vocab.json's layout) as token ids [Vd] (int64,
    ascending); a missing or bad file raises, naming it and the field."""
    path = Path(path)
    if not path.is_file():  # a dangling link, a folder, a device (/dev/zero never ends)
        raise DrafterConfigError(f"{path}: not a regular file")
    if path.stat().st_size > MAX_BYTES:
        raise DrafterConfigError(f"{path}: {path.stat().st_size} bytes, too large for a draft "
                                 f"vocabulary (at most {MAX_BYTES})")
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DrafterConfigError(f"{path}: invalid JSON ({exc})") from exc
    ids = doc.get("ids") if isinstance(doc, dict) else None
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise DrafterConfigError(f"{path}: field 'ids' must be a non-empty list of token ids")
    if len(set(ids)) != len(ids) or not all(0 <= i < vocab_size for i in ids):
        raise DrafterConfigError(f"{path}: field 'ids' must hold distinct token ids in "
                                 f"[0, {vocab_size}) (vocab_size)")
    return torch.tensor(sorted(ids), dtype=torch.int64)


def special_token_ids(target: str | Path) -> list[int]:
    """The token ids a draft vocabulary always keeps, from the target itself: its tokenizer's
    special tokens (BOS, EOS, PAD, the chat template's role markers and every added token
    marked special) and the BOS / EOS ids of its config.json (a list for targets with several
    stop tokens); a target folder without a tokenizer gives its config's ids alone;
    ascending."""
    from transformers import AutoTokenizer

    ids: set[int] = set()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(target))
    except (OSError, ValueError):  # weights and config only: the config's ids below
        tokenizer = None
    if tokenizer is not None:
        ids.update(tokenizer.all_special_ids)
        ids.update(i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special)
    config = Path(target) / "config.json"
    if config.is_file():
        doc = json.loads(config.read_text())
        for key in ("bos_token_id", "eos_token_id"):
            value = doc.get(key)
            ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return sorted(i for i in ids if isinstance(i, int) and i >= 0)


def build_draft_vocab(data: str | Path, size: int, max_id: int | None = None,
                      skip_ids: list[int] | None = None, *, always: list[int]) -> list[int]:
    """The `size` most frequent tokens of the answers (`output_ids`) of a regenerated JSONL with
    record ids <= max_id and outside skip_ids [first, last] (ties: lower id first), plus
    `always` (special_token_ids of the target: they end turns, so the drafter must be able to
    propose them); ascending."""
    counts: Counter[int] = Counter()
    with open(data) as f:
        for line in f:
            rec = json.loads(line)
            skipped = bool(skip_ids) and skip_ids[0] <= rec["id"] <= skip_ids[1]
            if (max_id is None or rec["id"] <= max_id) and not skipped:
                counts.update(rec["output_ids"])
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    keep = set(always)
    for t in ranked:
        if len(keep) >= size:
            break
        keep.add(t)
    return sorted(keep)


def draft_vocab_text(ids: list[int], source: str, max_id: int | None) -> str:
    """The contents of a draft_vocab.json."""
    return json.dumps({"size": len(ids), "source": source, "max_id": max_id, "ids": ids}) + "\n"


def write_draft_vocab(folder: str | Path, ids: list[int], source: str,
                      max_id: int | None) -> Path:
    """Write folder/draft_vocab.json atomically (a temporary file renamed over it)."""
    path = Path(folder) / FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(draft_vocab_text(ids, source, max_id))
    tmp.replace(path)
    return path

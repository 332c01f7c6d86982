"""The draft vocabulary file: building it from answers, validation, the CLI, the off switch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from domino_sglang.model.config import DrafterConfigError
from domino_sglang.model.vocab import (
    FILE,
    build_draft_vocab,
    load_draft_vocab,
    load_draft_vocab_file,
    write_draft_vocab,
)
from domino_sglang.paths import shipped_drafter_dir


def _data(tmp_path):
    path = tmp_path / "answers.jsonl"
    rows = [{"id": 0, "prompt_ids": [9, 9, 9], "output_ids": [5, 5, 5, 7, 7, 3]},
            {"id": 1, "prompt_ids": [9], "output_ids": [7, 4, 4, 8]},
            {"id": 9, "prompt_ids": [9], "output_ids": [6, 6, 6, 6, 6, 6]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_build_keeps_the_most_frequent_answer_tokens(tmp_path):
    data = _data(tmp_path)
    # counts up to id 1: 5 x3, 7 x3, 4 x2, 3 x1, 8 x1 (prompt tokens never count); ties: lower
    # id first; the always-kept ids count towards the size
    assert build_draft_vocab(data, size=4, max_id=1, always=[1, 2]) == [1, 2, 5, 7]
    assert build_draft_vocab(data, size=5, max_id=1, always=[1, 2]) == [1, 2, 4, 5, 7]
    # record 9 counts now
    assert build_draft_vocab(data, size=3, max_id=None, always=[1, 2]) == [1, 2, 6]
    # skipping id 0 (a gap filled later) leaves 7 x1, 4 x2, 8 x1 and record 9's 6 x6
    assert build_draft_vocab(data, size=4, skip_ids=[0, 0], always=[1, 2]) == [1, 2, 4, 6]


def test_always_kept_tokens_come_from_the_target(tmp_path, target_path):
    """The tokens every draft vocabulary keeps are the target's own special tokens (its
    tokenizer's, its config's BOS / EOS), never one model's constants."""
    from domino_sglang.model.vocab import special_token_ids

    other = tmp_path / "other-target"  # weights and config only: the config's ids
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"bos_token_id": 3, "eos_token_id": [8, 6]}))
    assert special_token_ids(other) == [3, 6, 8]
    assert build_draft_vocab(_data(tmp_path), size=4, max_id=1,
                             always=special_token_ids(other)) == [3, 5, 6, 8]
    smol = special_token_ids(target_path)  # SmolLM2: <|endoftext|>, <|im_start|>, <|im_end|>, ...
    assert {0, 1, 2} <= set(smol) and len(smol) < 100


def test_write_then_load_round_trips_sorted(tmp_path):
    write_draft_vocab(tmp_path, [7, 1, 2, 5], source="x", max_id=3)
    assert load_draft_vocab(tmp_path, vocab_size=10).tolist() == [1, 2, 5, 7]
    assert not (tmp_path / (FILE + ".tmp")).exists()
    assert load_draft_vocab(tmp_path / "elsewhere", vocab_size=10) is None  # no file: all V


@pytest.mark.parametrize("doc, needle", [
    ("{not json", "invalid JSON"),
    (json.dumps({"ids": []}), "non-empty list"),
    (json.dumps({"ids": [1, "2"]}), "non-empty list"),
    (json.dumps([1, 2]), "non-empty list"),
    (json.dumps({"ids": [1, 1]}), "distinct"),
    (json.dumps({"ids": [1, 10]}), "[0, 10)"),
])
def test_a_bad_file_is_refused_naming_the_field(tmp_path, doc, needle):
    (tmp_path / FILE).write_text(doc)
    with pytest.raises(DrafterConfigError) as err:
        load_draft_vocab(tmp_path, vocab_size=10)
    assert needle in str(err.value) and FILE in str(err.value)


def test_a_token_map_file_is_read_or_refused(tmp_path):
    """--speculative-token-map names a draft_vocab.json directly (options.py)."""
    path = write_draft_vocab(tmp_path, [7, 1, 2], source="x", max_id=None)
    assert load_draft_vocab_file(path, vocab_size=10).tolist() == [1, 2, 7]
    with pytest.raises(DrafterConfigError, match="not a regular file"):
        load_draft_vocab_file(tmp_path / "missing.json", vocab_size=10)


def test_shipped_drafter_has_a_valid_draft_vocabulary():
    vocab = load_draft_vocab(shipped_drafter_dir(), vocab_size=49152)
    assert vocab is not None and len(vocab) == 8192
    assert {1, 2} <= set(vocab.tolist())


def test_cli_writes_the_file_and_rejects_bad_input(tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text((shipped_drafter_dir() / "config.json").read_text())
    target = tmp_path / "target"  # its special tokens: BOS 1, EOS 2
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    cli = [sys.executable, "-m", "domino_sglang.cli", "draft-vocab", str(drafter)]
    ok = subprocess.run([*cli, "--data", str(_data(tmp_path)), "--size", "3", "--target",
                         str(target)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads((drafter / FILE).read_text())["ids"] == [1, 2, 6]
    bad = subprocess.run([*cli, "--data", str(tmp_path / "missing.jsonl")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--data" in bad.stderr and len(bad.stderr.splitlines()) == 1

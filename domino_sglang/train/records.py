"""The records a run trains on: loading them, the data order of every step, anchor sampling.

Records are {"id", "ids" (prompt + response, truncated), "start" (response)}, read from a
regenerated JSONL or from conversations tokenised once into the run folder (`prepare_data`).
The data order and the anchors of step t are functions of (seed, t, rank) only, which is what
makes a resumed run equal an uninterrupted one. Depends on config.py, regenerate.py and
conversations.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from domino_sglang.train.config import TrainConfigError


def load_records(path: str | Path, max_seq_len: int, max_id: int = -1,
                 skip_ids: list[int] | None = None) -> list[dict]:
    """Regenerated records as {"id", "ids" (prompt+response, truncated), "start" (response)},
    by id, only those with id <= max_id unless max_id is -1, and none in skip_ids [first, last]."""
    from domino_sglang.train.regenerate import read_records

    out = []
    for rec in read_records(Path(path)):
        ids = (list(rec["prompt_ids"]) + list(rec["output_ids"]))[:max_seq_len]
        start = len(rec["prompt_ids"])
        if max_id >= 0 and int(rec["id"]) > max_id:
            continue
        if skip_ids and skip_ids[0] <= int(rec["id"]) <= skip_ids[1]:
            continue
        if len(ids) - start >= 2:  # at least one anchor with one label
            out.append({"id": int(rec["id"]), "ids": ids, "start": start})
    out.sort(key=lambda r: r["id"])
    if not out:
        raise TrainConfigError(f"train: {path} has no usable records")
    return out


def load_extra_records(paths: list[str], max_seq_len: int, distill: float,
                       taken: set[int]) -> list[dict]:
    """The records of `extra_data` (as load_records, all of them); ids must be new to `taken`.
    The dataset's own answers (ids from SOURCE_ID_BASE["sharegpt-answers"]) are not the
    target's, so their greedy labels would be wrong: they need distill = 1."""
    from domino_sglang.train.regenerate import SOURCE_ID_BASE

    out: list[dict] = []
    for path in paths:
        if not Path(path).is_file():
            raise TrainConfigError(f"train: extra_data {path} not found")
        recs = load_records(path, max_seq_len)
        clash = next((r["id"] for r in recs if r["id"] in taken), None)
        if clash is not None:
            raise TrainConfigError(f"train: extra_data {path}: record id {clash} is already in "
                                   f"the training data")
        if distill < 1 and any(r["id"] >= SOURCE_ID_BASE["sharegpt-answers"] for r in recs):
            raise TrainConfigError(f"train: extra_data {path} holds the dataset's own answers "
                                   f"(ids >= {SOURCE_ID_BASE['sharegpt-answers']}), which need "
                                   f"'distill' = 1, got {distill}")
        taken |= {r["id"] for r in recs}
        out += recs
    return out


def epoch_pool(records: list[dict], oversample: list[int]) -> list[int]:
    """The record indices one epoch covers: each once, and those with ids in first..last of
    `oversample` = [first, last, factor] `factor` times ([]: range(len(records)))."""
    if not oversample:
        return list(range(len(records)))
    first, last, factor = oversample
    return [i for i, r in enumerate(records)
            for _ in range(factor if first <= r["id"] <= last else 1)]


def step_records(n_records: int, step: int, batch: int, rank: int, world: int, seed: int
                 ) -> list[int]:
    """Indices of this rank's records at `step`: epoch-wise permutations, a pure function."""
    per_step = batch * world
    first = step * per_step + rank * batch
    out = []
    for g in range(first, first + batch):
        epoch, offset = divmod(g, n_records)
        perm = torch.randperm(n_records, generator=torch.Generator().manual_seed(seed + epoch))
        out.append(int(perm[offset]))
    return out


def sample_anchors(start: int, length: int, count: int, generator: torch.Generator
                   ) -> list[int]:
    """`count` distinct anchors a in [start, length-2] (fewer if the response is short)."""
    choices = length - 1 - start
    pick = torch.randperm(choices, generator=generator)[: min(count, choices)]
    return sorted(int(start + i) for i in pick)


def sample_block_anchors(start: int, length: int, full: int, first: int,
                         generator: torch.Generator) -> tuple[list[int], list[int]]:
    """(full-block anchors, first-draft-only anchors): distinct, `full` of them chosen first so
    a short response keeps its full blocks; with first = 0 exactly `sample_anchors`."""
    choices = length - 1 - start
    pick = torch.randperm(choices, generator=generator)[: min(full + first, choices)]
    pick = [int(start + i) for i in pick]
    return sorted(pick[:full]), sorted(pick[full:])


def sample_draft_lengths(n: int, block_size: int, short_frac: float,
                         generator: torch.Generator) -> torch.Tensor:
    """[n] draft lengths: block_size, or with probability short_frac uniform in 2..B-1."""
    short = torch.rand(n, generator=generator) < short_frac
    lengths = torch.randint(2, block_size, (n,), generator=generator)
    return torch.where(short, lengths, torch.full_like(lengths, block_size))


def prepare_data(data: Path, target: Path, out: Path, max_seq_len: int, rank: int = 0,
                 world: int = 1, chat_template: str = "") -> tuple[Path, bool]:
    """(records file, off_policy): a regenerated JSONL as is; conversations (conversations.py)
    tokenised with the target's chat template into out/data-as-written.jsonl (rank 0 writes
    it, once), to be trained on as written: off-policy."""
    from domino_sglang.train.conversations import (
        ConversationError,
        is_records_file,
        read_conversations,
        written_records,
    )

    if not data.is_file():
        raise TrainConfigError(f"train: data {data} not found")
    try:
        if is_records_file(data):
            return data, False
        dest = out / "data-as-written.jsonl"
        if rank == 0 and not dest.exists():
            from domino_sglang.train.regenerate import chat_tokenizer

            try:
                tokenizer = chat_tokenizer(target, Path(chat_template) if chat_template
                                           else None)
            except ValueError as exc:
                raise TrainConfigError(f"train: {exc}") from exc
            records = written_records(read_conversations(data), tokenizer, max_seq_len)
            if not records:
                raise TrainConfigError(f"train: {data} has no conversation ending with an "
                                       "assistant answer")
            tmp = dest.with_suffix(".partial")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
            tmp.replace(dest)
    except ConversationError as exc:
        raise TrainConfigError(f"train: {exc}") from exc
    if world > 1:
        torch.distributed.barrier()
    return dest, True

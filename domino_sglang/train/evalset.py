"""The target's greedy answers to evaluation prompts (MT-Bench, HumanEval, GSM8K) as training-style
records, for measuring drafters offline on answers none of them trained on (the replay of
benchmarks/compare_drafters.py and the offline studies). Depends on prompt_sets.py,
regenerate.py and records.load_records; a plain server answers only what it lacks (the caller's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def eval_records(name: str, limit: int, max_tokens: int, url: str | None, max_seq_len: int,
                 cache_dir: Path, snapshots: Path | None = None,
                 start_server: Callable | None = None) -> list[dict]:
    """The target's greedy answers to the first `limit` prompts of evaluation set `name`, as
    {"id", "ids", "start"} records (records.load_records), cached in
    cache_dir/eval-NAME-greedyN.jsonl.

    Answers kept in git (`snapshots`/eval-NAME-greedyN.jsonl.gz, regenerate.py "Snapshot") come
    first: a batched bf16 server's greedy answers differ from machine to machine, and so does
    the acceptance measured on them, so figures compare across sessions only on the same
    answers. Prompts they lack are answered by a plain server (`url`,
    or one from `start_server(name, serve_args, sglang_args)`, a context manager yielding a
    server with a `url`: cli/local_server.py's, in a checkout). An answer cached for another
    prompt (the set or the chat template changed) raises ValueError naming the file."""
    from transformers import AutoTokenizer

    from domino_sglang.paths import target_dir
    from domino_sglang.train import prompt_sets
    from domino_sglang.train.records import load_records
    from domino_sglang.train.regenerate import (
        RegenConfig,
        chat_prompt_ids,
        read_records,
        recover,
        regenerate,
        restore_snapshot,
    )

    tok = AutoTokenizer.from_pretrained(str(target_dir()))
    items = [(i, chat_prompt_ids(tok, p)) for i, p in enumerate(prompt_sets.load(name, limit))]
    out = Path(cache_dir) / f"eval-{name}-greedy{max_tokens}.jsonl"
    snapshot = None if snapshots is None else Path(snapshots) / f"{out.name}.gz"
    if snapshot is not None and snapshot.exists():
        restore_snapshot(snapshot, out)
    done = recover(out)
    todo = [item for item in items if item[0] not in done]
    conf = RegenConfig(max_new_tokens=max_tokens, concurrency=max(1, min(32, len(todo))))
    if todo and url:
        regenerate(url.rstrip("/"), todo, out, conf, progress=False)
    elif todo:
        if start_server is None:
            raise ValueError(f"{len(todo)} {name} answers are missing from {out} and neither a "
                             "url nor a way to start a server was given")
        serve = ["--no-speculation", "--model-path", str(target_dir())]
        with start_server("eval-answers", serve, []) as server:
            regenerate(server.url, todo, out, conf, progress=False)
    cached = {r["id"]: r["prompt_ids"] for r in read_records(out)}
    for i, prompt_ids in items:
        if cached[i] != prompt_ids:
            raise ValueError(f"{out}: answer {i} was generated for another prompt than {name}'s "
                             f"prompt {i} (delete the file to regenerate)")
    return [r for r in load_records(out, max_seq_len) if r["id"] < limit]

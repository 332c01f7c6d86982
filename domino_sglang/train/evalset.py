"""The target's greedy answers to evaluation prompts (MT-Bench, HumanEval, GSM8K) as training-style
records, for measuring drafters offline on answers none of them trained on (the replay of
benchmarks/compare_drafters.py and the offline studies). Depends on data.py, regenerate.py and
trainer.load_records; starts a plain server (local_server) only for answers it lacks."""

from __future__ import annotations

from pathlib import Path


def eval_records(name: str, limit: int, max_tokens: int, url: str | None, max_seq_len: int,
                 cache_dir: Path, snapshots: Path | None = None) -> list[dict]:
    """The target's greedy answers to the first `limit` prompts of evaluation set `name`, as
    {"id", "ids", "start"} records (trainer.load_records), cached in
    cache_dir/eval-NAME-greedyN.jsonl.

    Answers kept in git (`snapshots`/eval-NAME-greedyN.jsonl.gz, regenerate.py "Snapshot") come
    first: a batched bf16 server's greedy answers differ from machine to machine, and so does
    the acceptance measured on them, so figures compare across sessions only on the same
    answers. Prompts they lack are answered by a plain server (`url`,
    or one started here from a checkout). An answer cached for another prompt (the set or the
    chat template changed) raises ValueError naming the file."""
    from transformers import AutoTokenizer

    from domino_sglang import data
    from domino_sglang.paths import target_dir
    from domino_sglang.train.regenerate import (
        RegenConfig,
        chat_prompt_ids,
        read_records,
        recover,
        regenerate,
        restore_snapshot,
    )
    from domino_sglang.train.trainer import load_records

    tok = AutoTokenizer.from_pretrained(str(target_dir()))
    items = [(i, chat_prompt_ids(tok, p)) for i, p in enumerate(data.load(name, limit))]
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
        try:
            from domino_sglang.local_server import start_server
        except ImportError as exc:
            raise ValueError(f"{len(todo)} {name} answers are missing from {out} and no url was "
                             "given (domino_sglang/local_server.py, which starts a server, is "
                             "not in the wheel)") from exc
        serve = ["--no-speculation", "--model-path", str(target_dir())]
        with start_server("eval-answers", serve, []) as server:
            regenerate(server.url, todo, out, conf, progress=False)
    cached = {r["id"]: r["prompt_ids"] for r in read_records(out)}
    for i, prompt_ids in items:
        if cached[i] != prompt_ids:
            raise ValueError(f"{out}: answer {i} was generated for another prompt than {name}'s "
                             f"prompt {i} (delete the file to regenerate)")
    return [r for r in load_records(out, max_seq_len) if r["id"] < limit]

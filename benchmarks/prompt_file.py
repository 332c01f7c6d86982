"""Prompts for the load test from a JSONL file (`--prompts`): one {"prompt": str} or
{"messages": [...]} per line, the format `python -m sglang.benchmark.serving --dataset-name openai`
reads too (its extra keys, e.g. max_tokens, are ignored here). No locust import: loadtest.py
checks the file before it starts locust (whose gevent patching must come first there)."""

from __future__ import annotations

import json
from pathlib import Path


def load_prompt_file(path: str | Path) -> list[list[dict]]:
    """Chat messages from a JSONL file; a clear error naming the line that is not a prompt."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from e
            if isinstance(rec, dict) and isinstance(rec.get("prompt"), str):
                out.append([{"role": "user", "content": rec["prompt"]}])
            elif isinstance(rec, dict) and isinstance(rec.get("messages"), list) \
                    and rec["messages"]:
                out.append(rec["messages"])
            else:
                raise ValueError(f"{path}:{n}: expected {{'prompt': str}} or "
                                 "{'messages': [...]}")
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out

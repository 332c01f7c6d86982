"""HTTP helpers of the reliability suite: authenticated requests, /metrics, the idle KV check."""

from __future__ import annotations

import time

import requests

from domino_sglang.cli.local_server import sse_chunks

API_KEY = "domino-reliability-test-key-7d1f"  # a test value, not a secret
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ADMIN_KEY = "domino-reliability-admin-key-42c9"  # a test value, not a secret
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
POOL = 2048  # KV pool of the shared server, in tokens (--max-total-tokens)
TIMEOUT = 900


def generate(url: str, ids: list[int], max_new_tokens: int, headers: dict | None = None,
             **params) -> dict:
    """Native /generate over token ids, greedy unless `params` say otherwise."""
    body = {"input_ids": ids, "sampling_params": {"temperature": 0,
                                                  "max_new_tokens": max_new_tokens, **params}}
    r = requests.post(f"{url}/generate", json=body, headers=headers or {}, timeout=TIMEOUT)
    r.raise_for_status()
    return r.json()


def chat(url: str, prompt: str, max_tokens: int, headers: dict | None = None,
         stream: bool = False, **fields) -> dict:
    """OpenAI chat completion; streamed ones are reassembled into {content, finish_reason,
    completion_tokens, chunks}."""
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, **fields}
    if not stream:
        r = requests.post(f"{url}/v1/chat/completions", json=body, headers=headers or {},
                          timeout=TIMEOUT)
        r.raise_for_status()
        out = r.json()
        return {"content": out["choices"][0]["message"]["content"],
                "finish_reason": out["choices"][0]["finish_reason"],
                "completion_tokens": out["usage"]["completion_tokens"]}
    body.update(stream=True, stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    with requests.post(f"{url}/v1/chat/completions", json=body, headers=headers or {},
                       stream=True, timeout=TIMEOUT) as r:
        r.raise_for_status()
        for chunk in sse_chunks(r):
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                if choice["delta"].get("content"):
                    pieces.append(choice["delta"]["content"])
                finish = choice.get("finish_reason") or finish
    return {"content": "".join(pieces), "finish_reason": finish, "completion_tokens": usage,
            "chunks": len(pieces)}


def metrics(url: str) -> dict[str, float]:
    """/metrics (open even with --api-key), each series summed over its label sets."""
    totals: dict[str, float] = {}
    for line in requests.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("{", 1)[0].split(" ", 1)[0], line.rsplit(" ", 1)[1]
            totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def labelled(url: str, name: str, **labels: str) -> float:
    """Sum of series `name` whose labels include `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in requests.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_idle(url: str, timeout: float = 120.0) -> dict[str, float]:
    """Wait until nothing runs or queues and no KV token is in use; return the metrics then.

    Idle means kv_used_tokens == 0 and every slot of the pool is free or held by the radix
    cache (evictable): available + evictable == max_total_num_tokens. The draft KV shares the
    target's slot allocator, so this covers both pools."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        idle = (m["sglang:num_running_reqs"] == 0 and m["sglang:num_queue_reqs"] == 0
                and m["sglang:kv_used_tokens"] == 0
                and m["sglang:kv_available_tokens"] + m["sglang:kv_evictable_tokens"]
                == m["sglang:max_total_num_tokens"])
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(1.0)


def assert_idle(server, timeout: float = 120.0) -> None:
    m = wait_idle(server.url, timeout)
    assert m["sglang:num_running_reqs"] == 0 and m["sglang:num_queue_reqs"] == 0, m
    assert m["sglang:kv_used_tokens"] == 0, m["sglang:kv_used_tokens"]
    assert (m["sglang:kv_available_tokens"] + m["sglang:kv_evictable_tokens"]
            == m["sglang:max_total_num_tokens"]), m
    assert requests.get(f"{server.url}/health", timeout=60).status_code == 200
    log = server.log()
    for sign in ("leak detected", "double free", "use-after-free", "Scheduler hit an exception",
                 "Out of memory"):
        assert sign not in log, f"{sign!r} in the server log"

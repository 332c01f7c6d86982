"""A bounded soak of the shared DOMINO server: SOAK_REQUESTS requests (default 100) at
concurrency 8, a third greedy, a third sampled (temperature 0.8, top-p 0.95, seeded), a third
streamed, prompts and lengths rotating. Zero errors; the scheduler's RSS grows by less than
RSS_BOUND_MB after warm-up; SGLang's request counters equal the requests sent; KV idle after.
`make test-fast` skips it (marker `soak`); DOMINO_SOAK_REQUESTS scales it.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from tests.conftest import PROMPTS
from tests.reliability.client import AUTH, assert_idle, chat, labelled, metrics

pytestmark = [pytest.mark.server, pytest.mark.soak]
SOAK_REQUESTS = int(os.environ.get("DOMINO_SOAK_REQUESTS", "100"))
RSS_BOUND_MB = 64


def scheduler_rss(server) -> int:
    procs = psutil.Process(server.proc.pid).children(recursive=True)
    rss = [p.memory_info().rss for p in procs if "scheduler" in " ".join(p.cmdline()) +
           p.name()]
    assert len(rss) == 1, [p.name() for p in procs]
    return rss[0]


def one(url: str, i: int) -> dict:
    prompt, tokens = PROMPTS[i % len(PROMPTS)], 8 + (i * 7) % 17
    if i % 3 == 0:
        return chat(url, prompt, tokens, AUTH)
    if i % 3 == 1:
        return chat(url, prompt, tokens, AUTH, temperature=0.8, top_p=0.95, seed=i)
    return chat(url, prompt, tokens, AUTH, stream=True)


def test_soak(rel_server):
    url = rel_server.url
    with ThreadPoolExecutor(8) as pool:  # warm-up: allocator and caches reach their steady size
        list(pool.map(lambda i: one(url, i), range(24)))
    assert_idle(rel_server)
    time.sleep(3.0)  # HTTP counters are bumped after the responses are sent
    rss0, before = scheduler_rss(rel_server), metrics(url)
    chat_ok0 = labelled(url, "sglang:http_responses_total", endpoint="/v1/chat/completions",
                        status_code="200")
    start = time.monotonic()
    errors = []

    def guarded(i):
        try:
            out = one(url, i)
            assert out["finish_reason"] in ("stop", "length") and out["completion_tokens"] >= 1
        except Exception as exc:  # counted, not raised: the soak reports every failure
            errors.append(f"{i}: {exc!r}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(guarded, range(SOAK_REQUESTS)))
    elapsed = time.monotonic() - start
    assert_idle(rel_server)
    after, rss1 = metrics(url), scheduler_rss(rel_server)
    growth_mb = (rss1 - rss0) / 2**20
    counted = after["sglang:num_requests_total"] - before["sglang:num_requests_total"]
    deadline = time.monotonic() + 30  # the HTTP counter is bumped after the response is sent
    while True:
        chat_ok = labelled(url, "sglang:http_responses_total", endpoint="/v1/chat/completions",
                           status_code="200") - chat_ok0
        if chat_ok >= SOAK_REQUESTS or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    print(f"\nsoak: {SOAK_REQUESTS} requests in {elapsed:.0f} s, {len(errors)} errors, "
          f"scheduler RSS {rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MB ({growth_mb:+.1f} MB), "
          f"counted {counted:.0f}, chat 200s {chat_ok:.0f}, DOMINO rounds "
          f"{after['domino_verify_rounds_total'] - before['domino_verify_rounds_total']:.0f}")
    assert not errors, errors[:5]
    assert counted == SOAK_REQUESTS and chat_ok == SOAK_REQUESTS
    assert after["domino_verify_rounds_total"] > before["domino_verify_rounds_total"]
    assert growth_mb < RSS_BOUND_MB

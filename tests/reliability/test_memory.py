"""Memory pressure on the shared DOMINO server (a 2048-token KV pool): a burst of long requests
needs ~1.3x the pool, so requests queue and running ones are retracted and recomputed; every one
completes with exactly its no-speculation output. A request that grows to the pool's size ends
`length` (clipped by algorithm.clip_max_new_tokens) instead of being aborted with a 500.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.reliability.client import AUTH, POOL, assert_idle
from tests.reliability.workload import BLOCK, TAIL_OUTPUT, burst_jobs, comparable, run, tail_job

pytestmark = pytest.mark.server


def test_burst_of_long_requests_is_lossless_under_retraction(references, rel_server, tokenizer):
    jobs = burst_jobs(tokenizer)
    need = sum(len(j["ids"]) + j["max_tokens"] + 2 * BLOCK for j in jobs)
    assert need > 1.25 * POOL  # the burst cannot fit at once
    log_start = len(rel_server.log())
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda j: run(rel_server.url, j, AUTH), jobs))
    assert [comparable(g) for g in got] == [references[f"burst/{i}"] for i in range(len(jobs))]
    assert all(len(g["ids"]) == 64 for g in got)
    log = rel_server.log()[log_start:]
    queued = max((int(x.split("#queue-req: ")[1].split(",")[0]) for x in log.splitlines()
                  if "#queue-req: " in x), default=0)
    retracted = log.count("Retract requests")
    print(f"\nburst: {len(jobs)} requests, {need} tokens into a {POOL}-token pool, "
          f"max queue {queued}, retractions {retracted}")
    assert queued > 0 or retracted > 0
    assert "Out of memory" not in log and "aborted" not in log
    assert_idle(rel_server)


def test_request_growing_to_the_pool_size_ends_length_not_500(references, rel_server, tokenizer):
    got = run(rel_server.url, tail_job(tokenizer), AUTH)
    ref = references["tail"]
    assert got["finish"] == "length" and len(got["ids"]) == TAIL_OUTPUT
    assert got["ids"] == ref["ids"][:TAIL_OUTPUT]  # plain decoding gets 8 more: the cost
    assert_idle(rel_server)

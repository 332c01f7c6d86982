"""Memory pressure on the shared DOMINO server (a 2048-token KV pool): a burst of long requests
needs ~1.3x the pool, so requests queue; every one completes with exactly its no-speculation
output. SGLang's admission control is conservative enough that this burst queues rather than
retracts, so retraction is forced on a second server through SGLang's own test hook
(SGLANG_TEST_RETRACT: every few forward steps the scheduler retracts running requests exactly as
on a full pool: KV freed, request re-queued, prompt + output so far prefilled again, which
rebuilds its draft KV). A request that grows to the pool's size ends `length` (clipped by
algorithm.clip_max_new_tokens) instead of being aborted with a 500.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.harness.servers import start_server
from tests.reliability.client import API_KEY, AUTH, POOL, assert_idle
from tests.reliability.workload import (
    BLOCK,
    CAT,
    TAIL_OUTPUT,
    burst_jobs,
    comparable,
    load_jobs,
    run,
    tail_job,
)

pytestmark = pytest.mark.server


def test_burst_of_long_requests_is_lossless_when_queued(references, rel_server, tokenizer):
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


@pytest.fixture(scope="module")
def retracting_server(rel_drafter, references):
    """The shared server's configuration, plus retraction forced every 2 forward steps (at 4,
    the shipped drafter's long accepted blocks left too few steps: 12 of 28 requests retracted)."""
    with start_server(
            "retracting", ["--dtype", "float32", "--max-total-tokens", str(POOL),
                           "--api-key", API_KEY],
            ["--speculative-algorithm", "DOMINO",
             "--speculative-draft-model-path", str(rel_drafter),
             "--speculative-domino-adaptive", "off"],
            env={"SGLANG_TEST_RETRACT": "1",
                 "SGLANG_TEST_RETRACT_INTERVAL": "2"}) as server:
        yield server


def test_retracted_requests_resume_losslessly(references, retracting_server, tokenizer):
    # the burst (rejected drafts) and the repetitive load jobs (accepted blocks, stop strings
    # and max_tokens inside them), all at once
    jobs = {f"burst/{i}": j for i, j in enumerate(burst_jobs(tokenizer))}
    jobs.update({f"load/{i}": j for i, j in enumerate(load_jobs(tokenizer))
                 if j.get("ids") == tokenizer(CAT).input_ids})
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = dict(zip(jobs, pool.map(lambda j: run(retracting_server.url, j, AUTH),
                                      jobs.values())))
    mismatches = [k for k, g in got.items() if comparable(g) != references[k]]
    assert not mismatches, mismatches
    log = retracting_server.log()
    retractions = [int(x.split("#retracted_reqs: ")[1].split(",")[0])
                   for x in log.splitlines() if "Testing retraction" in x]
    print(f"\nforced retraction: {len(jobs)} requests, {len(retractions)} retraction steps, "
          f"{sum(retractions)} requests retracted")
    assert sum(retractions) >= len(jobs) // 2
    assert_idle(retracting_server)


def test_request_growing_to_the_pool_size_ends_length_not_500(references, rel_server, tokenizer):
    got = run(rel_server.url, tail_job(tokenizer), AUTH)
    ref = references["tail"]
    assert got["finish"] == "length" and len(got["ids"]) == TAIL_OUTPUT
    assert got["ids"] == ref["ids"][:TAIL_OUTPUT]  # plain decoding gets 8 more: the cost
    assert_idle(rel_server)

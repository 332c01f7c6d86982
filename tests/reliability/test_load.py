"""Lossless under load: 64 concurrent greedy requests on the shared DOMINO server return exactly
what the same target returns without speculation (float32), with nothing duplicated, dropped or
cut, while the small KV pool makes them queue.

The mix (workload.load_jobs, 8 kinds x 8): chat and native /generate, streamed and not; output
lengths from 1 to 64 tokens; stop strings; repetitive prompts on which the repeat drafter's
blocks are accepted, so max_tokens cuts and stop strings land inside accepted blocks; chat
answers that end with EOS.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.reliability.client import AUTH
from tests.reliability.workload import CAT, RUNS, comparable, load_jobs, run

pytestmark = pytest.mark.server


def test_64_concurrent_greedy_requests_are_lossless(references, rel_server, tokenizer):
    jobs = load_jobs(tokenizer)
    log_start = len(rel_server.log())
    with ThreadPoolExecutor(64) as pool:
        got = list(pool.map(lambda j: run(rel_server.url, j, AUTH), jobs))
    mismatches = [(i, jobs[i], comparable(g), references[f"load/{i}"])
                  for i, g in enumerate(got) if comparable(g) != references[f"load/{i}"]]
    assert not mismatches, mismatches[:3]
    # the mix covered what it claims
    finishes = [g.get("finish") or g.get("finish_reason") for g in got]
    assert finishes.count("length") >= 8 and finishes.count("stop") >= 8
    assert all(g["finish_reason"] == "stop" for j, g in zip(jobs, got)
               if j.get("prompt") in RUNS)  # ended by EOS, not by the limit
    cat = tokenizer(CAT).input_ids
    cat_meta = [g["meta"] for j, g in zip(jobs, got) if j.get("ids") == cat]
    tau = (sum(m["completion_tokens"] for m in cat_meta)
           / sum(m["spec_verify_ct"] for m in cat_meta))
    assert tau >= 2.0  # blocks were accepted on the repetitive prompts
    assert all(g["chunks"] >= 2 for j, g in zip(jobs, got)
               if j["kind"] == "stream" and g["completion_tokens"] >= 4)
    log = rel_server.log()[log_start:]
    queued = max((int(x.split("#queue-req: ")[1].split(",")[0]) for x in log.splitlines()
                  if "#queue-req: " in x), default=0)
    print(f"\nload: 64 requests, tau {tau:.2f} on the repetitive ones, max queue {queued}, "
          f"retractions {log.count('Retract requests')}")
    assert queued > 0  # 64 requests, 48 running slots, a 2048-token pool: some had to wait

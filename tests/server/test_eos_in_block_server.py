"""EOS (and a request's stop token) inside an accepted block, under load: a drafter that
proposes EOS at every position (tests/harness/drafters.py:make_eos_drafter) is accepted exactly
where the target ends its answer, so the round that commits EOS also commits tokens after it (later
drafts or the bonus token), which must never reach the client. 32 concurrent greedy requests
(short answers that end with EOS, long ones cut by max_tokens, half of them streamed) must equal
plain decoding token for token. The same drafter proposing '.' does this for stop_token_ids.

Its own small servers (fixed block, float32, B = 4, the drafter's own drafts only: the counts
below assume every accepted draft is the drafter's; copied drafts, lookup.py, are exercised under
load on the shared reliability server); references from `ar_server_fp32`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from domino_sglang.cli.local_server import sse_chunks
from tests.harness.drafters import make_eos_drafter
from tests.harness.servers import start_server

pytestmark = pytest.mark.server

SHORT = [  # greedy answers that end with EOS well inside the token budget
    "Reply with one word: what colour is the sky on a clear day?",
    "What is 2 + 2? Answer with the number only.",
    "Say hello.",
    "Is water wet? Answer yes or no.",
    "Name the capital of Italy in one word.",
    "Reply with OK.",
    "What is the opposite of hot? One word.",
    "Give me a synonym for happy. One word only.",
]
LONG = [  # answers the budget cuts
    "Write a long story about a dragon who learns to cook.",
    "Explain how a car engine works in detail.",
]


@pytest.fixture  # one test each: not kept beside the next test's server
def eos_server(target_path, tmp_path_factory):
    drafter = make_eos_drafter(target_path, tmp_path_factory.mktemp("eos") / "eos4", 4)
    with start_server("domino-eos", ["--dtype", "float32", "--max-total-tokens", "8192"],
                      ["--speculative-algorithm", "DOMINO",
                       "--speculative-draft-model-path", str(drafter),
                       "--speculative-domino-adaptive", "off",
                       "--speculative-domino-lookup", "off"]) as server:
        yield server


def _jobs(tokenizer) -> list[tuple[list[int], int, bool]]:
    """(chat-templated prompt ids, max_new_tokens, stream) x 32."""
    prompts = (SHORT * 3)[:24] + LONG * 4
    jobs = []
    for i, p in enumerate(prompts):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                            add_generation_prompt=True, return_dict=False)
        jobs.append((ids, 48 if p in SHORT else 24 + i % 5, i % 2 == 1))
    return jobs


def _run(url: str, job: tuple[list[int], int, bool], params: dict | None = None
         ) -> tuple[list[int], str]:
    """(output ids, finish type) through /generate, streamed or not."""
    ids, max_new, stream = job
    body = {"input_ids": ids, "stream": stream,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new, **(params or {})}}
    r = requests.post(f"{url}/generate", json=body, stream=stream, timeout=900)
    r.raise_for_status()
    if not stream:
        out = r.json()
        return out["output_ids"], out["meta_info"]["finish_reason"]["type"]
    last = list(sse_chunks(r))[-1]
    # SGLang streams cumulative output_ids on /generate unless incremental output is on
    return last["output_ids"], last["meta_info"]["finish_reason"]["type"]


def _accepted(url: str) -> float:
    total = 0.0
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("domino_draft_tokens_accepted_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_eos_inside_accepted_blocks_is_lossless(eos_server, ar_server_fp32, tokenizer):
    jobs = _jobs(tokenizer)
    with ThreadPoolExecutor(16) as pool:
        reference = list(pool.map(lambda j: _run(ar_server_fp32.url, j), jobs))
    before = _accepted(eos_server.url)
    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda j: _run(eos_server.url, j), jobs))
    accepted = _accepted(eos_server.url) - before
    mismatches = [(i, g, r) for i, (g, r) in enumerate(zip(got, reference)) if g != r]
    assert not mismatches, mismatches[:3]
    ended_by_eos = sum(finish == "stop" for _, finish in reference)
    print(f"\n{ended_by_eos} of {len(jobs)} answers ended by EOS; {accepted:.0f} drafts accepted")
    assert ended_by_eos >= 16 and sum(f == "length" for _, f in reference) >= 8
    # Every accepted draft is an EOS (the drafter proposes nothing else), and each answer that
    # ended by EOS ended on an accepted one: the EOS sat inside an accepted block.
    assert ended_by_eos <= accepted <= ended_by_eos * 3


@pytest.fixture
def period_server(target_path, tokenizer, tmp_path_factory):
    period = tokenizer.convert_tokens_to_ids(".")
    drafter = make_eos_drafter(target_path, tmp_path_factory.mktemp("period") / "period4", 4,
                               token=period)
    with start_server("domino-period", ["--dtype", "float32", "--max-total-tokens", "8192"],
                      ["--speculative-algorithm", "DOMINO",
                       "--speculative-draft-model-path", str(drafter),
                       "--speculative-domino-adaptive", "off",
                       "--speculative-domino-lookup", "off"]) as server:
        yield server


def test_stop_token_ids_inside_accepted_blocks_are_lossless(period_server, ar_server_fp32,
                                                            tokenizer):
    """The same with a request's own stop token: the drafter proposes '.' everywhere, requests
    stop at '.' (stop_token_ids), so a draft is accepted exactly at the first sentence end and
    the round's later tokens must be dropped."""
    period = tokenizer.convert_tokens_to_ids(".")
    params = {"stop_token_ids": [period]}
    jobs = _jobs(tokenizer)[::2]  # 16: short answers and budget-cut long ones, half streamed
    with ThreadPoolExecutor(16) as pool:
        reference = list(pool.map(lambda j: _run(ar_server_fp32.url, j, params), jobs))
    before = _accepted(period_server.url)
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda j: _run(period_server.url, j, params), jobs))
    accepted = _accepted(period_server.url) - before
    mismatches = [(i, g, r) for i, (g, r) in enumerate(zip(got, reference)) if g != r]
    assert not mismatches, mismatches[:3]
    at_period = sum(f == "stop" and ids[-1] == period for ids, f in reference)
    print(f"\n{at_period} of {len(jobs)} answers stopped at '.'; {accepted:.0f} drafts accepted")
    # every accepted draft is a '.', and a request stops at its first one: each stopped answer
    # accepted at most one draft, and enough of them did for the test to have teeth
    assert at_period >= 8 and 4 <= accepted <= at_period

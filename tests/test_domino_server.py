"""DOMINO inside the real SGLang server on CPU: lossless greedy output, acceptance counted right.

Reference = the same target served WITHOUT speculation (float32, `ar_server_fp32`). A randomly
initialised drafter exercises every accept length (mostly 1); the constructed repeat drafter
(tests/drafters.py) is accepted on a repetitive prompt, proving the accept/commit path counts
and commits multi-token rounds correctly.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from domino_sglang.local_server import sse_chunks, start_server
from tests.conftest import PROMPTS
from tests.drafters import make_random_drafter, make_repeat_drafter

pytestmark = pytest.mark.server
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def random_drafter(target_path, tmp_path_factory):
    return make_random_drafter(target_path, tmp_path_factory.mktemp("drafters") / "rand16", 16)


def _domino(name, drafter, extra=(), dtype="float32", env=None):
    return start_server(name, ["--dtype", dtype, "--max-total-tokens", "16384"],
                        ["--speculative-algorithm", "DOMINO", "--speculative-draft-model-path",
                         str(drafter), *extra], env=env)


@pytest.fixture(scope="module")
def domino_b16(random_drafter):
    with _domino("domino-b16", random_drafter) as server:
        yield server


@pytest.fixture(scope="module")
def domino_b4(random_drafter):
    # Same checkpoint, block size from the flag (overrides the config's 16); prompts are
    # prefilled in chunks of 32 tokens, so chunked prefill feeds the draft KV too.
    with _domino("domino-b4", random_drafter, ["--speculative-num-draft-tokens", "4",
                                               "--chunked-prefill-size", "32"]) as server:
        yield server


def generate(server, ids, max_new_tokens=NEW_TOKENS):
    r = requests.post(f"{server.url}/generate", json={
        "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens},
    }, timeout=600)
    r.raise_for_status()
    return r.json()


def stream_chat(server, prompt):
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": NEW_TOKENS, "temperature": 0, "stream": True}
    pieces = []
    with requests.post(f"{server.url}/v1/chat/completions", json=body, stream=True,
                       timeout=600) as r:
        r.raise_for_status()
        for chunk in sse_chunks(r):
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                pieces.append(chunk["choices"][0]["delta"]["content"])
    return pieces


@pytest.fixture(scope="module")
def reference(ar_server_fp32, chat_ids):
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda x: generate(ar_server_fp32, x)["output_ids"], chat_ids))
        texts = list(pool.map(lambda p: "".join(stream_chat(ar_server_fp32, p)), PROMPTS))
    return ids, texts


@pytest.mark.parametrize("server_name", ["domino_b4", "domino_b16"])
def test_lossless_greedy(request, server_name, chat_ids, reference):
    server = request.getfixturevalue(server_name)
    ref_ids, ref_texts = reference
    # concurrency 1, non-streaming
    sequential = [generate(server, ids) for ids in chat_ids]
    assert [r["output_ids"] for r in sequential] == ref_ids
    # concurrency 8, non-streaming
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda ids: generate(server, ids), chat_ids))
    assert [r["output_ids"] for r in together] == ref_ids
    # the second pass reused the radix cache (prompt prefixes computed in the first pass)
    assert sum(r["meta_info"]["cached_tokens"] for r in together) > 8 * 20
    # concurrency 8, streaming through the OpenAI API
    with ThreadPoolExecutor(8) as pool:
        streamed = list(pool.map(lambda p: stream_chat(server, p), PROMPTS))
    assert ["".join(s) for s in streamed] == ref_texts
    assert sum(len(s) > 3 for s in streamed) >= 6  # really streamed in pieces
    # A random drafter is almost never right: tau ~ 1 (tau counts the bonus token).
    meta = [r["meta_info"] for r in sequential]
    verify_ct = sum(m["spec_verify_ct"] for m in meta)
    tokens = sum(m["completion_tokens"] for m in meta)
    tau = tokens / verify_ct
    print(f"\n{server_name}: tau {tau:.3f} over {verify_ct} rounds")
    assert 1.0 <= tau < 1.3
    for m in meta:
        per_request_tau = m["completion_tokens"] / m["spec_verify_ct"]
        assert m["spec_accept_length"] == pytest.approx(per_request_tau)


REPEAT_PROMPT = "Repeat the word cat ten times: cat cat cat cat"


def verify_calls(server) -> float:
    """sglang:spec_verify_calls_total from /metrics, summed over its label sets."""
    total = 0.0
    for line in requests.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("sglang:spec_verify_calls_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_constructed_drafter_is_accepted_and_counted(target_path, tmp_path, ar_server_fp32,
                                                     tokenizer):
    ids = tokenizer(REPEAT_PROMPT).input_ids
    ref = generate(ar_server_fp32, ids, 40)["output_ids"]
    cat = tokenizer(" cat").input_ids[0]
    assert ref[:20] == [cat] * 20  # the target itself repeats " cat"
    drafter = make_repeat_drafter(target_path, tmp_path / "repeat4", block_size=4)
    # Fixed block: this test is about what a round that commits a whole block does (max_tokens,
    # stop strings, logprobs, counters inside it); whether the adaptive policy would speculate
    # on this drafter (good only on repetitions, bad on SGLang's warm-up request) is
    # test_policy's business.
    with _domino("domino-repeat", drafter, env={"DOMINO_ADAPTIVE": "0"}) as server:
        rounds_before = verify_calls(server)
        out = generate(server, ids, 40)
        # max_tokens inside an accepted block: exactly 10 tokens, though rounds commit 4 at a time
        cut = generate(server, ids, 10)
        # a stop string inside an accepted block: nothing after it is returned
        stopped = requests.post(f"{server.url}/generate", json={"input_ids": ids,
                                "sampling_params": {"temperature": 0, "max_new_tokens": 40,
                                                    "stop": [" cat cat cat"]}}, timeout=600).json()
        lp_body = {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 3,
                   "sampling_params": {"temperature": 0, "max_new_tokens": 12}}
        logprobs = requests.post(f"{server.url}/generate", json=lp_body, timeout=600).json()
        lp_ref = requests.post(f"{ar_server_fp32.url}/generate", json=lp_body,
                               timeout=600).json()["meta_info"]
        other = generate(server, tokenizer("Explain photosynthesis briefly.").input_ids, 24)
        other_ref = generate(ar_server_fp32, tokenizer("Explain photosynthesis briefly.").input_ids,
                             24)
        rounds = verify_calls(server) - rounds_before
    # SGLang's own speculative series counts DOMINO's rounds exactly (per-request sum).
    sent = [out, cut, stopped, logprobs, other]
    assert rounds == sum(r["meta_info"]["spec_verify_ct"] for r in sent) > 0
    assert out["output_ids"] == ref
    assert cut["output_ids"] == ref[:10] and cut["meta_info"]["finish_reason"]["type"] == "length"
    # The stop string completes inside the first accepted 4-token block; nothing from it or
    # after it comes back, and generation ends there.
    assert stopped["text"] == "" and stopped["meta_info"]["finish_reason"]["type"] == "stop"
    assert stopped["meta_info"]["completion_tokens"] <= 4
    # logprobs of tokens committed inside accepted blocks (chain rows of the verify pass) are
    # plain decoding's: the token's and the top-3, ids equal and values within float noise
    lp = logprobs["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lp] == ref[:12] and all(v <= 0 for v, _, _ in lp)
    assert [v for v, _, _ in lp] == pytest.approx(
        [v for v, _, _ in lp_ref["output_token_logprobs"]], abs=1e-3)
    top, top_ref = logprobs["meta_info"]["output_top_logprobs"], lp_ref["output_top_logprobs"]
    # (the best id exactly; the 2nd / 3rd may swap places on a near-tie between fp32 kernels)
    assert [row[0][1] for row in top] == [row[0][1] for row in top_ref] == ref[:12]
    assert [sorted(v for v, _, _ in row) for row in top] == [
        pytest.approx(sorted(v for v, _, _ in row), abs=1e-3) for row in top_ref]
    assert other["output_ids"] == other_ref["output_ids"]
    meta = out["meta_info"]
    tau = meta["completion_tokens"] / meta["spec_verify_ct"]
    print(f"\nrepeat drafter: tau {tau:.2f} on the repetitive prompt "
          f"({meta['completion_tokens']} tokens in {meta['spec_verify_ct']} rounds)")
    assert tau > 1.5
    # A 4-token block commits at most 4 tokens per round.
    assert meta["spec_verify_ct"] >= meta["completion_tokens"] / 4

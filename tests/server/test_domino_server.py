"""DOMINO inside the real SGLang server on CPU: lossless greedy output, acceptance counted right.

Reference = the same target served WITHOUT speculation (float32, `ar_server_fp32`). A randomly
initialised drafter exercises every accept length (mostly 1), at block 16 and, with chunked
prefill, block 4. Multi-token commits (the constructed repeat drafter, accepted on a repetitive
prompt) are tested in test_domino_sampling_server.py, on that module's server.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from domino_sglang.cli.local_server import sse_chunks
from tests.conftest import PROMPTS
from tests.harness.drafters import make_random_drafter
from tests.harness.servers import start_server

pytestmark = pytest.mark.server
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def random_drafter(target_path, tmp_path_factory):
    return make_random_drafter(target_path, tmp_path_factory.mktemp("drafters") / "rand16", 16)


def _domino(name, drafter, extra=(), dtype="float32"):
    return start_server(name, ["--dtype", dtype, "--max-total-tokens", "16384"],
                        ["--speculative-algorithm", "DOMINO", "--speculative-draft-model-path",
                         str(drafter), *extra])


@pytest.fixture  # one test each (a parameter of test_lossless_greedy): not kept beside the next
def domino_b16(random_drafter):
    with _domino("domino-b16", random_drafter) as server:
        yield server


@pytest.fixture
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


@pytest.fixture(scope="module")
def pointer_drafter(random_drafter, tmp_path_factory):
    """The random drafter as a pointer-generator drafter (pointer.py) whose gate (b = 3,
    g = 0.95) drafts the copy candidate wherever the history has one."""
    import json

    from domino_sglang.model.config import load_draft_config, load_draft_weights
    from domino_sglang.model.drafter import save_drafter
    from domino_sglang.train.warm_start import add_copy_gate

    cfg = json.loads((random_drafter / "config.json").read_text())
    cfg["dflash_config"]["copy_gate"] = True
    weights = add_copy_gate(load_draft_weights(load_draft_config(random_drafter)),
                            cfg["hidden_size"], bias=3.0)
    folder = tmp_path_factory.mktemp("drafters") / "pointer16"
    save_drafter(folder, cfg, weights)
    return folder


@pytest.fixture(scope="module")
def pointer_server(pointer_drafter):
    # fixed block, no prompt lookup: every round drafts, and only the pointer copies
    with _domino("domino-pointer", pointer_drafter, ["--speculative-domino-adaptive", "off",
                                                     "--speculative-domino-lookup", "off"]
                 ) as server:
        yield server


def test_lossless_greedy_pointer_drafter(pointer_server, chat_ids, reference):
    """A pointer drafter's copies (drafted by the worker's copy indexes, one per request,
    extended round by round) are verified like any draft: greedy output token for token, one
    at a time and 8 at once; its copies are accepted (tau > 1.05 with prompt lookup off, where
    the random drafter alone has ~1); a sampled request runs through the mixture's q."""
    from tests.server.test_observability_server import delta, scrape

    ref_ids, _ = reference
    before = scrape(pointer_server)
    sequential = [generate(pointer_server, ids) for ids in chat_ids]
    after = scrape(pointer_server)
    assert [r["output_ids"] for r in sequential] == ref_ids
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda ids: generate(pointer_server, ids), chat_ids))
    assert [r["output_ids"] for r in together] == ref_ids
    meta = [r["meta_info"] for r in sequential]
    tau = sum(m["completion_tokens"] for m in meta) / sum(m["spec_verify_ct"] for m in meta)
    # the copies are counted apart from the head's changes (metrics.draft_outcomes), and the
    # accepted drafts of this random drafter are nearly all copies
    right = delta(after, before, "domino_copied_tokens_total", 'outcome="right"')
    wrong = delta(after, before, "domino_copied_tokens_total", 'outcome="wrong"')
    accepted = delta(after, before, "domino_draft_tokens_accepted_total")
    print(f"\npointer drafter: tau {tau:.3f}, copies right {right:.0f} / wrong {wrong:.0f}, "
          f"accepted drafts {accepted:.0f}")
    assert tau > 1.05
    assert 0.5 * accepted <= right <= accepted and wrong > 0
    r = requests.post(f"{pointer_server.url}/generate", json={
        "input_ids": chat_ids[0], "sampling_params": {"temperature": 0.8, "max_new_tokens": 24,
                                                      "ignore_eos": True}}, timeout=600)
    r.raise_for_status()
    assert len(r.json()["output_ids"]) == 24


def test_gpu_shaped_rounds_are_lossless(pointer_drafter, chat_ids, reference):
    """Every decision of the CUDA-graph path, taken on the CPU (--speculative-domino-debug-gpu-
    shape on): batch buckets from SGLang's capture list, the head rollout over static buffers
    built at start-up (what a GPU server replays as CUDA graphs), run eagerly here, the pointer
    drafter's device copy index, plain rounds through the width-1 verify, and every round at a
    captured width (L = 16, 3, 7, 2 by committed length verify 16, 4, 8, 2): greedy output token
    for token, one at a time and 8 at once (padded to bucket 8); sampled requests (temperature,
    then top-k / top-p) drafted through it; no round fell back to the dynamic path or ran a
    runner not built at start-up (domino_eager_rounds_total)."""
    from tests.server.test_observability_server import delta, scrape

    extra = ["--speculative-domino-debug-gpu-shape", "on",
             "--speculative-domino-debug-draft-len", "16,3,7,2",
             "--speculative-domino-lookup", "off", "--enable-metrics"]
    ref_ids, _ = reference
    with _domino("domino-static", pointer_drafter, extra) as server:
        before = scrape(server)
        assert [generate(server, ids)["output_ids"] for ids in chat_ids[:4]] == ref_ids[:4]
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda ids: generate(server, ids), chat_ids))
        assert [r["output_ids"] for r in together] == ref_ids
        for params in ({"temperature": 0.8}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}):
            r = requests.post(f"{server.url}/generate", json={
                "input_ids": chat_ids[1], "sampling_params": {
                    **params, "max_new_tokens": 24, "ignore_eos": True}}, timeout=600)
            r.raise_for_status()
            assert len(r.json()["output_ids"]) == 24
        after = scrape(server)
        log = server.log()
        assert "head-rollout runners built at start-up (run eagerly" in log
        assert "verify widths [1, 2, 4, 8, 16]" in log
    # the drafts came through it: the pointer's copies are accepted (a broken static rollout
    # would still be lossless, with tau ~ 1)
    meta = [r["meta_info"] for r in together]
    tau = sum(m["completion_tokens"] for m in meta) / sum(m["spec_verify_ct"] for m in meta)
    print(f"\nstatic rollout: tau {tau:.3f}")
    assert tau > 1.05
    eager = {k: v for k, v in after.items() if k[0] == "domino_eager_rounds_total"}
    assert sum(eager.values()) == 0, eager  # e.g. reason="host_copy_index" with the host index
    # every round at a captured width: L = 3 verified 4 (none in the histogram's (2, 3] bucket)
    lengths = {float(k[1].split('le="')[1].split('"')[0]): v for k, v in after.items()
               if k[0] == "domino_draft_length_bucket"}
    assert lengths[3.0] == lengths[2.0] < lengths[4.0] and lengths[6.0] == lengths[4.0], lengths
    assert delta(after, before, "domino_rounds_total", 'kind="draft"') > 20

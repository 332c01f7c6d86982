"""Draft trees served (--speculative-domino-tree-width): lossless greedy and sampled.

One float32 DOMINO server with the shipped drafter, trees of width 4, the verified size cycling
6, 8, 16 by the committed length (so every speculative round with a draft pass is a tree, prompt
lookup's drafts its branches where a row has one), in the GPU's control flow
(--speculative-domino-debug-gpu-shape on). Greedy: its output
equals plain decoding's token for token, one request at a time and 8 at once (the accepted
path's KV moved to the committed positions, its features into the draft context: a wrong move
would change later tokens). Sampled: its answers at T = 0.8 follow plain decoding's distribution
(two-sample chi-square, unseeded, and seeded with a top-k of 50), the same statistics that tell a
broken verifier apart in tests/server/test_served_sampling.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from domino_sglang.paths import shipped_drafter_dir
from tests.harness.sampling_stats import ALPHA, draw, statistics
from tests.harness.servers import start_server

pytestmark = pytest.mark.server
NEW_TOKENS = 48
PROMPT = "Write one sentence about the sea."


@pytest.fixture(scope="module")
def server():
    with start_server("domino-tree", ["--dtype", "float32", "--max-total-tokens", "16384",
                                      "--drafter", str(shipped_drafter_dir())],
                      ["--speculative-domino-tree-width", "4",
                       "--speculative-domino-debug-draft-len", "6,8,16",
                       "--speculative-domino-debug-gpu-shape", "on"]) as srv:
        yield srv


def _generate(url: str, ids: list[int]) -> dict:
    r = requests.post(f"{url}/generate", json={
        "input_ids": ids, "sampling_params": {"temperature": 0.0,
                                              "max_new_tokens": NEW_TOKENS}}, timeout=900)
    r.raise_for_status()
    return r.json()


def _counter(url: str, name: str, label: str = "") -> float:
    total = 0.0
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.split("{")[0].split(" ")[0] == name and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_greedy_tree_output_equals_plain_decoding(server, ar_server_fp32, chat_ids):
    prompts = chat_ids[:8]
    with ThreadPoolExecutor(8) as pool:
        reference = [r["output_ids"] for r in
                     pool.map(lambda ids: _generate(ar_server_fp32.url, ids), prompts)]
    trees = _counter(server.url, "domino_rounds_total", 'kind="tree"')
    paths = _counter(server.url, "domino_tree_paths_total")
    alone = [_generate(server.url, ids) for ids in prompts[:4]]
    for i, (got, want) in enumerate(zip(alone, reference)):
        assert got["output_ids"] == want, f"prompt {i} alone: differs from plain decoding"
    with ThreadPoolExecutor(8) as pool:
        batched = list(pool.map(lambda ids: _generate(server.url, ids), prompts))
    for i, (got, want) in enumerate(zip(batched, reference)):
        assert got["output_ids"] == want, f"prompt {i}, 8 at once: differs from plain decoding"
    assert _counter(server.url, "domino_rounds_total", 'kind="tree"') > trees, "no tree round"
    # every tree round's requests counted by what their accepted path ran along
    assert _counter(server.url, "domino_tree_paths_total") > paths
    print({b: _counter(server.url, "domino_tree_paths_total", f'branch="{b}"')
           for b in ("none", "chain", "copy", "alternative", "lookup")})
    # the trees committed drafts: tokens per verify round (SGLang's tau, the prefill's token in)
    tokens = sum(len(r["output_ids"]) for r in alone)
    rounds = sum(r["meta_info"]["spec_verify_ct"] for r in alone)
    print(f"\nalone: {tokens} tokens in {rounds} verify rounds")
    assert tokens > 1.3 * rounds, (tokens, rounds)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=True,
                                         add_generation_prompt=True, return_dict=False)


@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded"])
def test_sampled_tree_answers_follow_plain_decoding(server, ar_server_fp32, prompt_ids, seeded):
    top_k = 50 if seeded else None
    trees = _counter(server.url, "domino_rounds_total", 'kind="tree"')
    stats = statistics(draw(server.url, prompt_ids, seeded, top_k),
                       draw(ar_server_fp32.url, prompt_ids, seeded, top_k))
    assert _counter(server.url, "domino_rounds_total", 'kind="tree"') > trees
    for name, (p, cells) in stats.items():
        print(f"\n{'seeded' if seeded else 'unseeded'} {name}: p = {p:.4f} over {cells} cells")
    for name, (p, cells) in stats.items():
        assert cells >= 3, f"{name}: too few outcomes ({cells}) for the test to mean anything"
        assert p > ALPHA, f"{name}: tree samples differ from plain decoding's (p = {p:.2e})"

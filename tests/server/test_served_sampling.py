"""Sampling through the served API is exact: DOMINO's first tokens at T = 0.8 follow the same
distribution as plain decoding's, seeded (with a top-k of 50: q kept as its support in the GPU
shape) and unseeded (two-sample chi-square on the first token and on token pairs), and the same
test tells a deliberately broken verifier apart (its power).

The in-process tests (test_sampling.py) check the verifier against exact joint distributions;
this one checks the whole served path: prefill sampling, the draft pass, verification, commit,
seeds. Servers: plain decoding (float32), DOMINO with the shipped drafter (float32, fixed block
16, so every round speculates; in the GPU's control flow, --speculative-domino-debug-gpu-shape
on: the sampled head rollout over static buffers built at start-up, the pointer drafter's device
copy index), and the same DOMINO server with `verify_mixed` replaced by one that accepts every
draft (tests/harness/fixtures/broken_verifier, loaded through PYTHONPATH).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from domino_sglang.paths import shipped_drafter_dir
from tests.harness.sampling_stats import ALPHA, draw, statistics
from tests.harness.servers import start_server

pytestmark = pytest.mark.server
PROMPT = "Write one sentence about the sea."
BROKEN = Path(__file__).resolve().parents[1] / "harness" / "fixtures" / "broken_verifier"


def domino_server(name: str, extra_env: dict | None = None):
    return start_server(name, ["--dtype", "float32", "--max-total-tokens", "16384",
                               "--drafter", str(shipped_drafter_dir())],
                        ["--speculative-domino-adaptive", "off",
                         "--speculative-domino-debug-gpu-shape", "on"], env=extra_env)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=True,
                                         add_generation_prompt=True, return_dict=False)


@pytest.fixture(scope="module")
def samples(ar_server_fp32, prompt_ids) -> dict[str, dict[bool, list]]:
    # seeded requests also ask a top-k (Qwen3's default kind of request): their rows are top-k
    # bounded, so the GPU-shaped rollout keeps their q as its support (graphs.sparse_width)
    top_k = {False: None, True: 50}
    out = {"plain": {s: draw(ar_server_fp32.url, prompt_ids, s, top_k[s]) for s in (False, True)}}
    with domino_server("sampling-domino") as server:
        out["domino"] = {s: draw(server.url, prompt_ids, s, top_k[s]) for s in (False, True)}
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(BROKEN),
                                                       os.environ.get("PYTHONPATH")]))}
    with domino_server("sampling-broken", env) as server:
        out["broken"] = {False: draw(server.url, prompt_ids, False)}
    return out


@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded"])
def test_domino_samples_follow_plain_decoding(samples, seeded):
    stats = statistics(samples["domino"][seeded], samples["plain"][seeded])
    for name, (p, cells) in stats.items():
        print(f"\n{'seeded' if seeded else 'unseeded'} {name}: p = {p:.4f} over {cells} cells")
    for name, (p, cells) in stats.items():
        assert cells >= 3, f"{name}: too few outcomes ({cells}) for the test to mean anything"
        assert p > ALPHA, f"{name}: DOMINO's samples differ from plain decoding's (p = {p:.2e})"


def test_the_same_test_catches_a_broken_verifier(samples):
    """Power: accepting every draft commits the drafter's samples; the pair statistics must
    reject it at the same level (the first token comes from the prefill, unchanged there)."""
    stats = statistics(samples["broken"][False], samples["plain"][False])
    for name, (p, cells) in stats.items():
        print(f"\nbroken verifier {name}: p = {p:.2e} over {cells} cells")
    assert min(stats["tokens 1-2"][0], stats["tokens 2-3"][0]) < ALPHA, stats

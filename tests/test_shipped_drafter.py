"""The shipped drafter: loads in the server by default, stays lossless, and keeps its acceptance.

A regression guard, not a timing: tau on 5 fixed prompts (greedy, float32 so the output must equal
plain decoding token for token, fixed block: DOMINO_ADAPTIVE=0) must stay above TAU_FLOOR.
Measured when the drafter was committed (2026-11-22): tau 1.168 (264 tokens / 226 rounds) on these
prompts WITH the adaptive policy on, whose plain-decoding rounds commit exactly one token, so the
fixed-block tau is at least that; a random drafter gives 1.03.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from domino_sglang.local_server import start_server
from domino_sglang.paths import shipped_drafter_dir

pytestmark = pytest.mark.server
NEW_TOKENS = 64
TAU_MEASURED = 1.168
TAU_FLOOR = 1.10  # measured - 0.068: above a random drafter (1.03), below the measured value


def _generate(url: str, ids: list[int]) -> dict:
    r = requests.post(f"{url}/generate", json={
        "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS}},
        timeout=900)
    r.raise_for_status()
    return r.json()


def test_shipped_drafter_is_lossless_and_keeps_its_tau(ar_server_fp32, chat_ids):
    assert (shipped_drafter_dir() / "model.safetensors").is_file()
    prompts = chat_ids[:5]
    with ThreadPoolExecutor(5) as pool:  # batched: float32 output does not depend on the batch
        reference = [r["output_ids"] for r in pool.map(
            lambda ids: _generate(ar_server_fp32.url, ids), prompts)]
    # no --drafter: `domino-sglang serve` picks the shipped one
    with start_server("shipped", ["--dtype", "float32", "--max-total-tokens", "16384"],
                      env={"DOMINO_ADAPTIVE": "0"}) as server:
        assert "--speculative-algorithm DOMINO" in " ".join(server.args) or \
            "DOMINO" in server.log()
        with ThreadPoolExecutor(5) as pool:
            outs = list(pool.map(lambda ids: _generate(server.url, ids), prompts))
    tokens = rounds = 0
    for ref, out in zip(reference, outs):
        assert out["output_ids"] == ref
        tokens += out["meta_info"]["completion_tokens"]
        rounds += out["meta_info"]["spec_verify_ct"]
    tau = tokens / rounds
    print(f"shipped drafter tau on 5 prompts: {tau:.3f} ({tokens} tokens / {rounds} rounds)")
    assert tau >= TAU_FLOOR, f"tau {tau:.3f} fell below the floor {TAU_FLOOR}"

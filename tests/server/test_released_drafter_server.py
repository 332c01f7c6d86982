"""A released-layout Domino drafter starts a real CPU server unchanged and decodes losslessly.

The drafter: SpecForge's verbatim `qwen3-8b-domino.json` (the layout of the released
`Huang2020/Qwen3-8B-Domino-b16`: `auto_map`, nested + top-level `emb_dim`, `num_target_layers`,
`layer_types`), scaled in sizes only to the CPU target (SmolLM2-135M: hidden 576, vocabulary
49152, 30 layers; tests/harness/released_drafters.py), random weights saved with the released
checkpoints' `model.` prefix, started through the user's path (`domino-sglang serve --drafter`,
which runs the start-up checks first) with SGLang's own `--speculative-domino-candidate-pool-size
256`. Reference: plain decoding, float32 (`ar_server_fp32`).
"""

from __future__ import annotations

import pytest
import requests

from tests.harness.released_drafters import SMOL, released, scaled, write_released_drafter
from tests.harness.servers import start_server

pytestmark = pytest.mark.server
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def released_server(tmp_path_factory, target_path):
    folder = tmp_path_factory.mktemp("released") / "qwen3-8b-domino-smol"
    write_released_drafter(folder, scaled(released("qwen3-8b-domino.json"), **SMOL), seed=0)
    with start_server("released-8b", ["--drafter", str(folder), "--dtype", "float32",
                                      "--max-total-tokens", "16384"],
                      ["--speculative-domino-candidate-pool-size", "256"]) as server:
        yield server


def _greedy(server, ids):
    r = requests.post(f"{server.url}/generate", json={
        "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS},
    }, timeout=600)
    r.raise_for_status()
    return r.json()


def test_released_layout_serves_losslessly(released_server, ar_server_fp32, chat_ids):
    for ids in chat_ids[:3]:
        got = _greedy(released_server, ids)
        assert got["meta_info"]["spec_verify_ct"] > 0  # speculation really ran
        assert got["output_ids"] == _greedy(ar_server_fp32, ids)["output_ids"]
    log = released_server.log()
    assert "pool 256," in log, "--speculative-domino-candidate-pool-size 256 not in effect"

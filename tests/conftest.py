"""Shared fixtures: the prepared target and real SGLang servers (started once per session)."""

from __future__ import annotations

import pytest
import torch

from domino_sglang.local_server import start_server

torch.set_num_threads(1)

PROMPTS = [
    "What is the capital of France? Answer in one sentence, then describe the city.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain why the sky is blue to a ten-year-old.",
    "List five fruits and one fact about each.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
    "May. How many clips did Natalia sell altogether in April and May? Think step by step.",
    "Translate to French: 'The weather is nice today, let us go for a walk in the park.'",
    "Give me three tips for writing clear technical documentation.",
    "What is 17 times 23? Show your work.",
]


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test`: `-n 2 --dist loadgroup`) every test that starts a server
    runs in one worker, in order, and the rest (in-process: kernels, training, rollout) in the
    other: servers use one torch thread and sit mostly idle on the client, so the two lanes share
    the 2 cores, while only one lane's servers (~2-3 GB each; session-scoped ones stay up) are
    ever alive at once."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("server") or item.get_closest_marker("soak"):
            item.add_marker(pytest.mark.xdist_group("server"))


@pytest.fixture(scope="session")
def target_path():
    from domino_sglang.target import prepare_target

    return prepare_target()


@pytest.fixture(scope="session")
def tokenizer(target_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target_path)


@pytest.fixture(scope="session")
def chat_ids(tokenizer):
    """Chat-templated prompt token ids, as SGLang's chat endpoint builds them."""
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                      add_generation_prompt=True, return_dict=False)
        for p in PROMPTS
    ]


@pytest.fixture(scope="session")
def ar_server_fp32(target_path):
    """The reference every lossless test compares with: plain decoding, float32, with SGLang's
    synchronous scheduler. The overlap scheduler feeds penalizers `output_ids[-1]` one token late,
    so only the synchronous one is exact plain decoding for penalized requests (greedy outputs
    are the same under both); custom logit processors are enabled for the tests that send them."""
    server = start_server("ar-fp32", ["--no-speculation", "--dtype", "float32",
                                      "--max-total-tokens", "16384"],
                          ["--disable-overlap-schedule", "--enable-custom-logit-processor"])
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ar_server_bf16(target_path):
    server = start_server("ar-bf16", ["--no-speculation", "--dtype", "bfloat16",
                                      "--max-total-tokens", "16384"])
    yield server
    server.stop()

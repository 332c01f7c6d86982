"""Shared fixtures: the prepared target and the plain-decoding servers many tests compare with
(started on first use, kept while the process's server cap allows: tests/harness/servers.py)."""

from __future__ import annotations

import pytest
import torch

from domino_sglang.cli.local_server import stop_servers_on_sigterm
from tests.harness.servers import SharedServer

torch.set_num_threads(1)
stop_servers_on_sigterm()  # a CI time-out (SIGTERM) stops the servers the tests started

APP_ORIGIN = "https://app.example"  # the one origin ar_server_bf16 allows
SMALL_BODY_CAP = 16384  # ar_server_bf16's --domino-max-request-bytes
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


@pytest.fixture(scope="session")
def target_path():
    from domino_sglang.model.target import prepare_target

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
    server = SharedServer("ar-fp32", ["--no-speculation", "--dtype", "float32",
                                      "--max-total-tokens", "16384"],
                          ["--disable-overlap-schedule", "--enable-custom-logit-processor"])
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ar_server_bf16(target_path):
    # with the plugin's HTTP flags set, on a plain server (test_openai_api.py checks them)
    server = SharedServer("ar-bf16", ["--no-speculation", "--dtype", "bfloat16",
                                      "--max-total-tokens", "16384"],
                          ["--domino-allowed-origins", APP_ORIGIN,
                           "--domino-max-request-bytes", str(SMALL_BODY_CAP)])
    yield server
    server.stop()

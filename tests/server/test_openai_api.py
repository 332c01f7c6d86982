"""The OpenAI-compatible API of the served target: chat, streamed chat, completion with stop,
and Prometheus metrics."""

from __future__ import annotations

import pytest
import requests
from openai import OpenAI

from tests.conftest import APP_ORIGIN, SMALL_BODY_CAP

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def client(ar_server_bf16):
    return OpenAI(base_url=f"{ar_server_bf16.url}/v1", api_key="unused")


def test_chat_completion(client):
    r = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24, temperature=0,
    )
    text = r.choices[0].message.content
    assert "Paris" in text
    assert r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("stop", "length")


def test_streamed_chat_arrives_incrementally(client):
    stream = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Count from 1 to 20."}],
        max_tokens=48, temperature=0, stream=True,
    )
    pieces = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    # many chunks, not one burst (no wall-clock check: a fast machine would fail it)
    assert len(pieces) >= 5, pieces
    full = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Count from 1 to 20."}],
        max_tokens=48, temperature=0,
    ).choices[0].message.content
    assert "".join(pieces) == full


def test_completion_with_stop(client):
    prompt = "1, 2, 3, 4, 5, 6,"
    free = client.completions.create(model="default", prompt=prompt, max_tokens=16,
                                     temperature=0).choices[0].text
    assert " 8" in free
    r = client.completions.create(model="default", prompt=prompt, max_tokens=16, temperature=0,
                                  stop=[" 8"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == free[: free.index(" 8")]


def test_metrics_exposes_sglang_series(ar_server_bf16, client):
    client.completions.create(model="default", prompt="Hello", max_tokens=4, temperature=0)
    text = requests.get(f"{ar_server_bf16.url}/metrics", timeout=10).text
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
             if line.startswith("sglang:")}
    assert "sglang:num_running_reqs" in names
    assert any(n.startswith("sglang:prompt_tokens") for n in names)


def test_plugin_http_flags_are_honoured(ar_server_bf16):
    """The plugin's flags (server_flags.py) reach the server through SGLang's parser: the
    allowed origin gets CORS, another origin is refused, a body over the cap is a 413."""
    url = f"{ar_server_bf16.url}/v1/models"
    ok = requests.get(url, headers={"Origin": APP_ORIGIN}, timeout=60)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == APP_ORIGIN
    assert requests.get(url, headers={"Origin": "https://other.example"},
                        timeout=60).status_code == 403
    body = {"model": "default", "messages": [{"role": "user", "content": "x" * SMALL_BODY_CAP}]}
    big = requests.post(f"{ar_server_bf16.url}/v1/chat/completions", json=body, timeout=60)
    assert big.status_code == 413 and str(SMALL_BODY_CAP) in big.json()["message"]

"""Bad requests through the OpenAI API (and the native one) on the shared DOMINO server: each a
4xx with a message that says what is wrong, never a 500, never a dead scheduler; then a bounded
fuzz of chat bodies (hypothesis). Two bodies SGLang 0.5.23 itself answers with a 500 (a JSON
array body; a non-object response_format) are 400s through domino_sglang.http.guards.BodyShapeGuard.
"""

from __future__ import annotations

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.client import AUTH, assert_idle
from tests.reliability.workload import comparable, other_jobs, run

pytestmark = pytest.mark.server
MSG = [{"role": "user", "content": "Hi"}]


def body(**fields) -> dict:
    return {"model": "default", "messages": MSG, "max_tokens": 4, **fields}


# (name, endpoint, JSON body, words the error message must contain)
BAD = [
    ("negative temperature", "chat", body(temperature=-1), "temperature must be"),
    ("temperature not a number", "chat", body(temperature="hot"), "temperature"),
    ("top_p above 1", "chat", body(top_p=2), "top_p must be in (0, 1]"),
    ("top_p 0", "chat", body(top_p=0), "top_p must be in (0, 1]"),
    ("top_k 0", "chat", body(top_k=0), "top_k must be -1 (disable) or at least 1"),
    ("top_k negative", "chat", body(top_k=-5), "top_k must be"),
    ("top_k fractional", "chat", body(top_k=1.5), "top_k"),
    ("min_p above 1", "chat", body(min_p=2), "min_p must be in [0, 1]"),
    ("frequency_penalty out of range", "chat", body(frequency_penalty=9), "frequency_penalty"),
    ("repetition_penalty 0", "chat", body(repetition_penalty=0), "repetition_penalty"),
    ("huge max_tokens", "chat", body(max_tokens=10**12), "maximum context length"),
    ("negative max_tokens", "chat", body(max_tokens=-1), "max_new_tokens must be at least 0"),
    ("max_tokens not an int", "chat", body(max_tokens="ten"), "max_tokens"),
    ("messages not a list", "chat", {"model": "default", "messages": "hello"}, "messages"),
    ("messages empty", "chat", {"model": "default", "messages": []}, "Messages cannot be empty"),
    ("messages missing", "chat", {"model": "default"}, "messages"),
    ("unknown role", "chat", {"model": "default", "messages": [{"role": "wizard",
                                                                  "content": "x"}]}, "role"),
    ("stop not a string", "chat", body(stop=5), "stop"),
    ("seed not an int", "chat", body(seed="abc"), "seed"),
    ("logit_bias token outside the vocabulary", "chat", body(logit_bias={"999999": 5}),
     "logit_bias"),
    ("bad regex", "chat", body(regex="(("), "regex"),
    ("bad JSON schema", "chat", body(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}), "json"),
    ("oversized prompt", "chat", body(messages=[{"role": "user", "content": "hello " * 9000}]),
     "longer than the model's context length"),
    ("empty prompt", "completion", {"model": "default", "prompt": "", "max_tokens": 2},
     "Prompt cannot be empty"),
    ("prompt not text", "completion", {"model": "default", "prompt": 5}, "prompt"),
    # These two killed the whole SGLang 0.5.23 server (IndexError in the scheduler's embedding);
    # domino_sglang/http/guards.py refuses them in the tokenizer manager.
    ("token id above the vocabulary", "completion",
     {"model": "default", "prompt": [999999999], "max_tokens": 2}, "out-of-vocabulary token id"),
    ("negative token id", "generate", {"input_ids": [1, -3], "sampling_params": {
        "max_new_tokens": 2}}, "out-of-vocabulary token id -3"),
    # Outputs DOMINO does not produce (integration/algorithm.py refuse_unsupported_outputs):
    # SGLang alone aborted the first with a 500 after one token.
    ("sampling mask", "generate", {"text": "Hi", "return_sampling_mask": True,
                                   "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
     "return_sampling_mask is not supported with --speculative-algorithm DOMINO"),
    ("hidden states", "generate", {"text": "Hi", "return_hidden_states": True,
                                   "sampling_params": {"max_new_tokens": 8}},
     "return_hidden_states is not supported with --speculative-algorithm DOMINO"),
    # SGLang 0.5.23 alone answers a 500 (its batch normalisation); http/guards.py a 400
    ("sampling_params list shorter than the batch", "generate",
     {"text": ["Hi", "Hello"], "sampling_params": [{"max_new_tokens": 2}]},
     "sampling_params is a list of 1 but the batch has 2 prompts"),
]
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "generate": "/generate"}

RAW = [  # bodies that are not a JSON object
    ("truncated JSON", b'{"model": "default", "messages": [', "JSON decode error"),
    ("not JSON", b"hello", "JSON decode error"),
    ("empty body", b"", "Field required"),
    ("invalid UTF-8", b'{"model": "\xff\xfe"}', "JSON decode error"),
]
# SGLang 0.5.23 alone answers these with a bare 500 (AttributeError in its pydantic
# `mode="before"` validators); our BodyShapeGuard makes them 400s naming the problem.
FORMERLY_500 = [
    ("JSON array body", b"[1, 2, 3]", "must be a JSON object, not a JSON list"),
    ("JSON string body", b'"hello"', "must be a JSON object, not a JSON str"),
    ("response_format true",
     b'{"model": "default", "messages": [{"role": "user", "content": "Hi"}], '
     b'"response_format": true}', "response_format must be an object"),
    ("response_format a string",
     b'{"model": "default", "messages": [{"role": "user", "content": "Hi"}], '
     b'"response_format": "json"}', "response_format must be an object"),
]


def error_message(r: requests.Response) -> str:
    """The OpenAI endpoints answer {"message": ...}, the native ones {"error": {"message": ...}}."""
    out = r.json()
    return out["message"] if "message" in out else out["error"]["message"]


@pytest.mark.parametrize("name,endpoint,payload,words", BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_a_clear_4xx(rel_server, name, endpoint, payload, words):
    r = requests.post(rel_server.url + PATHS[endpoint], json=payload, headers=AUTH, timeout=300)
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:300])
    assert words in error_message(r), (name, r.text[:300])


@pytest.mark.parametrize("name,raw,words", RAW, ids=[r[0] for r in RAW])
def test_malformed_body_is_a_clear_4xx(rel_server, name, raw, words):
    r = requests.post(f"{rel_server.url}/v1/chat/completions", data=raw,
                      headers={**AUTH, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400 and words in error_message(r), (name, r.text[:300])


def same_as_plain_decoding(server, references, tokenizer, key: str) -> bool:
    return comparable(run(server.url, other_jobs(tokenizer)[key], AUTH)) == references[key]


@pytest.mark.parametrize("name,raw,words", FORMERLY_500, ids=[r[0] for r in FORMERLY_500])
def test_bodies_sglang_answers_with_500_are_400s(rel_server, name, raw, words):
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = requests.post(rel_server.url + path, data=raw,
                          headers={**AUTH, "Content-Type": "application/json"}, timeout=60)
        assert r.status_code == 400 and words in error_message(r), (name, path, r.text[:300])


def test_server_lossless_after_the_formerly_500_bodies(references, rel_server, tokenizer):
    for _, raw, _ in FORMERLY_500:
        requests.post(f"{rel_server.url}/v1/chat/completions", data=raw,
                      headers={**AUTH, "Content-Type": "application/json"}, timeout=60)
    assert same_as_plain_decoding(rel_server, references, tokenizer, "after-500")


def test_tolerated_oddities_are_served_like_without_speculation(references, rel_server,
                                                               tokenizer):
    """Accepted by SGLang (200), and DOMINO answers them exactly as plain decoding does:
    unknown fields are ignored, any model name is served."""
    for key in ("unknown-fields", "unknown-model"):
        assert same_as_plain_decoding(rel_server, references, tokenizer, key), key


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                         st.floats(allow_nan=False), st.text(max_size=20))
FIELD_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6)
FIELDS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "n", "stop", "seed", "stream",
          "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
          "messages", "model", "response_format", "tools", "ignore_eos", "unknown_field"]


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(FIELDS), FIELD_VALUES, max_size=4))
def test_fuzzed_chat_bodies_never_500(rel_server, mutation):
    payload = {**body(max_tokens=2), **mutation}
    if isinstance(payload.get("max_tokens"), int) and payload["max_tokens"] > 8:
        payload["max_tokens"] = 8  # bounded work per case; huge values are tested above
    if isinstance(payload.get("n"), int) and payload["n"] > 2:
        payload["n"] = 2  # bounded work; n > 128 is refused (test_crash_survival.py)
    r = requests.post(f"{rel_server.url}/v1/chat/completions", json=payload, headers=AUTH,
                      timeout=300)
    assert r.status_code < 500, (payload, r.status_code, r.text[:300])


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.one_of(st.lists(JSON_SCALARS, max_size=3), JSON_SCALARS))
def test_fuzzed_non_object_bodies_are_400s(rel_server, payload):
    r = requests.post(f"{rel_server.url}/v1/chat/completions", json=payload, headers=AUTH,
                      timeout=60)
    assert r.status_code == 400, (payload, r.status_code, r.text[:300])


def test_server_still_lossless_after_the_bad_inputs(references, rel_server, tokenizer):
    assert same_as_plain_decoding(rel_server, references, tokenizer, "after-bad")
    assert_idle(rel_server)

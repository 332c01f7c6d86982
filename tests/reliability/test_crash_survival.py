"""Single requests that killed the server (or answered 500) on 780c26f, each now a clear 4xx,
and after each the server still answers a normal request exactly as plain decoding does.

Every case in CRASHES took the whole server down on 780c26f (checked against a server of that
revision: `python tests/reliability/test_crash_survival.py URL API_KEY ADMIN_KEY` runs the
cases against any running server and prints what each got); FORMERLY_500 were 500s there.
The admin sweep calls every admin route SGLang serves with the admin key and bad arguments;
the fuzz sends /generate sampling parameters from hypothesis. Guards: domino_sglang/http/guards.py,
access rules: domino_sglang/http/access.py, weight updates: DominoWorker.weight_update_runners.
"""

from __future__ import annotations

import json
import sys

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.client import ADMIN_AUTH, AUTH, assert_idle
from tests.reliability.workload import comparable, other_jobs, run

pytestmark = pytest.mark.server
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "Hi"}]
BIG = 20 * 1024 * 1024


def chat_body(**fields) -> dict:
    return {"model": "default", "messages": MSG, "max_tokens": 2, **fields}


def generate_body(**fields) -> dict:
    return {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, **fields}


# (name, admin route?, path, JSON body or raw bytes, status, words in the answer)
CRASHES = [
    ("weights from a missing path", True, "/update_weights_from_disk",
     {"model_path": "/nonexistent"}, 400, "Failed to get weights iterator"),
    ("top_logprobs above OpenAI's cap", False, CHAT,
     chat_body(logprobs=True, top_logprobs=100000), 400, "top_logprobs must be between 0 and 20"),
    ("top_logprobs_num above the vocabulary", False, "/generate",
     generate_body(return_logprob=True, top_logprobs_num=100000), 400,
     "top_logprobs_num must be between 0 and the vocabulary size 49152"),
    ("expert recording without the recorder", True, "/start_expert_distribution_record", {},
     400, "needs a server started with --expert-distribution-recorder-mode"),
    ("memory release on a CPU server", True, "/release_memory_occupation", {}, 400,
     "needs a server started with a CUDA device"),
    ("n = 2**31 parallel samples", False, "/generate",
     {"text": "Hi", "sampling_params": {"max_new_tokens": 1, "n": 2**31}}, 400,
     "sampling_params.n must be between 1 and 128"),
    ("a 20 MB chat body", False, CHAT,
     json.dumps(chat_body(messages=[{"role": "user", "content": "hi " * (BIG // 3)}])).encode(),
     413, "larger than 4194304 bytes"),
]
FORMERLY_500 = [
    ("sampling_params.n null", False, "/generate",
     {"text": "Hi", "sampling_params": {"max_new_tokens": 1, "n": None}}, 400,
     "sampling_params.n must be between 1 and 128"),
    ("100,000 nested brackets", False, CHAT, b"[" * 100_000, 400, "nests deeper than 64"),
    ("a json_schema that is a $ref cycle", False, CHAT, chat_body(response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}), 400,
     "refers back to itself"),
]


def send(url: str, admin: bool, path: str, body) -> requests.Response:
    headers = dict(ADMIN_AUTH if admin else AUTH)
    if isinstance(body, bytes):
        return requests.post(url + path, data=body, timeout=300,
                             headers={**headers, "Content-Type": "application/json"})
    return requests.post(url + path, json=body, headers=headers, timeout=300)


def answer_text(r: requests.Response) -> str:
    return r.text[:400]


def same_as_plain_decoding(server, references, tokenizer, key: str) -> bool:
    return comparable(run(server.url, other_jobs(tokenizer)[key], AUTH)) == references[key]


@pytest.mark.parametrize("name,admin,path,body,status,words", CRASHES + FORMERLY_500,
                         ids=[c[0] for c in CRASHES + FORMERLY_500])
def test_request_that_killed_the_server_is_a_clear_4xx(references, rel_server, tokenizer, name,
                                                      admin, path, body, status, words):
    r = send(rel_server.url, admin, path, body)
    assert r.status_code == status and words in answer_text(r), (name, r.status_code, r.text[:300])
    assert same_as_plain_decoding(rel_server, references, tokenizer, "after-crash"), name


def test_target_weights_reload_then_decode_losslessly(references, rel_server, tokenizer,
                                                      target_path):
    """DOMINO updates the target's weights in place (the drafter keeps its own); reloading the
    same checkpoint answers 200 and decoding stays equal to plain decoding."""
    r = send(rel_server.url, True, "/update_weights_from_disk", {"model_path": str(target_path)})
    assert r.status_code == 200 and r.json()["success"], r.text[:300]
    assert same_as_plain_decoding(rel_server, references, tokenizer, "after-weights")
    assert_idle(rel_server)


def admin_routes(url: str) -> list[tuple[str, str]]:
    paths = requests.get(f"{url}/openapi.json", headers=AUTH, timeout=60).json()["paths"]
    routes = []
    for path, ops in paths.items():
        for method in ops:
            probe = requests.request(method.upper(), url + path, headers=AUTH, json={},
                                     timeout=60)
            if probe.status_code in (401, 403):  # admin: the ordinary key is refused
                routes.append((method.upper(), path))
    return routes


def test_every_admin_route_survives_bad_arguments(references, rel_server, tokenizer):
    routes = admin_routes(rel_server.url)
    assert len(routes) > 40 and ("POST", "/update_weights_from_disk") in routes
    seen = {}
    for method, path in routes:
        for body in ({}, {"model_path": 7, "rid": [1], "x": "y"}):
            r = requests.request(method, rel_server.url + path, headers=ADMIN_AUTH, json=body,
                                 timeout=120)
            seen[(method, path)] = r.status_code
            if path == "/pause_generation":  # paused by design: resume before the next call
                requests.post(f"{rel_server.url}/continue_generation", headers=ADMIN_AUTH,
                              json={}, timeout=60).raise_for_status()
            assert requests.get(f"{rel_server.url}/health", timeout=60).status_code == 200, (
                method, path, body, r.status_code)
    print(f"\n{len(routes)} admin routes, statuses: {sorted(set(seen.values()))}")
    assert same_as_plain_decoding(rel_server, references, tokenizer, "after-crash")
    assert_idle(rel_server)


VOCAB = 49152
EDGE_INTS = st.sampled_from([-2**63, -2**31, -1, 0, 1, 2, VOCAB - 1, VOCAB, 2**31, 2**63 - 1])
EDGE_FLOATS = st.sampled_from([-1e308, -1.0, 0.0, 1e-30, 0.5, 1.0, 2.0, 1e308])
VALUES = st.one_of(EDGE_INTS, EDGE_FLOATS, st.none(), st.booleans(), st.text(max_size=4),
                   st.lists(EDGE_INTS, max_size=3),
                   st.dictionaries(st.sampled_from(["0", "5", str(VOCAB)]), EDGE_FLOATS,
                                   max_size=2))
PARAMS = ["temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
          "repetition_penalty", "min_new_tokens", "stop_token_ids", "n", "ignore_eos",
          "logit_bias", "sampling_seed", "stream_interval", "no_stop_trim", "stop"]
REQUEST = ["return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob"]


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(PARAMS), VALUES, max_size=4),
       st.dictionaries(st.sampled_from(REQUEST), VALUES, max_size=3))
def test_fuzzed_sampling_params_never_kill_the_scheduler(rel_server, params, fields):
    params = {**params, "max_new_tokens": 2}
    if params.get("min_new_tokens") not in (None, 0, 1, 2):
        params["min_new_tokens"] = 2  # bounded work per case
    r = requests.post(f"{rel_server.url}/generate", headers=AUTH, timeout=300,
                      json={"text": "Hello there", "sampling_params": params, **fields})
    assert r.status_code < 500, (params, fields, r.status_code, r.text[:300])
    assert requests.get(f"{rel_server.url}/health", timeout=60).status_code == 200


def test_server_still_idle_and_lossless_after_the_crash_cases(references, rel_server,
                                                             tokenizer):
    assert same_as_plain_decoding(rel_server, references, tokenizer, "after-crash")
    assert_idle(rel_server)


if __name__ == "__main__":  # the cases against any running server (e.g. one of 780c26f)
    url, key, admin_key = sys.argv[1:4]
    AUTH.update(Authorization=f"Bearer {key}")
    ADMIN_AUTH.update(Authorization=f"Bearer {admin_key}")
    for name, admin, path, body, _status, _words in CRASHES + FORMERLY_500:
        try:
            r = send(url, admin, path, body)
            got = f"{r.status_code} {r.text[:120]!r}"
        except requests.RequestException as exc:
            got = f"no answer ({type(exc).__name__})"
        try:
            alive = requests.get(f"{url}/health", timeout=10).status_code
        except requests.RequestException as exc:
            alive = type(exc).__name__
        print(f"{name}: {got}; /health then: {alive}", flush=True)

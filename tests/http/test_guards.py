"""RequestGuard (domino_sglang/http/guards.py) on a small FastAPI app: the bodies SGLang 0.5.23
answers with a 500 become 400s in its OpenAI error shape; every other body reaches the endpoint
byte for byte. (The same guard inside the real server: tests/reliability/test_bad_requests.py.)"""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from domino_sglang.http.guards import RequestGuard, body_problem


@pytest.fixture(scope="module")
def client():
    app = FastAPI()

    @app.post("/v1/chat/completions")
    @app.post("/generate")
    async def echo(request: Request):
        return {"received": (await request.body()).decode()}

    app.add_middleware(RequestGuard)
    return TestClient(app)


@pytest.mark.parametrize("body,problem", [
    (b"[1, 2, 3]", "the request body must be a JSON object, not a JSON list"),
    (b"null", "the request body must be a JSON object, not a JSON NoneType"),
    (b'{"response_format": true}', "response_format must be an object"),
    (b'{"response_format": "json_object"}', "response_format must be an object"),
])
def test_bad_shapes_are_400s_naming_the_problem(client, body, problem):
    r = client.post("/v1/chat/completions", content=body,
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    out = r.json()
    assert out["object"] == "error" and out["code"] == 400 and problem in out["message"]


@pytest.mark.parametrize("body", [
    b'{"model": "m", "messages": [], "response_format": {"type": "json_object"}}',
    b'{"response_format": null}',
    b'{"model": "m", "messages": [',  # not JSON: SGLang's own 400 reports it
    b"",
    json.dumps({"messages": [{"role": "user", "content": "x" * 200_000}]}).encode(),
])
def test_other_bodies_pass_through_unchanged(client, body):
    r = client.post("/v1/chat/completions", content=body,
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["received"] == body.decode()


def test_only_openai_routes_are_checked(client):
    r = client.post("/generate", content=b"[1, 2]", headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["received"] == "[1, 2]"


def test_problem_helper():
    assert body_problem("/v1/chat/completions", b'{"messages": []}') is None
    assert body_problem("/v1/chat/completions", b"not json") is None
    assert "JSON int" in body_problem("/v1/chat/completions", b"7")

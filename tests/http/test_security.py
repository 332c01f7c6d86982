"""Access rules (domino_sglang/http/access.py), the request guard's size / depth / schema / logprob
checks (guards.py) and the plugin's server flags (server_flags.py), in process: the pure
decisions, then both middlewares on a small FastAPI app with SGLang's own auth levels. The same
rules inside a real server, route by route: tests/reliability/test_security.py and
tests/reliability/test_crash_survival.py."""

from __future__ import annotations

import argparse

import pytest
from fastapi import FastAPI, Request, WebSocket
from fastapi.testclient import TestClient
from sglang.srt.utils.auth import AuthLevel, auth_level
from starlette.websockets import WebSocketDisconnect

from domino_sglang.http import flags as http_flags
from domino_sglang.http.access import AccessGuard, AccessRules, access_problem
from domino_sglang.http.guards import (
    MAX_JSON_DEPTH,
    RequestGuard,
    body_problem,
    json_depth,
    ref_cycle,
)
from domino_sglang.integration import server_flags

LOCAL = {"host": "127.0.0.1:30000"}


def rules(**kw) -> AccessRules:
    return AccessRules(**{"bind_host": "127.0.0.1", **kw})


def problem(r: AccessRules, path: str = "/v1/models", admin: bool = False, kind: str = "http",
            **headers):
    return access_problem(r, kind=kind, path=path, headers={**LOCAL, **headers},
                          admin_route=admin)


def test_admin_routes_need_the_admin_key_and_are_refused_without_one():
    keyless, ordinary = rules(), rules(api_key="k")
    both = rules(api_key="k", admin_api_key="adm")
    for r in (keyless, ordinary):  # no --admin-api-key: refused to everyone
        refusal = problem(r, "/flush_cache", admin=True, authorization="Bearer k")
        assert refusal.status == 403 and "--admin-api-key" in refusal.message
    assert problem(both, "/flush_cache", admin=True, authorization="Bearer k").status == 401
    assert problem(both, "/flush_cache", admin=True).status == 401
    assert problem(both, "/flush_cache", admin=True, authorization="Bearer adm") is None
    # SGLang's own post-warm-up call keeps working with the ordinary key
    assert problem(ordinary, "/freeze_gc", admin=True, authorization="Bearer k") is None
    assert problem(keyless, "/v1/models") is None  # ordinary routes: SGLang's key check


def test_host_header_checked_on_loopback_binds_only():
    assert problem(rules(), host="localhost:1234") is None
    assert problem(rules(), host="[::1]:1234") is None
    refusal = problem(rules(), host="evil.example:30000")
    assert refusal.status == 400 and "evil.example" in refusal.message
    assert problem(rules(allowed_hosts=("evil.example",)), host="evil.example:30000") is None
    assert problem(rules(allowed_hosts=("*",)), host="anything") is None
    assert problem(rules(bind_host="0.0.0.0"), host="my-service.svc:80") is None


def test_cross_origin_requests_refused_unless_allowed():
    refusal = problem(rules(), origin="https://evil.example")
    assert refusal.status == 403 and "--domino-allowed-origins" in refusal.message
    assert problem(rules(), origin="null").status == 403
    assert problem(rules(), origin="http://127.0.0.1:30000") is None  # same origin (/docs)
    assert problem(rules(allowed_origins=("https://app.example",)),
                   origin="https://app.example") is None
    assert problem(rules(allowed_origins=("*",)), origin="https://x.example") is None
    # probes stay open to cross-origin callers too? no: Origin is checked before the path
    assert problem(rules(), "/health", origin="https://evil.example").status == 403


def test_websocket_needs_the_api_key():
    r = rules(api_key="k")
    assert problem(r, "/v1/realtime", kind="websocket").status == 401
    assert problem(r, "/v1/realtime", kind="websocket", authorization="Bearer x").status == 401
    assert problem(r, "/v1/realtime", kind="websocket", authorization="Bearer k") is None
    assert problem(r, "/v1/realtime", kind="websocket",
                   **{"sec-websocket-protocol": "realtime, openai-insecure-api-key.k"}) is None
    assert problem(rules(), "/v1/realtime", kind="websocket") is None  # keyless server


def test_json_depth_and_ref_cycles():
    assert json_depth(b'{"a": [1, {"b": "[[[[{{{{"}]}') == 3  # brackets in strings ignored
    assert json_depth(b'"\\"[[["') == 0
    assert json_depth(b"[" * 100_000) == 100_000
    assert ref_cycle({"$ref": "#"}) == "#"
    assert ref_cycle({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}) == "#/$defs/a"
    recursive_but_fine = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    assert ref_cycle(recursive_but_fine) is None
    assert ref_cycle({"$ref": "#/$defs/missing"}) is None  # the grammar compiler reports it


@pytest.mark.parametrize("path,body,words", [
    ("/generate", b"[" * (MAX_JSON_DEPTH + 1), "nests deeper than 64"),
    ("/v1/chat/completions", b'{"top_logprobs": 21}', "top_logprobs must be between 0 and 20"),
    ("/v1/chat/completions", b'{"top_logprobs": -1}', "top_logprobs must be between 0 and 20"),
    ("/v1/completions", b'{"logprobs": 100000}', "logprobs must be between 0 and 20"),
    ("/v1/chat/completions", b'{"response_format": {"type": "json_schema", "json_schema": '
     b'{"name": "x", "schema": {"$ref": "#"}}}}', "refers back to itself"),
])
def test_body_problems(path, body, words):
    assert words in body_problem(path, body)


def test_parallel_samples_capped():
    assert "n must be between 1 and 128" in body_problem("/v1/chat/completions", b'{"n": 129}')
    for params in (b'{"n": 2147483648}', b'{"n": null}', b'[{"n": 1}, {"n": 500}]'):
        assert "sampling_params.n must be" in body_problem(
            "/generate", b'{"text": "x", "sampling_params": ' + params + b"}")
    assert body_problem("/generate", b'{"sampling_params": {"n": 128}}') is None
    assert body_problem("/v1/completions", b'{"n": 3}') is None


def test_generate_sampling_params_list_covers_the_batch():
    """A list of sampling_params covers every prompt (text or token-id batches), repeated n
    times for parallel sampling as SGLang reads it; SGLang answers 500 for a shorter one."""
    def problem(body: str):
        return body_problem("/generate", body.encode())

    assert "a list of 1 but the batch has 2 prompts" in problem(
        '{"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 2}]}')
    assert "a list of 2 but the batch has 3 prompts" in problem(
        '{"input_ids": [[1, 2], [3], [4]], "sampling_params": [{}, {}]}')
    assert "a list of 0 but" in problem('{"text": ["a"], "sampling_params": []}')
    for fine in ('{"text": ["a", "b"], "sampling_params": [{}, {}]}',
                 '{"text": ["a", "b"], "sampling_params": [{}, {}, {}]}',  # extra: ignored
                 '{"text": ["a", "b"], "sampling_params": [{"n": 2}]}',  # read over n
                 '{"text": "a", "input_ids": [[1], [2]], "sampling_params": [{}]}',
                 '{"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}}',
                 '{"input_ids": [1, 2], "sampling_params": {}}',
                 '{"text": "a", "sampling_params": {"temperature": 0}}'):
        assert problem(fine) is None, fine


def test_ordinary_bodies_have_no_problem():
    assert body_problem("/v1/chat/completions", b'{"top_logprobs": 20, "logprobs": true}') is None
    assert body_problem("/v1/chat/completions", b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
                        ) is not None  # a list body: the shape check still applies
    assert body_problem("/generate", b'{"top_logprobs_num": 5}') is None


@pytest.fixture(scope="module")
def app_client():
    app = FastAPI()

    @app.post("/v1/chat/completions")
    @app.post("/generate")
    async def echo(request: Request):
        return {"received": len(await request.body())}

    @app.post("/flush_cache")
    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def flush():
        return {"flushed": True}

    @app.get("/start_expert_distribution_record")
    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def expert():
        raise AssertionError("must not be reached")

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket):
        await ws.accept()
        await ws.send_text("hello")
        await ws.close()

    app.add_middleware(RequestGuard, max_bytes=4096,
                       server_args=argparse.Namespace(expert_distribution_recorder_mode=None))
    app.add_middleware(AccessGuard, rules=rules(api_key="k", admin_api_key="adm"),
                       fastapi_app=app)
    return TestClient(app, base_url="http://127.0.0.1:30000")


def test_middlewares_in_an_app(app_client):
    ok = app_client.post("/generate", content=b"x" * 4096)
    assert ok.status_code == 200 and ok.json() == {"received": 4096}
    big = app_client.post("/generate", content=b"x" * 4097)
    assert big.status_code == 413 and "--domino-max-request-bytes" in big.json()["message"]
    streamed = app_client.post("/generate", content=iter([b"x" * 3000, b"x" * 3000]))
    assert streamed.status_code == 413  # no Content-Length: counted as it arrives
    assert app_client.post("/flush_cache", headers={"Authorization": "Bearer k"}
                           ).status_code == 401
    assert app_client.post("/flush_cache", headers={"Authorization": "Bearer adm"}
                           ).json() == {"flushed": True}
    expert = app_client.get("/start_expert_distribution_record",
                            headers={"Authorization": "Bearer adm"})
    assert expert.status_code == 400 and "--expert-distribution-recorder-mode" in expert.text
    evil = app_client.post("/generate", content=b"{}", headers={"Host": "evil.example"})
    assert evil.status_code == 400
    ws_url = "ws://127.0.0.1:30000/v1/realtime"
    with pytest.raises(WebSocketDisconnect) as closed, app_client.websocket_connect(ws_url) as ws:
        ws.receive_text()
    assert closed.value.code == 1008 and "API key" in closed.value.reason
    with app_client.websocket_connect(ws_url,
                                      headers={"Authorization": "Bearer k"}) as ws:
        assert ws.receive_text() == "hello"


def test_flags_parse_and_name_the_bad_value(capsys):
    parser = argparse.ArgumentParser()
    server_flags.add_flags(parser)
    server_flags.add_flags(parser)  # idempotent
    ns = parser.parse_args(["--domino-allowed-origins", "https://a.example, https://b.example",
                            "--domino-max-request-bytes", "65536"])
    opts = http_flags.read_flags(ns)
    assert opts.allowed_origins == ("https://a.example", "https://b.example")
    assert opts.max_request_bytes == 65536 and opts.allowed_hosts == ()
    with pytest.raises(SystemExit):
        parser.parse_args(["--domino-max-request-bytes", "12"])
    assert "--domino-max-request-bytes: must be at least 1024 bytes" in capsys.readouterr().err
    http_flags.read_flags(parser.parse_args([]))  # back to the defaults
    assert http_flags.current() == http_flags.HttpOptions()


def test_request_guards_flag_switches_the_request_checks(capsys):
    """--domino-request-guards off (server_flags.py): the token-id checks of guards.py let
    requests through to SGLang; on (the default) they refuse an out-of-vocabulary id."""
    from types import SimpleNamespace

    from domino_sglang.http.guards import check_input_ids

    parser = argparse.ArgumentParser()
    server_flags.add_flags(parser)
    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=10),
                              server_args=SimpleNamespace(speculative_algorithm="DOMINO"))
    request = SimpleNamespace(top_logprobs_num=None, token_ids_logprob=None)
    try:
        assert http_flags.read_flags(parser.parse_args([])).request_guards
        with pytest.raises(ValueError, match="input_ids"):
            check_input_ids(manager, request, [1, 99])
        off = http_flags.read_flags(parser.parse_args(["--domino-request-guards", "off"]))
        assert not off.request_guards
        assert check_input_ids(manager, request, [1, 99]) is None  # SGLang's own handling
        with pytest.raises(SystemExit):
            parser.parse_args(["--domino-request-guards", "sometimes"])
        assert ("--domino-request-guards: must be on/off (or true/false, 1/0), got 'sometimes'"
                in capsys.readouterr().err)
    finally:
        http_flags.read_flags(parser.parse_args([]))


def test_only_the_servers_that_asked_are_guarded(monkeypatch):
    """The plugin is loaded by every SGLang server in the environment; only a DOMINO server or
    one given --domino-guards on (as `domino-sglang serve` passes it) gets the guards, the access
    rules and the log redaction. Any other keeps stock SGLang's app and request handling."""
    import sys
    from types import ModuleType, SimpleNamespace

    from domino_sglang import sglang_compat
    from domino_sglang.http import guards

    parser = argparse.ArgumentParser()
    server_flags.add_flags(parser)
    plain = SimpleNamespace(speculative_algorithm=None, host="127.0.0.1", api_key=None,
                            admin_api_key=None, expert_distribution_recorder_mode=None)
    domino = SimpleNamespace(**{**vars(plain), "speculative_algorithm": "DOMINO"})
    request = SimpleNamespace(top_logprobs_num=None, token_ids_logprob=None)

    def served(server_args, argv: list[str]) -> tuple[list, bool]:
        """(the app's middleware after the launch hook, whether an out-of-vocabulary id is
        refused) for a server started with `argv`."""
        http_flags.read_flags(parser.parse_args(argv))
        http = ModuleType(sglang_compat.HTTP_SERVER)
        http.app = FastAPI()
        monkeypatch.setitem(sys.modules, sglang_compat.HTTP_SERVER, http)
        guards.install_http_guards(server_args)
        manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=10),
                                  server_args=server_args)
        try:
            guards.check_input_ids(manager, request, [1, 99])
            refused = False
        except ValueError:
            refused = True
        return [m.cls.__name__ for m in http.app.user_middleware], refused

    try:
        assert served(plain, []) == ([], False)  # stock: nothing added, SGLang's own handling
        assert served(plain, ["--domino-guards", "off"]) == ([], False)
        assert served(plain, ["--domino-guards", "on"]) == (["AccessGuard", "RequestGuard"], True)
        assert served(domino, []) == (["AccessGuard", "RequestGuard"], True)
        assert served(domino, ["--domino-request-guards", "off"]) == (["AccessGuard"], False)
    finally:
        http_flags.read_flags(parser.parse_args([]))
    wanted = http_flags.guards_wanted
    assert not wanted(["sglang", "serve", "--model-path", "m", "--api-key", "k"])
    assert wanted(["sglang", "serve", "--speculative-algorithm=domino"])
    assert wanted(["sglang", "serve", "--domino-guards", "on"])
    assert not wanted(["sglang", "serve", "--speculative-algorithm", "DOMINO",
                       "--domino-guards", "off"])


def test_serve_guards_its_servers_unless_told_otherwise(target_path):
    from domino_sglang import cli
    from domino_sglang.cli import serve

    for extra, want in (([], "on"), (["--domino-guards", "off"], "off")):
        ns = cli.make_parser().parse_args(["serve", "--model-path", str(target_path),
                                           "--device", "cpu", "--no-speculation"])
        cmd, _ = serve.build_serve_command(ns, extra)
        assert cmd[len(cmd) - 1 - cmd[::-1].index("--domino-guards") + 1] == want

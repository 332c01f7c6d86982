"""The plugin changes only the servers that asked for it: a plain `sglang serve` (no DOMINO) in
this venv, with the plugin loaded as SGLang loads it, answers like the same server with the
plugin disabled (SGLANG_PLUGINS names another plugin), route for route."""

from __future__ import annotations

import pytest
import requests

from domino_sglang.cpu.dtype import default_cpu_dtype
from tests.harness.servers import start_server
from tests.reliability.test_security import route_levels

# Routes left out of the walk: each changes the server for the requests after it (profiling,
# paused generation, released memory, new weights, logging, ...) or, on a CPU, kills a stock
# scheduler (guards.ROUTE_NEEDS); the walk must leave both servers as they were.
STATEFUL = ("profile", "pause", "continue_generation", "memory_occupation", "slow_down",
            "weight", "lora", "expert_distribution", "configure_logging", "set_internal_state",
            "set_trace_level", "pd_role_switch", "abort_request", "hicache", "corpus",
            "remote_instance", "freeze_gc", "session")
FOREIGN = {"Origin": "https://evil.example", "Host": "evil.example"}  # refused by either rule


@pytest.fixture(scope="module")
def servers(target_path):
    """(plugin loaded, plugin disabled): the same plain SGLang launch, keyless, loopback."""
    argv = ["--model-path", str(target_path), "--host", "127.0.0.1", "--model-type", "llm",
            "--device", "cpu", "--attention-backend", "torch_native", "--dtype",
            default_cpu_dtype(), "--max-total-tokens", "4096", "--mem-fraction-static", "0.8",
            "--sleep-on-idle"]
    env = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
    # a plugin flag: stock SGLang would refuse it, so this server did load the plugin; on a
    # server that did not ask for the guards it must change nothing
    loaded = start_server("scope-plugin", [], argv + ["--domino-max-request-bytes", "4096"],
                          env=env, stock=True)
    try:
        disabled = start_server("scope-stock", [], argv, stock=True,
                                env={**env, "SGLANG_PLUGINS": "no-such-plugin"})
        try:
            yield loaded, disabled
        finally:
            disabled.stop()
    finally:
        loaded.stop()


def answer(url: str, method: str, path: str, headers: dict) -> tuple[int, str | None]:
    r = requests.request(method, url + path, headers=headers, json={}, timeout=120)
    return r.status_code, r.headers.get("access-control-allow-origin")


@pytest.mark.server
def test_a_plain_server_behaves_as_stock_sglang(servers):
    loaded, disabled = servers
    schema = requests.get(f"{loaded.url}/openapi.json", timeout=60).json()
    routes = [(m.upper(), p.replace("{model}", "default").replace("{response_id}", "x"))
              for p, ops in schema["paths"].items() for m in ops
              if not any(word in p for word in STATEFUL)]
    assert len(routes) > 40 and ("POST", "/flush_cache") in routes
    levels = route_levels()
    assert any(levels.get(r) for r in routes)  # admin routes are in the walk
    differ = []
    for method, path in routes:
        for headers in ({}, FOREIGN):
            got, want = (answer(s.url, method, path, headers) for s in (loaded, disabled))
            if got != want:
                differ.append((method, path, headers, got, want))
    assert differ == [], differ
    # what a guarded server refuses, a plain one serves as stock does
    chat = {"model": "default", "max_tokens": 1, "logprobs": True, "top_logprobs": 25,
            "messages": [{"role": "user", "content": "hi " + "x" * 5000}]}  # > 4096 bytes
    for s in (loaded, disabled):
        assert requests.post(f"{s.url}/v1/chat/completions", json=chat,
                             timeout=120).status_code == 200
        assert requests.post(f"{s.url}/flush_cache", timeout=60).status_code == 200

"""Scale-out: two DOMINO replicas behind SGLang's own router (sglang-router, cache-aware policy,
as in deploy/docker-compose.yml), all on loopback. Requests spread over both replicas, and
greedy output through the router equals plain decoding (float32 AR server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from domino_sglang.cli.local_server import LOG_DIR, free_port
from tests.conftest import PROMPTS
from tests.harness.servers import start_server

pytestmark = pytest.mark.server
NEW_TOKENS = 24


def _replica(name: str):
    # the shipped drafter (serve's default), adaptive policy on: what a replica really runs
    return start_server(name, ["--dtype", "float32", "--max-total-tokens", "4096"])


@pytest.fixture(scope="module")
def replicas(target_path):
    pytest.importorskip("sglang_router")
    with ThreadPoolExecutor(2) as pool:  # start both at once (start-up is mostly imports)
        started = list(pool.map(_replica, ["replica-0", "replica-1"]))
    yield started
    for server in started:
        server.stop()


def _launch_router(replicas) -> tuple[subprocess.Popen, str, Path] | None:
    """Start the router on fresh loopback ports and wait for /health: (process, url, log), or
    None when one of its ports was taken before it bound it (free_port only found it free)."""
    port, metrics_port = free_port(), free_port()
    log_path = LOG_DIR / f"router-{port}.log"
    cmd = [sys.executable, "-m", "sglang_router.launch_router",
           "--worker-urls", *[r.url for r in replicas], "--policy", "cache_aware",
           # balance as soon as loads differ: the prompts share the chat template's system
           # prefix, so pure cache affinity would (rightly) send this small burst to one replica
           "--balance-abs-threshold", "0", "--balance-rel-threshold", "1.0",
           "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            log = log_path.read_text(errors="replace")
            if "in use" in log.lower():
                return None
            raise AssertionError(f"router exited:\n{log[-3000:]}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, log_path
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            _stop(proc)
            raise AssertionError(f"router not up:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def router(replicas):
    for _ in range(3):  # a port taken between free_port() and the bind: new ports
        launched = _launch_router(replicas)
        if launched is not None:
            break
    else:
        raise AssertionError("router: its ports were taken before it could bind, 3 times")
    proc, url, log_path = launched
    try:
        # the router answers /health before its workers are registered (in the background):
        # wait until /workers lists both replicas
        deadline = time.monotonic() + 120
        while not all(r.url in requests.get(f"{url}/workers", timeout=10).text for r in replicas):
            assert time.monotonic() < deadline, (
                f"router: replicas not registered:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        _stop(proc)


def _generate(url: str, ids: list[int]) -> list[int]:
    r = requests.post(f"{url}/generate", json={
        "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS},
    }, timeout=600)
    r.raise_for_status()
    return r.json()["output_ids"]


def _requests_served(server) -> float:
    """sglang:num_requests_total (finished requests) from the replica's own /metrics."""
    total = 0.0
    for line in requests.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("sglang:num_requests_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def reference(ar_server_fp32, chat_ids) -> list[list[int]]:
    """Plain decoding's answers, computed before the replicas start (tests/harness/servers.py may
    stop the plain server to make room for them)."""
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda ids: _generate(ar_server_fp32.url, ids), chat_ids))


def test_router_spreads_requests_and_output_is_unchanged(reference, router, replicas, chat_ids):
    before = [_requests_served(r) for r in replicas]
    with ThreadPoolExecutor(8) as pool:
        routed = list(pool.map(lambda ids: _generate(router, ids), chat_ids))
    # chat completions go through the router too (OpenAI API, non-streaming)
    chat = requests.post(f"{router}/v1/chat/completions", json={
        "model": "default", "messages": [{"role": "user", "content": PROMPTS[0]}],
        "max_tokens": NEW_TOKENS, "temperature": 0}, timeout=600)
    assert chat.status_code == 200, chat.text
    served = [_requests_served(r) - b for r, b in zip(replicas, before)]
    print(f"\nrequests served per replica through the router: {served}")
    assert routed == reference  # greedy, token for token
    assert sum(served) == len(chat_ids) + 1  # nothing dropped or duplicated
    assert min(served) >= 1  # both replicas did work

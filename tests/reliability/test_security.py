"""Security defaults: loopback bind, `--api-key` on every endpoint SGLang protects, no secret in
the log or the printed command. (Drafters load only from safetensors, a pickle beside them is
refused, and a config's `auto_map` is metadata never executed: tests/test_drafter_loading.py::
test_bad_weights, test_pickles_beside_safetensors_are_refused, test_auto_map_anywhere_is_metadata.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from domino_sglang import cli
from domino_sglang.guards import install_log_redaction, redact_command
from tests.reliability.client import API_KEY, AUTH

# Open by design in SGLang 0.5.23 (utils/auth.py: probes and Prometheus scrapes need no secret):
# every path starting with one of these.
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def test_serve_command_passes_the_key_and_prints_it_redacted(target_path, capsys):
    args = cli.make_parser().parse_args(["serve", "--model-path", str(target_path),
                                         "--api-key", "k-123", "--device", "cpu"])
    cmd, _ = cli.build_serve_command(args, [])
    assert cmd[cmd.index("--api-key") + 1] == "k-123"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"  # loopback unless --host
    assert "--trust-remote-code" not in cmd
    shown = " ".join(redact_command(cmd + ["--admin-api-key=adm-9"]))
    assert "k-123" not in shown and "adm-9" not in shown
    assert "--api-key <redacted>" in shown and "--admin-api-key=<redacted>" in shown


def test_serve_dry_run_never_prints_the_key(target_path):
    env = {**os.environ, "DOMINO_SGLANG_API_KEY": "env-key-55"}
    proc = subprocess.run([sys.executable, "-m", "domino_sglang.cli", "serve", "--dry-run",
                           "--no-speculation", "--port", "0"], capture_output=True, text=True,
                          env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "--api-key <redacted>" in proc.stdout  # the env default is used ...
    assert "env-key-55" not in proc.stdout + proc.stderr  # ... and never shown


def test_log_records_are_redacted(caplog):
    import logging

    before = logging.getLogRecordFactory()
    try:
        assert install_log_redaction(["x", "--api-key", "tok-77"]) == ["tok-77"]
        with caplog.at_level("INFO"):
            logging.getLogger("sglang.test").info("server_args=%s", {"api_key": "tok-77"})
        assert "tok-77" not in caplog.text and "<redacted>" in caplog.text
    finally:
        logging.setLogRecordFactory(before)


@pytest.mark.server
def test_api_key_guards_every_endpoint_but_probes_and_metrics(rel_server):
    schema = requests.get(f"{rel_server.url}/openapi.json", headers=AUTH, timeout=60)
    assert schema.status_code == 200
    assert requests.get(f"{rel_server.url}/openapi.json", timeout=60).status_code == 401
    routes = [(method.upper(), path) for path, ops in schema.json()["paths"].items()
              for method in ops]
    assert len(routes) > 40 and ("POST", "/v1/chat/completions") in routes
    refused, open_ = [], []
    for method, path in routes:
        url = rel_server.url + path.replace("{model}", "default").replace(
            "{response_id}", "x").replace("{method}", "x")
        for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": API_KEY}):
            r = requests.request(method, url, headers=headers, json={}, timeout=120)
            if path.startswith(OPEN_PREFIXES):
                open_.append(path)
                assert r.status_code not in (401, 403), (method, path)
            else:
                refused.append(path)
                # 403: ADMIN_FORCE endpoints, refused to everyone without --admin-api-key
                assert r.status_code in (401, 403), (method, path, headers, r.status_code)
    assert "/health" in open_ and "/v1/models" in refused and "/generate" in refused
    # /metrics is mounted outside the OpenAPI schema; open too
    assert requests.get(f"{rel_server.url}/metrics", timeout=60).status_code == 200
    print(f"\n{len(set(refused))} paths refused without the key, open: {sorted(set(open_))}")
    # with the key: served
    ok = requests.get(f"{rel_server.url}/v1/models", headers=AUTH, timeout=60)
    assert ok.status_code == 200 and ok.json()["data"]


@pytest.mark.server
def test_server_log_holds_no_secret_and_binds_loopback(rel_server):
    assert API_KEY not in rel_server.log()
    assert "--api-key <redacted>" in rel_server.log()  # our printed command
    # the listening socket is 127.0.0.1 only (/proc/net/tcp: 0100007F = 127.0.0.1, state 0A)
    port = f"{rel_server.port:04X}"
    listening = [line.split()[1] for line in open("/proc/net/tcp").read().splitlines()[1:]
                 if line.split()[1].endswith(":" + port) and line.split()[3] == "0A"]
    assert listening == [f"0100007F:{port}"], listening

"""Security defaults: loopback bind, `--api-key` on every API route, `--admin-api-key` on every
admin route, no CORS, foreign Host names and cross-origin requests refused, the realtime
websocket behind the key, no secret in the log or the printed command. (Drafters load only from
safetensors, a pickle beside them is refused, and a config's `auto_map` is metadata never
executed: tests/model/test_drafter_loading.py::test_bad_weights,
test_pickles_beside_safetensors_are_refused, test_auto_map_anywhere_is_metadata.)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest
import requests

from domino_sglang import cli
from domino_sglang.cli import serve
from domino_sglang.http.guards import install_log_redaction, redact_command
from tests.reliability.client import ADMIN_AUTH, ADMIN_KEY, API_KEY, AUTH

# Open by design in SGLang 0.5.23 (utils/auth.py: probes and Prometheus scrapes need no secret):
# every path starting with one of these.
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def test_serve_command_passes_the_key_and_prints_it_redacted(target_path, capsys):
    args = cli.make_parser().parse_args(["serve", "--model-path", str(target_path),
                                         "--api-key", "k-123", "--device", "cpu"])
    cmd, _ = serve.build_serve_command(args, [])
    assert cmd[cmd.index("--api-key") + 1] == "k-123"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"  # loopback unless --host
    assert "--trust-remote-code" not in cmd
    shown = " ".join(redact_command(cmd + ["--admin-api-key=adm-9"]))
    assert "k-123" not in shown and "adm-9" not in shown
    assert "--api-key <redacted>" in shown and "--admin-api-key=<redacted>" in shown


def test_serve_reads_keys_from_files(target_path, tmp_path, monkeypatch):
    """--api-key-file / --admin-api-key-file: the path goes to SGLang as the plugin's key-file
    flag (the key on no command line), and no key is read from the environment; SGLang's parse,
    through the plugin's hook, sets api_key from it; every bad file or a key given twice is one
    line."""
    from domino_sglang.http import flags as http_flags
    from domino_sglang.integration import server_flags
    from domino_sglang.spec.options import DominoOptionError

    monkeypatch.setenv("DOMINO_SGLANG_API_KEY", "env-key-55")  # an old setting, ignored
    monkeypatch.setenv("DOMINO_SGLANG_ADMIN_API_KEY", "adm-env-3")
    key, admin = tmp_path / "key", tmp_path / "admin"
    key.write_text("file-key-1\n")
    admin.write_text("  adm-file-2  ")
    args = cli.make_parser().parse_args(["serve", "--model-path", str(target_path), "--device",
                                         "cpu", "--api-key-file", str(key),
                                         "--admin-api-key-file", str(admin)])
    cmd, _ = serve.build_serve_command(args, [])
    assert cmd[cmd.index("--domino-api-key-file") + 1] == str(key)
    assert cmd[cmd.index("--domino-admin-api-key-file") + 1] == str(admin)
    assert "--api-key" not in cmd and not [a for a in cmd if "key-" in a and "file" not in a]
    bare = cli.make_parser().parse_args(["serve", "--model-path", str(target_path), "--device",
                                         "cpu"])
    cmd, _ = serve.build_serve_command(bare, [])
    assert not {"--api-key", "--admin-api-key", "env-key-55", "adm-env-3"} & set(cmd)
    namespace = argparse.Namespace(api_key=None, admin_api_key=None, domino_api_key_file=str(key),
                                   domino_admin_api_key_file=str(admin))
    http_flags.apply_key_files(namespace)
    assert (namespace.api_key, namespace.admin_api_key) == ("file-key-1", "adm-file-2")
    assert install_log_redaction(["x", "--domino-api-key-file", str(key)]) == ["file-key-1"]
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for argv, message in (
            (["--domino-api-key-file", str(tmp_path / "missing")],
             "--domino-api-key-file .*missing: cannot read it"),
            (["--domino-admin-api-key-file", str(empty)],
             "--domino-admin-api-key-file .*empty: the file is empty"),
            (["--api-key", "k", "--domino-api-key-file", str(key)],
             "--api-key and --domino-api-key-file are both given")):
        with pytest.raises(DominoOptionError, match=message):
            server_flags.check_flags(argv)
    for argv, message in ((["--api-key", "k", "--api-key-file", str(key)], "both given"),
                          (["--api-key-file", str(empty)], "--api-key-file .*: the file is empty")):
        proc = subprocess.run([sys.executable, "-m", "domino_sglang.cli", "serve", "--dry-run",
                               "--no-speculation", "--port", "0", *argv], capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert proc.returncode != 0 and re.search(message, proc.stderr), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_serve_dry_run_never_prints_the_key(target_path):
    proc = subprocess.run([sys.executable, "-m", "domino_sglang.cli", "serve", "--dry-run",
                           "--no-speculation", "--port", "0", "--api-key", "flag-key-55"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "--api-key <redacted>" in proc.stdout  # the key is passed on ...
    assert "flag-key-55" not in proc.stdout + proc.stderr  # ... and never shown


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


def route_levels() -> dict[tuple[str, str], bool]:
    """(METHOD, path) -> whether SGLang marks the route admin (ADMIN_OPTIONAL / ADMIN_FORCE),
    read from SGLang's own app, independently of the server under test."""
    from sglang.srt.entrypoints.http_server import app
    from sglang.srt.utils.auth import AuthLevel

    admin = (AuthLevel.ADMIN_OPTIONAL, AuthLevel.ADMIN_FORCE)
    return {(method, route.path): getattr(route.endpoint, "_auth_level", None) in admin
            for route in app.routes if getattr(route, "methods", None)
            for method in route.methods if method != "HEAD"}


@pytest.mark.server
def test_each_key_unlocks_exactly_its_routes(rel_server):
    """No key / a wrong key: every route but probes and metrics refused. The ordinary key:
    every route but the admin ones. The admin key: the admin routes (README "Security")."""
    levels = route_levels()
    schema = requests.get(f"{rel_server.url}/openapi.json", headers=AUTH, timeout=60)
    assert schema.status_code == 200
    assert requests.get(f"{rel_server.url}/openapi.json", timeout=60).status_code == 401
    routes = [(method.upper(), path) for path, ops in schema.json()["paths"].items()
              for method in ops]
    assert len(routes) > 40 and ("POST", "/v1/chat/completions") in routes
    admin_routes = [r for r in routes if levels.get(r)]
    assert len(admin_routes) > 40 and ("POST", "/update_weights_from_disk") in admin_routes
    refused, open_ = set(), set()
    for method, path in routes:
        url = rel_server.url + path.replace("{model}", "default").replace(
            "{response_id}", "x").replace("{method}", "x")
        admin = levels.get((method, path), False)
        for headers in ({}, {"Authorization": "Bearer wrong-key"}, AUTH):
            r = requests.request(method, url, headers=headers, json={}, timeout=120)
            if path.startswith(OPEN_PREFIXES) or (headers is AUTH and not admin):
                open_.add(path)
                assert r.status_code not in (401, 403), (method, path, headers, r.status_code)
            else:
                refused.add(path)
                assert r.status_code in (401, 403), (method, path, headers, r.status_code)
    assert "/health" in open_ and "/v1/models" in open_ and "/flush_cache" in refused
    # /metrics is mounted outside the OpenAPI schema; open too
    assert requests.get(f"{rel_server.url}/metrics", timeout=60).status_code == 200
    print(f"\n{len(routes)} routes, {len(admin_routes)} admin (need the admin key)")
    # the admin key opens an admin route; the ordinary key does not
    flush = f"{rel_server.url}/flush_cache"
    assert requests.post(flush, headers=AUTH, timeout=60).status_code == 401
    assert requests.post(flush, headers=ADMIN_AUTH, timeout=60).status_code == 200


@pytest.mark.server
def test_browsers_and_foreign_hosts_are_refused(rel_server):
    """CORS off, cross-origin requests and foreign Host names refused (DNS rebinding)."""
    url = f"{rel_server.url}/v1/models"
    assert requests.get(url, headers=AUTH, timeout=60).status_code == 200
    page = requests.get(url, headers={**AUTH, "Origin": "https://evil.example"}, timeout=60)
    assert page.status_code == 403 and "access-control-allow-origin" not in page.headers
    preflight = requests.options(url, timeout=60, headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in preflight.headers
    rebound = requests.get(url, headers={**AUTH, "Host": f"evil.example:{rel_server.port}"},
                           timeout=60)
    assert rebound.status_code == 400 and "--domino-allowed-hosts" in rebound.text
    same = requests.get(url, headers={**AUTH, "Origin": rel_server.url}, timeout=60)
    assert same.status_code == 200  # the server's own pages (/docs) keep working


@pytest.mark.server
def test_realtime_websocket_needs_the_key(rel_server):
    import websocket

    ws_url = rel_server.url.replace("http://", "ws://") + "/v1/realtime"
    for headers in ([], ["Authorization: Bearer wrong-key"]):
        with pytest.raises(websocket.WebSocketException) as refused:
            websocket.create_connection(ws_url, header=headers, timeout=60).recv()
        print(f"\nrefused: {refused.value!r}")
    ws = websocket.create_connection(ws_url, header=[f"Authorization: {AUTH['Authorization']}"],
                                     timeout=60)
    try:  # accepted: the handshake completed (what SGLang's handler then says is its own)
        assert ws.connected
    finally:
        ws.close()


def _tree_command_lines(pid: int) -> list[str]:
    """The command lines of process `pid` and every descendant (/proc)."""
    lines, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            lines.append(open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace"))
            children = open(f"/proc/{p}/task/{p}/children").read().split()
        except OSError:
            continue  # gone meanwhile
        todo += [int(c) for c in children]
    return lines


@pytest.mark.server
def test_server_log_holds_no_secret_and_binds_loopback(rel_server):
    assert API_KEY not in rel_server.log()  # SGLang logs server_args: the file's key redacted
    assert ADMIN_KEY not in rel_server.log()  # ... as the admin key given on its command line
    assert "--domino-api-key-file" in rel_server.log()  # our printed command
    # the file's key is on no command line of the server's processes (the admin key is)
    lines = _tree_command_lines(rel_server.proc.pid)
    assert len(lines) >= 3, lines  # the launcher, its scheduler and detokenizer at least
    assert not [line for line in lines if API_KEY in line]
    assert any(ADMIN_KEY in line for line in lines)
    # the listening socket is 127.0.0.1 only (/proc/net/tcp: 0100007F = 127.0.0.1, state 0A)
    port = f"{rel_server.port:04X}"
    listening = [line.split()[1] for line in open("/proc/net/tcp").read().splitlines()[1:]
                 if line.split()[1].endswith(":" + port) and line.split()[3] == "0A"]
    assert listening == [f"0100007F:{port}"], listening

"""Start and stop local SGLang servers (through `domino-sglang serve`) for `regenerate`, the
tests and the benchmarks, and read their streamed responses.

Each server runs on a free loopback port in its own process group, with a pinned number of torch
threads, and is stopped by PID (the whole group). Servers still running when this process exits
(normally, by Ctrl-C, or by SIGTERM once `stop_servers_on_sigterm()` is installed, as the test
suite does) are stopped too: a CI time-out must not leave servers behind.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import requests

from domino_sglang.cli.serve import sglang_serve_argv

LOG_DIR = Path(os.environ.get("DOMINO_TEST_LOG_DIR", "/tmp/domino_sglang_test_logs"))
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL to the whole process group


def sse_chunks(response: requests.Response) -> Iterator[dict]:
    """The JSON chunks of a streamed (server-sent events) SGLang / OpenAI response, in order,
    without the closing `data: [DONE]`."""
    for line in response.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield json.loads(line[6:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(eq=False)
class Server:
    name: str
    port: int
    proc: subprocess.Popen
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        _running.discard(self)
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                # SGLang's launcher sleeps 5 s for crash diagnostics once its scheduler has
                # gone; nothing is left to save by then
                self.proc.wait(timeout=STOP_GRACE_S)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)


# What the log says when the HTTP port is taken: free_port() only found the port free a moment
# before the server binds it, and a busy machine (SGLang's own ZMQ / dist-init ports, other
# servers) can take it in between: `serve` refuses a taken port (cli/serve.py, exit 2), or, taken
# after that check, uvicorn logs its bind error and hangs in shutdown, so waiting for /health
# would run into the timeout. Either way the server is restarted on another port.
BIND_FAILED = ("is already in use; choose another --port", "error while attempting to bind")


def start_server(name: str, serve_args: list[str], sglang_args: list[str] | None = None,
                 timeout: float = 600.0, env: dict | None = None, threads: int = 1,
                 attempts: int = 3, stock: bool = False) -> Server:
    """Launch `domino-sglang serve` and wait until /health answers 200 (or fail with its log);
    a port taken before the server bound it is retried on a new port, `attempts` times in all.
    `stock`: SGLang's own `sglang serve SGLANG_ARGS` instead, as a user launches it (no
    `serve_args`; `env` must carry what the CPU needs: SGLANG_USE_CPU_ENGINE, OMP_NUM_THREADS)."""
    if stock and serve_args:
        raise ValueError("start_server: a stock SGLang launch takes no serve_args")
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    for _ in range(attempts):
        server = _launch(name, serve_args, sglang_args, env, threads, stock)
        try:
            if _wait_healthy(server, timeout):
                return server
        except BaseException:
            server.stop()
            raise
        server.stop()  # its port was taken: try another
    raise RuntimeError(f"server {name}: its port was taken before it could bind, {attempts} times"
                       f" (last log {server.log_path})")


def _launch(name: str, serve_args: list[str], sglang_args: list[str] | None, env: dict | None,
            threads: int, stock: bool = False) -> Server:
    port = free_port()
    log_path = LOG_DIR / f"{name}-{port}.log"
    if stock:
        cmd = [*sglang_serve_argv(), "--port", str(port), *(sglang_args or [])]
    else:
        cmd = [sys.executable, "-m", "domino_sglang.cli", "serve", "--port", str(port),
               "--threads", str(threads), *serve_args]
        if sglang_args:
            cmd += ["--", *sglang_args]
    full_env = {**os.environ, **(env or {})}
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=full_env, stdin=subprocess.DEVNULL, start_new_session=True)
    server = Server(name=name, port=port, proc=proc, log_path=log_path, args=cmd)
    _running.add(server)
    return server


_running: set[Server] = set()


@atexit.register
def stop_all() -> None:
    """Stop every server this process started and has not stopped yet."""
    for server in list(_running):
        server.stop()


def stop_servers_on_sigterm() -> None:
    """Turn SIGTERM into a normal exit, so `stop_all` runs (the default action skips atexit)."""
    def exit_on_sigterm(signum, _frame):
        stop_all()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_on_sigterm)


def port_taken(server: Server) -> bool:
    """Whether the server's log says its port was taken before it could bind it."""
    log = server.log()
    return any(message in log for message in BIND_FAILED)


def _wait_healthy(server: Server, timeout: float) -> bool:
    """True once /health answers 200; False if the port was taken (port_taken);
    raises if the server exits or is not healthy within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            if port_taken(server):
                return False
            raise RuntimeError(
                f"server {server.name} exited with {server.proc.returncode}:\n"
                f"{server.log()[-4000:]}")
        try:
            if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                return True
        except requests.RequestException:
            if port_taken(server):
                return False
        time.sleep(1.0)
    raise RuntimeError(f"server {server.name} not healthy after {timeout}s:\n"
                       f"{server.log()[-4000:]}")

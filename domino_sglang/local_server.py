"""Start and stop local SGLang servers (through `domino-sglang serve`) for tests and benchmarks,
and read their streamed responses.

Each server runs on a free loopback port in its own process group, with a pinned number of torch
threads, and is stopped by PID (the whole group).
"""

from __future__ import annotations

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

LOG_DIR = Path(os.environ.get("DOMINO_TEST_LOG_DIR", "/tmp/domino_sglang_test_logs"))


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


@dataclass
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
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)


def start_server(name: str, serve_args: list[str], sglang_args: list[str] | None = None,
                 timeout: float = 600.0, env: dict | None = None, threads: int = 1) -> Server:
    """Launch `domino-sglang serve` and wait until /health answers 200 (or fail with its log)."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = LOG_DIR / f"{name}-{port}.log"
    cmd = [sys.executable, "-m", "domino_sglang.cli", "serve", "--port", str(port),
           "--threads", str(threads), *serve_args]
    if sglang_args:
        cmd += ["--", *sglang_args]
    full_env = {**os.environ, **(env or {})}
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=full_env, stdin=subprocess.DEVNULL, start_new_session=True)
    server = Server(name=name, port=port, proc=proc, log_path=log_path, args=cmd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server {name} exited with {proc.returncode}:\n{server.log()[-4000:]}"
            )
        try:
            if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except requests.RequestException:
            pass
        time.sleep(1.0)
    server.stop()
    raise RuntimeError(f"server {name} not healthy after {timeout}s:\n{server.log()[-4000:]}")

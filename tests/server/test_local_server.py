"""start_server: a server whose port was taken before it could bind is restarted on another one;
servers still running when the test process is terminated are stopped with it."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from domino_sglang.cli import local_server
from domino_sglang.cli.local_server import Server, free_port, port_taken
from tests.harness.servers import start_server

pytestmark = pytest.mark.server


def test_a_taken_port_is_retried_on_a_new_one(monkeypatch):
    # the first port handed out is held by a listening socket (not HTTP), as when another process
    # takes it between free_port() and the server's bind; the second is really free
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        ports = iter([taken])
        monkeypatch.setattr(local_server, "free_port", lambda: next(ports, None) or free_port())
        with start_server("port-retry", ["--no-speculation"], timeout=300) as server:
            assert server.port != taken
            assert requests.get(f"{server.url}/health", timeout=5).status_code == 200
            first = local_server.LOG_DIR / f"port-retry-{taken}.log"
            assert port_taken(Server("first", taken, None, first))


def test_every_port_taken_fails_with_one_clear_error(monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        monkeypatch.setattr(local_server, "free_port", lambda: taken)
        with pytest.raises(RuntimeError, match="its port was taken before it could bind, 2 times"):
            start_server("port-taken", ["--no-speculation"], timeout=300, attempts=2)


CHILD = """
import subprocess, sys, time
from pathlib import Path
from domino_sglang.cli import local_server as ls
ls.stop_servers_on_sigterm()
proc = subprocess.Popen(["sleep", "600"], start_new_session=True)  # stands in for a server
ls._running.add(ls.Server("stand-in", 0, proc, Path("/dev/null")))
print(proc.pid, flush=True)
time.sleep(600)
"""


def test_sigterm_stops_the_servers_a_test_run_started():
    """A CI time-out sends SIGTERM to pytest: the servers it started (own process groups) must
    not outlive it. Checked on a stand-in process registered as a running server."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    pid = int(child.stdout.readline())
    os.kill(pid, 0)  # the stand-in runs
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pid, signal.SIGKILL)
    raise AssertionError("the stand-in server outlived the SIGTERM'd test process")

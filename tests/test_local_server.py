"""start_server: a server whose port was taken before it could bind is restarted on another one."""

import socket

import pytest
import requests

from domino_sglang import local_server
from domino_sglang.local_server import Server, free_port, port_taken, start_server

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

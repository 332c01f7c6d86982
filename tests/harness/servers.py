"""The SGLang servers of one pytest process, kept under a cap so that test lanes fit in memory.

A test server takes ~4.5 GB (three SGLang processes, float32 weights, its KV pool) and about a
minute to start on the 2-core CI machine. `make test` runs two lanes that start servers at the
same time (tests/lanes.py), and 24 GB holds about four such servers beside the two pytest
processes, so each process keeps at most `DOMINO_TEST_SERVERS` servers up (default 3; the lanes
set 2):
  - `SharedServer`: a server several tests use (plain decoding's references, the reliability
    suite's server), started on first use and kept while there is room; asked for again after
    it was stopped to make room, it is started again (one that died is a failure: the
    reliability tests would not see a crash otherwise);
  - `start_server`: a server a test or module starts for itself (as
    domino_sglang.cli.local_server's), counted while it runs.
Making room stops the least recently used shared server; servers a test started itself are never
stopped for it (a test that needs more of them at once than the cap goes over it).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from domino_sglang.cli import local_server
from domino_sglang.cli.local_server import Server

CAP = int(os.environ.get("DOMINO_TEST_SERVERS", "3"))


class ServerPool:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.shared: OrderedDict[SharedServer, Server] = OrderedDict()  # least recent first
        self.own: list[Server] = []
        self.starting = 0  # starts under way (servers start in parallel threads, test_router)
        self.lock = threading.RLock()

    def _running(self) -> int:
        self.own = [s for s in self.own if s.proc.poll() is None]
        return len(self.own) + len(self.shared) + self.starting

    def _make_room(self) -> None:
        """Stop least recently used shared servers until one more fits under the cap."""
        while self._running() >= self.cap and self.shared:
            _, server = self.shared.popitem(last=False)
            server.stop()

    def _start(self, name: str, *args, **kwargs) -> Server:
        with self.lock:
            self._make_room()
            self.starting += 1
        try:
            return local_server.start_server(name, *args, **kwargs)
        finally:
            with self.lock:
                self.starting -= 1

    def start_own(self, name: str, *args, **kwargs) -> Server:
        server = self._start(name, *args, **kwargs)
        with self.lock:
            self.own.append(server)
        return server

    def running(self, ref: SharedServer) -> Server:
        with self.lock:
            server = self.shared.get(ref)
            if server is not None:
                if server.proc.poll() is not None:  # a dead server is a failure, never restarted
                    raise AssertionError(f"server {ref.name} died (exit {server.proc.returncode})"
                                         f":\n{server.log()[-3000:]}")
                self.shared.move_to_end(ref)
                return server
            server = self._start(ref.name, ref.serve_args, ref.sglang_args, env=ref.env)
            self.shared[ref] = server
            return server

    def stop(self, ref: SharedServer) -> None:
        with self.lock:
            server = self.shared.pop(ref, None)
        if server is not None:
            server.stop()


POOL = ServerPool(CAP)


class SharedServer:
    """A server by its launch arguments: `url`, `port`, `proc`, `log()` ... reach the running
    server, started (again) when it is not up."""

    def __init__(self, name: str, serve_args: list[str], sglang_args: list[str] | None = None,
                 env: dict | None = None) -> None:
        self.name, self.serve_args, self.sglang_args, self.env = name, serve_args, sglang_args, env

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # probes such as copy's or pickle's: not the server's
            raise AttributeError(attr)
        return getattr(POOL.running(self), attr)

    def stop(self) -> None:
        POOL.stop(self)


def start_server(name: str, serve_args: list[str], sglang_args: list[str] | None = None,
                 **kwargs) -> Server:
    """domino_sglang.cli.local_server.start_server, counted in this process's cap."""
    return POOL.start_own(name, serve_args, sglang_args, **kwargs)

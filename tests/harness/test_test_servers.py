"""tests/harness/servers.py, the per-process cap on test servers, with stand-in servers (no
SGLang)."""

from __future__ import annotations

import pytest

from domino_sglang.cli import local_server
from tests.harness import servers


class Proc:
    def __init__(self) -> None:
        self.returncode = None

    def poll(self):
        return self.returncode


class StandIn:
    def __init__(self, name: str) -> None:
        self.name, self.proc, self.url = name, Proc(), f"http://{name}"

    def stop(self) -> None:
        self.proc.returncode = -15

    def log(self) -> str:
        return f"log of {self.name}"


@pytest.fixture
def pool(monkeypatch):
    started: list[StandIn] = []

    def start(name, *args, **kwargs):
        started.append(StandIn(name))
        return started[-1]

    monkeypatch.setattr(local_server, "start_server", start)
    monkeypatch.setattr(servers, "POOL", servers.ServerPool(2))
    return started


def alive(started) -> list[str]:
    return [s.name for s in started if s.proc.poll() is None]


def test_shared_servers_start_on_use_and_the_least_recent_makes_room(pool):
    a, b = servers.SharedServer("a", []), servers.SharedServer("b", [])
    assert pool == []  # nothing started before first use
    assert a.url == "http://a" and b.url == "http://b" and a.url == "http://a"  # a: most recent
    own = servers.start_server("own", [])
    assert alive(pool) == ["a", "own"]  # b, the least recently used, was stopped
    assert b.url == "http://b"  # started again on use; a makes room (own is never stopped)
    assert alive(pool) == ["own", "b"]
    own.stop()
    assert a.url == "http://a" and alive(pool) == ["b", "a"]


def test_a_test_needing_more_own_servers_than_the_cap_goes_over_it(pool):
    shared = servers.SharedServer("s", [])
    assert shared.url
    first, second = servers.start_server("one", []), servers.start_server("two", [])
    third = servers.start_server("three", [])
    assert alive(pool) == ["one", "two", "three"] and first and second and third


def test_a_dead_shared_server_is_a_failure_not_a_restart(pool):
    shared = servers.SharedServer("rel", [])
    assert shared.url
    pool[0].proc.returncode = 1  # it died (a request killed it)
    with pytest.raises(AssertionError, match="server rel died .exit 1.:\nlog of rel"):
        _ = shared.url
    assert len(pool) == 1


def test_dunder_probes_do_not_start_a_server(pool):
    import copy

    shared = servers.SharedServer("x", [])
    assert copy.copy(shared).name == "x" and not hasattr(shared, "__fspath__")
    assert pool == []

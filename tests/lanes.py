"""Run the suite as two concurrent lanes (`make test`), each a sequence of pytest runs with its
own log, printed lane by lane at the end.

A server test keeps one core busy (its server's, OMP_NUM_THREADS=1), so the server tests are split
over both lanes: lane 1 runs the in-process tests, then the server tests of LANE_1_SERVER_TESTS
(the reliability suite and a few self-contained modules); lane 2 runs every other server test.
Memory bounds it: a test server takes ~4.5 GB and the machine 24 GB, so each lane's pytest keeps
at most DOMINO_TEST_SERVERS=2 servers up at once (tests/harness/servers.py stops the least recently
used shared server to make room). Two lanes that each kept every shared server up went over 24 GB
and had test servers OOM-killed (2026-12-03). A SIGTERM or Ctrl-C is passed on to the running pytest
of every lane, which stops the servers it started (domino_sglang.cli.local_server).

    python tests/lanes.py [PYTEST_ARGS...]   exit 0 when every run passed (or selected nothing)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=25"]
NOTHING_SELECTED = 5
SERVERS_PER_LANE = "2"
TESTS = Path(__file__).resolve().parent
# ~20 of the server lane's ~65 minutes (CI, 2026-12-03): what lane 1 runs after the in-process tests
LANE_1_SERVER_TESTS = ["reliability", "server/test_router.py", "server/test_sync_budget.py",
                       "server/test_observability_server.py", "server/test_local_server.py",
                       "server/test_train_new_target.py", "server/test_tree_server.py"]


def lanes(extra: list[str]) -> dict[str, list[list[str]]]:
    """Lane name -> its pytest runs, in order; together they select every test exactly once."""
    own = [str(TESTS / p) for p in LANE_1_SERVER_TESTS]
    missing = [p for p in own if not Path(p).exists()]
    if missing:
        raise SystemExit(f"tests/lanes.py: LANE_1_SERVER_TESTS names missing paths: {missing}")
    return {
        "lane 1 (in-process, then some server tests)": [
            ["-m", "not server", str(TESTS), *extra],
            ["-m", "server", *own, *extra]],
        "lane 2 (the other server tests)": [
            ["-m", "server", str(TESTS), *(f"--ignore={p}" for p in own), *extra]],
    }


class Lane(threading.Thread):
    def __init__(self, index: int, name: str, runs: list[list[str]], work: Path) -> None:
        super().__init__()
        self.index, self.name, self.runs, self.work = index, name, runs, work
        self.proc: subprocess.Popen | None = None
        self.stopped = False
        self.results: list[tuple[Path, int]] = []  # (log, exit code) per run

    def run(self) -> None:
        env = {**os.environ, "DOMINO_TEST_SERVERS": SERVERS_PER_LANE}
        for j, args in enumerate(self.runs):
            if self.stopped:
                break
            log = self.work / f"lane{self.index}-{j}.log"
            with log.open("w") as out:
                self.proc = subprocess.Popen(
                    [*PYTEST, f"--basetemp={self.work}/tmp{self.index}-{j}", *args],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
                print(f"{self.name}: run {j + 1} pid {self.proc.pid}, log {log}", flush=True)
                self.results.append((log, self.proc.wait()))

    def forward(self, signum: int) -> None:
        self.stopped = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)


def main(extra: list[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="domino-lanes-"))
    running = [Lane(i + 1, name, runs, work) for i, (name, runs) in enumerate(lanes(extra).items())]

    def forward(signum: int, _frame) -> None:
        for lane in running:
            lane.forward(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for lane in running:
        lane.start()
    codes = []
    for lane in running:
        lane.join()
        for j, (log, code) in enumerate(lane.results):
            print(f"---- {lane.name}, run {j + 1}: exit {code} ----", flush=True)
            print(log.read_text(), flush=True)
            codes.append((f"{lane.name} run {j + 1}", code))
        if len(lane.results) < len(lane.runs):
            codes.append((f"{lane.name}: runs not started", 1))
    print("make test: " + ", ".join(f"{name} exit {code}" for name, code in codes)
          + f" ({NOTHING_SELECTED}: nothing selected)")
    return 0 if all(code in (0, NOTHING_SELECTED) for _, code in codes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

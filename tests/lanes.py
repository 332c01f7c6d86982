"""Run the suite as concurrent pytest lanes (`make test`): the server tests in one lane, the
in-process tests in the other, each with its own log, printed lane by lane at the end.

Server tests spend much of their time waiting on their servers, so the two lanes share 2 cores
well. Only one lane starts servers (~1-5 GB each, session-scoped ones kept up): two server lanes
(the reliability suite and served sampling apart from the rest) went over 24 GB and had test
servers OOM-killed (2026-12-03). A SIGTERM or Ctrl-C is passed on to every lane, whose pytest
stops the servers it started (domino_sglang.local_server).

    python tests/lanes.py [PYTEST_ARGS...]   exit 0 when every lane passed (or selected nothing)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15"]
NOTHING_SELECTED = 5


def lanes(extra: list[str]) -> dict[str, list[str]]:
    """Lane name -> pytest arguments; together they select every test exactly once."""
    return {
        "server lane (-m server)": ["-m", "server", "tests", *extra],
        "in-process lane (-m 'not server')": ["-m", "not server", "tests", *extra],
    }


def main(extra: list[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="domino-lanes-"))
    procs: dict[str, tuple[subprocess.Popen, Path]] = {}
    for i, (name, args) in enumerate(lanes(extra).items()):
        log = work / f"lane{i}.log"
        with log.open("w") as out:
            proc = subprocess.Popen([*PYTEST, f"--basetemp={work}/tmp{i}", *args],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs[name] = (proc, log)
        print(f"{name}: pid {proc.pid}, log {log}", flush=True)

    def forward(signum: int, _frame) -> None:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = {}
    for name, (proc, log) in procs.items():
        codes[name] = proc.wait()
        print(f"---- {name}: exit {codes[name]} ----", flush=True)
        print(log.read_text(), flush=True)
    summary = ", ".join(f"{name} exit {code}" for name, code in codes.items())
    print(f"make test: {summary} ({NOTHING_SELECTED}: nothing selected)")
    ok = all(code in (0, NOTHING_SELECTED) for code in codes.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

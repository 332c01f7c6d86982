"""Run the suite as concurrent pytest lanes (`make test`): two lanes of server tests and one of
in-process tests, each with its own log, printed lane by lane at the end.

Server tests spend much of their time waiting on their servers, so two server lanes and the
in-process lane share 2 cores well; a lane has at most a few servers up (~2-3 GB each). The
server tests are split by file: the reliability suite and the served-sampling test in one lane,
the other server tests in the other. A SIGTERM or Ctrl-C is passed on to every lane, whose
pytest stops the servers it started (domino_sglang.local_server).

    python tests/lanes.py [PYTEST_ARGS...]   exit 0 when every lane passed (or selected nothing)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

LANE_A = ["tests/reliability", "tests/test_served_sampling.py"]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15"]
NOTHING_SELECTED = 5


def lanes(extra: list[str]) -> dict[str, list[str]]:
    """Lane name -> pytest arguments; together they select every test exactly once."""
    ignore_a = [f"--ignore={p}" for p in LANE_A]
    return {
        "server lane A (reliability, served sampling)": ["-m", "server", *LANE_A, *extra],
        "server lane B (other server tests)": ["-m", "server", "tests", *ignore_a, *extra],
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

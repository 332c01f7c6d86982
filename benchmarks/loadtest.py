"""Headless locust run against a RUNNING server: fixed users and duration, CSV stats + summary.

    python benchmarks/loadtest.py --host http://127.0.0.1:30000 --users 4 --duration 60s
    make loadtest HOST=http://127.0.0.1:30000 USERS=4 DURATION=60s

Writes into --out (default benchmarks/results/loadtest/): locust's CSV files (`<stem>_stats.csv`,
`_stats_history.csv`, `_failures.csv`, `_exceptions.csv`), `<stem>_summary.json` and
`<stem>_summary.md` (requests/s, output tokens/s, p50/p95 TTFT and ITL, failures, with the
command, machine, revision and date). Exit status 1 if any request failed (unless
--allow-failures). Before the run it checks that the server answers /health.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import provenance  # noqa: E402

LOCUSTFILE = HERE / "locustfile.py"
DEFAULT_OUT = HERE / "results" / "loadtest"


def run(host: str, users: int, duration: str, out: Path, stem: str = "loadtest",
        max_tokens: int = 64, stream_ratio: float = 0.5, prompt_sets: str = "",
        spawn_rate: float | None = None, extra: list[str] | None = None) -> dict:
    """Run locust headless, return the summary dict (also written next to the CSV files)."""
    out.mkdir(parents=True, exist_ok=True)
    summary_json = out / f"{stem}_summary.json"
    summary_json.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
           "--host", host, "-u", str(users), "-r", str(spawn_rate or users), "-t", duration,
           "--stop-timeout", "120",  # let in-flight answers finish: no request is cut off
           "--csv", str(out / stem), "--csv-full-history", "--only-summary",
           "--loglevel", "WARNING", "--exit-code-on-error", "0",
           "--max-tokens", str(max_tokens), "--stream-ratio", str(stream_ratio),
           "--summary-json", str(summary_json), *(extra or [])]
    if prompt_sets:
        cmd += ["--prompt-sets", prompt_sets]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0 or not summary_json.exists():
        raise RuntimeError(f"locust failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    summary = json.loads(summary_json.read_text())
    summary["provenance"] = provenance.collect()
    summary["settings"] = {"host": host, "users": users, "duration": duration,
                           "max_tokens": max_tokens, "stream_ratio": stream_ratio,
                           "prompt_sets": prompt_sets or "mtbench,humaneval,gsm8k"}
    summary_json.write_text(json.dumps(summary, indent=2) + "\n")
    (out / f"{stem}_summary.md").write_text(markdown(summary))
    return summary


def markdown(s: dict) -> str:
    st = s["settings"]
    lines = [f"## Load test: {st['users']} users, {st['duration']}, {st['max_tokens']} output "
             f"tokens, {st['stream_ratio']:.0%} streamed ({st['prompt_sets']})", "",
             provenance.markdown_header(s["provenance"]), "",
             "| requests | failures | requests/s | output tok/s | TTFT p50 / p95 (ms) "
             "| ITL p50 / p95 (ms) |", "|---|---|---|---|---|---|",
             f"| {s['requests']} | {s['failures']} | {s['requests_per_s']} | "
             f"{s['output_tokens_per_s']} | {s['ttft_p50_ms']} / {s['ttft_p95_ms']} | "
             f"{s['itl_p50_ms']} / {s['itl_p95_ms']} |", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="http://127.0.0.1:30000")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--spawn-rate", type=float, default=None, help="default: all at once")
    ap.add_argument("--duration", default="60s", help="locust run time, e.g. 20s, 5m")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stream-ratio", type=float, default=0.5)
    ap.add_argument("--prompt-sets", default="", help="default: mtbench,humaneval,gsm8k")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--stem", default="loadtest")
    ap.add_argument("--allow-failures", action="store_true")
    args = ap.parse_args(argv)
    try:
        requests.get(f"{args.host}/health", timeout=10).raise_for_status()
    except requests.RequestException as e:
        print(f"no healthy server at {args.host} ({e}); start one with `make serve`",
              file=sys.stderr)
        return 2
    s = run(args.host, args.users, args.duration, args.out, args.stem, args.max_tokens,
            args.stream_ratio, args.prompt_sets, args.spawn_rate)
    print(markdown(s))
    print(f"CSV and summary in {args.out}/{args.stem}_*")
    return 1 if s["failures"] and not args.allow_failures else 0


if __name__ == "__main__":
    sys.exit(main())

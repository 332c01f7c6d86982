"""Headless locust run against a RUNNING server: fixed users and duration, CSV stats + summary.

    python benchmarks/loadtest.py --host http://127.0.0.1:30000 --users 4 --duration 60s
    make loadtest HOST=http://127.0.0.1:30000 USERS=4 DURATION=60s

Writes into --out (default benchmarks/results/loadtest/): locust's CSV files (`<stem>_stats.csv`,
`_stats_history.csv`, `_failures.csv`, `_exceptions.csv`: one entry per HTTP request),
`<stem>_latency.csv` (every TTFT / TPOT / ITL sample), `<stem>_summary.json` and
`<stem>_summary.md` (requests/s, output tokens/s, TTFT / TPOT / ITL percentiles, failures, and the
run's tau and domino_ counters from /metrics before and after, with the command, machine,
revision and date). Exit status 1 if any request failed (unless --allow-failures). Before the
run it checks that the server answers /health.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import provenance  # noqa: E402
from loadgen import domino_deltas, load_prompt_file, parse_domino_counters  # noqa: E402

LOCUSTFILE = HERE / "locustfile.py"
DEFAULT_OUT = HERE / "results" / "loadtest"


def scrape_domino(host: str) -> dict[str, float]:
    """The server's domino_ counters from /metrics (loadgen.parse_domino_counters)."""
    return parse_domino_counters(requests.get(f"{host}/metrics", timeout=30).text)


def run(host: str, users: int, duration: str, out: Path, stem: str = "loadtest",
        max_tokens: int = 64, stream_ratio: float = 0.5, prompt_sets: str = "",
        spawn_rate: float | None = None, extra: list[str] | None = None,
        api_key: str = "", prompts: Path | None = None) -> dict:
    """Run locust headless, return the summary dict (also written next to the CSV files)."""
    out.mkdir(parents=True, exist_ok=True)
    summary_json = out / f"{stem}_summary.json"
    summary_json.unlink(missing_ok=True)
    before = scrape_domino(host)
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
           "--host", host, "-u", str(users), "-r", str(spawn_rate or users), "-t", duration,
           "--stop-timeout", "120",  # let in-flight answers finish: no request is cut off
           "--csv", str(out / stem), "--csv-full-history", "--only-summary",
           "--loglevel", "WARNING", "--exit-code-on-error", "0",
           "--max-tokens", str(max_tokens), "--stream-ratio", str(stream_ratio),
           "--summary-json", str(summary_json), "--latency-csv", str(out / f"{stem}_latency.csv"),
           *(extra or [])]
    if prompt_sets:
        cmd += ["--prompt-sets", prompt_sets]
    if prompts is not None:
        cmd += ["--prompts", str(prompts)]
    env = dict(os.environ)
    if api_key:  # through the environment: never on a command line others can read
        env["LOCUST_API_KEY"] = env["DOMINO_SGLANG_API_KEY"] = api_key
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode != 0 or not summary_json.exists():
        raise RuntimeError(f"locust failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    summary = json.loads(summary_json.read_text())
    summary["domino"] = domino_deltas(before, scrape_domino(host))
    summary["provenance"] = provenance.collect()
    summary["settings"] = {"host": host, "users": users, "duration": duration,
                           "max_tokens": max_tokens, "stream_ratio": stream_ratio,
                           "prompt_sets": (str(prompts) if prompts else
                                           prompt_sets or "mtbench,humaneval,gsm8k"),
                           "api_key": bool(api_key)}
    summary_json.write_text(json.dumps(summary, indent=2) + "\n")
    (out / f"{stem}_summary.md").write_text(markdown(summary))
    return summary


def markdown(s: dict) -> str:
    st, lat, d = s["settings"], s["latency"], s["domino"]
    lines = [f"## Load test: {st['users']} users, {st['duration']}, {st['max_tokens']} output "
             f"tokens, {st['stream_ratio']:.0%} streamed ({st['prompt_sets']})", "",
             provenance.markdown_header(s["provenance"]), "",
             "| requests (locust total) | failures | requests/s | output tok/s | tau "
             "| acceptance rate | verify rounds |", "|---|---|---|---|---|---|---|",
             f"| {s['requests']} ({s['locust_total_requests']}) | {s['failures']} | "
             f"{s['requests_per_s']} | {s['output_tokens_per_s']} | {d['tau']} | "
             f"{d['acceptance_rate']} | {d['verify_rounds']:.0f} |", "",
             "| streamed answers (ms) | samples | mean | p50 | p90 | p99 |",
             "|---|---|---|---|---|---|"]
    for metric, what in (("TTFT", "TTFT (first content chunk)"),
                         ("TPOT", "TPOT ((t_last - t_first) / (tokens - 1))"),
                         ("ITL", "ITL (every gap between content chunks)")):
        m = lat[metric]
        lines.append(f"| {what} | {m['count']} | {m['mean_ms']} | {m['p50_ms']} | "
                     f"{m['p90_ms']} | {m['p99_ms']} |")
    return "\n".join(lines + [""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="http://127.0.0.1:30000")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--spawn-rate", type=float, default=None, help="default: all at once")
    ap.add_argument("--duration", default="60s", help="locust run time, e.g. 20s, 5m")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stream-ratio", type=float, default=0.5)
    ap.add_argument("--prompt-sets", default="", help="default: mtbench,humaneval,gsm8k")
    ap.add_argument("--prompts", type=Path, default=None,
                    help="JSONL prompts ({'prompt': ...} or {'messages': [...]} per line)")
    ap.add_argument("--api-key", default=os.environ.get("DOMINO_SGLANG_API_KEY", ""),
                    help="the server's --api-key (default: env DOMINO_SGLANG_API_KEY)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--stem", default="loadtest")
    ap.add_argument("--allow-failures", action="store_true")
    args = ap.parse_args(argv)
    if args.prompts is not None:
        try:
            load_prompt_file(args.prompts)
        except (OSError, ValueError) as e:
            print(f"loadtest: --prompts: {e}", file=sys.stderr)
            return 2
    try:
        requests.get(f"{args.host}/health", timeout=10).raise_for_status()
        # /health is open even with --api-key: check the key on the API before the run
        auth = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        r = requests.get(f"{args.host}/v1/models", headers=auth, timeout=10)
    except requests.RequestException as e:
        print(f"no healthy server at {args.host} ({e}); start one with `make serve`",
              file=sys.stderr)
        return 2
    if r.status_code in (401, 403):
        print(f"loadtest: {args.host}/v1/models answered {r.status_code}: the server wants "
              "--api-key (or DOMINO_SGLANG_API_KEY)", file=sys.stderr)
        return 2
    s = run(args.host, args.users, args.duration, args.out, args.stem, args.max_tokens,
            args.stream_ratio, args.prompt_sets, args.spawn_rate, api_key=args.api_key,
            prompts=args.prompts)
    print(markdown(s))
    print(f"CSV and summary in {args.out}/{args.stem}_*")
    return 1 if s["failures"] and not args.allow_failures else 0


if __name__ == "__main__":
    sys.exit(main())

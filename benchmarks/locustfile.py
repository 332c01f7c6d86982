"""Locust load test of an OpenAI-compatible domino_sglang (or any SGLang) server.

Each simulated user sends chat completions, streaming or not, with prompts drawn from the
evaluation sets (`domino_sglang.train.prompt_sets`: MT-Bench, HumanEval, GSM8K) or from a JSONL file
(`--prompts FILE.jsonl`, one {"prompt": "..."} or {"messages": [...]} per line). Requests are
named by prompt set (`chat <set>` / `chat-stream <set>`); locust's statistics hold ONE entry per
HTTP request (its response_time is the whole answer, its response_length the output tokens), so
requests/s and the Aggregated row count each request once.

Latency metrics of streamed answers, kept beside locust's statistics (never fired as requests):
    TTFT   time to the first content chunk (ms), one sample per streamed request
    TPOT   time per output token after the first: (t_last - t_first) / (tokens - 1) (ms), one
           sample per streamed request with > 1 token
    ITL    inter-chunk latency: every gap between consecutive content chunks (ms); a speculative
           server may send several tokens in one chunk, so ITL >= TPOT there
They go into the summary (`--summary-json`) and, per sample, into `--latency-csv`.

Options (locust flags, also settable as LOCUST_* environment variables):
    --prompt-sets mtbench,humaneval,gsm8k   --prompts FILE.jsonl   --max-tokens 64
    --stream-ratio 0.5   --temperature 0   --ignore-eos / --no-ignore-eos   --api-key KEY
    --summary-json PATH   --latency-csv PATH

Headless run (see benchmarks/loadtest.py, `make loadtest`):
    locust -f benchmarks/locustfile.py --headless -u 4 -r 4 -t 20s --host http://127.0.0.1:30000
"""

from __future__ import annotations

import csv
import json
import os
import random
import sys
import time
from pathlib import Path

import gevent
from locust import HttpUser, between, events, task
from locust.stats import CSV_STATS_INTERVAL_SEC

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/
from loadgen import (  # noqa: E402
    latency_summary,
    load_prompt_file,
    stream_latencies,
)

from domino_sglang.cli.local_server import sse_chunks  # noqa: E402
from domino_sglang.train import prompt_sets  # noqa: E402

# prompt set name -> chat messages lists
PROMPTS: dict[str, list[list[dict]]] = {}
# Raw samples for exact percentiles (locust rounds its own): (metric, prompt set, ms).
SAMPLES: list[tuple[str, str, float]] = []
STARTED: dict[str, float] = {}


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument("--prompt-sets", default=",".join(prompt_sets.EVAL_SETS),
                        help="comma-separated prompt sets from domino_sglang.train.prompt_sets")
    parser.add_argument("--prompts", default="",
                        help="JSONL file of prompts ({'prompt': str} or {'messages': [...]} "
                             "per line); replaces --prompt-sets")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--stream-ratio", type=float, default=0.5,
                        help="fraction of requests sent with stream=true")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--ignore-eos", action="store_true", default=True,
                        help="fixed output length (default)")
    parser.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    parser.add_argument("--model", default="default")
    parser.add_argument("--api-key", default=os.environ.get("DOMINO_SGLANG_API_KEY", ""),
                        help="sent as `Authorization: Bearer KEY` (default: env "
                             "DOMINO_SGLANG_API_KEY)")
    parser.add_argument("--summary-json", default="",
                        help="write the run summary (JSON) here when the test stops")
    parser.add_argument("--latency-csv", default="",
                        help="write every TTFT / TPOT / ITL sample (CSV) here when it stops")


@events.test_start.add_listener
def _load_prompts(environment, **_):
    opts = environment.parsed_options
    if opts.prompts:
        PROMPTS[Path(opts.prompts).stem] = load_prompt_file(opts.prompts)
    else:
        for name in opts.prompt_sets.split(","):
            PROMPTS[name.strip()] = [[{"role": "user", "content": p}]
                                     for p in prompt_sets.load(name.strip())]
    STARTED["t"] = time.time()


class ChatUser(HttpUser):
    """One chat completion at a time, no think time: users = requests in flight."""

    wait_time = between(0, 0)

    def on_start(self) -> None:
        # Deterministic mix: the first request streams, then the share follows --stream-ratio.
        self.stream_credit = 1.0 - self.environment.parsed_options.stream_ratio
        key = self.environment.parsed_options.api_key
        if key:
            self.client.headers["Authorization"] = f"Bearer {key}"

    def body(self, messages: list[dict], stream: bool) -> dict:
        opts = self.environment.parsed_options
        body = {"model": opts.model, "messages": messages, "max_tokens": opts.max_tokens,
                "temperature": opts.temperature, "ignore_eos": opts.ignore_eos,
                "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    @task
    def chat(self) -> None:
        opts = self.environment.parsed_options
        prompt_set = random.choice(list(PROMPTS))
        messages = random.choice(PROMPTS[prompt_set])
        self.stream_credit += opts.stream_ratio
        if self.stream_credit >= 1.0 - 1e-9:
            self.stream_credit -= 1.0
            self.streamed(prompt_set, messages)
        else:
            self.plain(prompt_set, messages)

    def plain(self, prompt_set: str, messages: list[dict]) -> None:
        with self.client.post("/v1/chat/completions", json=self.body(messages, False),
                              name=f"chat {prompt_set}", catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            try:
                reply = r.json()
                tokens = int(reply["usage"]["completion_tokens"])
                reply["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError) as e:
                r.failure(f"malformed response: {e!r}")
                return
            if tokens <= 0:
                r.failure("no output tokens")
                return
            r.request_meta["response_length"] = tokens
            r.success()

    def streamed(self, prompt_set: str, messages: list[dict]) -> None:
        start = time.perf_counter()
        chunk_times: list[float] = []
        tokens = 0
        with self.client.post("/v1/chat/completions", json=self.body(messages, True),
                              stream=True, name=f"chat-stream {prompt_set}",
                              catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            try:
                for chunk in sse_chunks(r):
                    if chunk.get("usage"):
                        tokens = int(chunk["usage"]["completion_tokens"])
                    choices = chunk.get("choices") or []
                    if choices and choices[0].get("delta", {}).get("content"):
                        chunk_times.append(time.perf_counter())
            except Exception as e:  # a broken stream is a failed request, not a crash
                r.failure(f"stream broken: {e!r}")
                return
            if not chunk_times or tokens <= 0:
                r.failure("stream ended without content or usage")
                return
            r.request_meta["response_length"] = tokens
            r.request_meta["response_time"] = (time.perf_counter() - start) * 1e3  # whole stream
            r.success()
        for metric, values in stream_latencies(start, chunk_times, tokens).items():
            SAMPLES.extend((metric, prompt_set, v) for v in values)


def summarize(environment) -> dict:
    """Requests/s, output tokens/s, TTFT / TPOT / ITL, failures, over the whole run. Every
    locust entry here is one HTTP request."""
    stats = environment.stats
    chat = [e for (name, method), e in stats.entries.items()
            if method == "POST" and name.startswith("chat")]
    requests_ok = sum(e.num_requests - e.num_failures for e in chat)
    tokens = sum(e.total_content_length for e in chat)
    end = stats.total.last_request_timestamp or time.time()
    duration = max(end - STARTED.get("t", stats.total.start_time), 1e-9)

    def r3(x):
        return None if x is None else round(x, 3)

    lat = latency_summary(SAMPLES)
    return {
        "users": environment.runner.target_user_count if environment.runner else None,
        "duration_s": round(duration, 2),
        "requests": sum(e.num_requests for e in chat),
        "locust_total_requests": stats.total.num_requests,  # = requests: nothing else is fired
        "failures": stats.total.num_failures,
        "requests_per_s": r3(requests_ok / duration),
        "output_tokens": tokens,
        "output_tokens_per_s": r3(tokens / duration),
        "latency": lat,
        "ttft_p50_ms": lat["TTFT"]["p50_ms"], "ttft_p90_ms": lat["TTFT"]["p90_ms"],
        "tpot_p50_ms": lat["TPOT"]["p50_ms"], "tpot_p90_ms": lat["TPOT"]["p90_ms"],
        "itl_p50_ms": lat["ITL"]["p50_ms"], "itl_p90_ms": lat["ITL"]["p90_ms"],
        "streamed_requests": lat["TTFT"]["count"],
        "by_prompt_set": {name: {"requests": e.num_requests, "failures": e.num_failures,
                                 "output_tokens": e.total_content_length}
                          for (name, _), e in sorted(stats.entries.items())
                          if name.startswith("chat")},
        "errors": [{"name": e.name, "error": str(e.error), "occurrences": e.occurrences}
                   for e in stats.errors.values()],
    }


@events.quitting.add_listener
def _write_summary(environment, **_):
    # locust's CSV writer refreshes its files once a second and writes nothing more at exit:
    # give it one more pass so requests that finished during --stop-timeout are in the CSV.
    gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.5)
    opts = environment.parsed_options
    if opts.latency_csv:
        with open(opts.latency_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["metric", "prompt_set", "ms"])
            w.writerows((m, s, round(v, 3)) for m, s, v in SAMPLES)
    if opts.summary_json:
        Path(opts.summary_json).write_text(json.dumps(summarize(environment), indent=2) + "\n")

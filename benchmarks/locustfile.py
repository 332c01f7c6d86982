"""Locust load test of an OpenAI-compatible domino_sglang (or any SGLang) server.

Each simulated user sends chat completions, streaming or not, with prompts drawn from the real
evaluation sets (`domino_sglang.data`: MT-Bench, HumanEval, GSM8K). Requests are named by prompt
set (`chat <set>` / `chat-stream <set>`), so locust's statistics are broken down per set.

Custom locust metrics (request types in the stats and the CSV):
    TTFT <set>   time to the first content chunk of a streamed answer (ms)
    ITL <set>    inter-token latency of a streamed answer: (t_last - t_first) / (tokens - 1) (ms)
For the chat requests, `response_length` is the number of OUTPUT TOKENS (usage.completion_tokens),
so locust's "Average Content Size" is tokens per request and the totals give output tokens/s.

Options (locust flags, also settable as LOCUST_* environment variables):
    --prompt-sets mtbench,humaneval,gsm8k   --max-tokens 64   --stream-ratio 0.5
    --temperature 0   --ignore-eos / --no-ignore-eos   --summary-json PATH

Headless run (see benchmarks/loadtest.py, `make loadtest`):
    locust -f benchmarks/locustfile.py --headless -u 4 -r 4 -t 20s --host http://127.0.0.1:30000
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

import gevent
from locust import HttpUser, between, events, task
from locust.stats import CSV_STATS_INTERVAL_SEC

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from domino_sglang import data  # noqa: E402
from domino_sglang.local_server import sse_chunks  # noqa: E402

PROMPTS: dict[str, list[str]] = {}
# Raw per-request samples for exact percentiles in the summary (locust rounds its own).
SAMPLES: dict[str, list[float]] = {"ttft_ms": [], "itl_ms": []}
STARTED: dict[str, float] = {}


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument("--prompt-sets", default=",".join(data.EVAL_SETS),
                        help="comma-separated prompt sets from domino_sglang.data")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--stream-ratio", type=float, default=0.5,
                        help="fraction of requests sent with stream=true")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--ignore-eos", action="store_true", default=True,
                        help="fixed output length (default)")
    parser.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    parser.add_argument("--model", default="default")
    parser.add_argument("--summary-json", default="",
                        help="write the run summary (JSON) here when the test stops")


@events.test_start.add_listener
def _load_prompts(environment, **_):
    for name in environment.parsed_options.prompt_sets.split(","):
        PROMPTS[name.strip()] = data.load(name.strip())
    STARTED["t"] = time.time()


def _fire(environment, request_type: str, name: str, ms: float) -> None:
    environment.events.request.fire(request_type=request_type, name=name, response_time=ms,
                                    response_length=0, exception=None, context={})


class ChatUser(HttpUser):
    """One chat completion at a time, no think time: users = requests in flight."""

    wait_time = between(0, 0)

    def on_start(self) -> None:
        # Deterministic mix: the first request streams, then the share follows --stream-ratio.
        self.stream_credit = 1.0 - self.environment.parsed_options.stream_ratio

    def body(self, prompt: str, stream: bool) -> dict:
        opts = self.environment.parsed_options
        body = {"model": opts.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": opts.max_tokens, "temperature": opts.temperature,
                "ignore_eos": opts.ignore_eos, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    @task
    def chat(self) -> None:
        opts = self.environment.parsed_options
        prompt_set = random.choice(list(PROMPTS))
        prompt = random.choice(PROMPTS[prompt_set])
        self.stream_credit += opts.stream_ratio
        if self.stream_credit >= 1.0 - 1e-9:
            self.stream_credit -= 1.0
            self.streamed(prompt_set, prompt)
        else:
            self.plain(prompt_set, prompt)

    def plain(self, prompt_set: str, prompt: str) -> None:
        with self.client.post("/v1/chat/completions", json=self.body(prompt, False),
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

    def streamed(self, prompt_set: str, prompt: str) -> None:
        start = time.perf_counter()
        first = last = None
        tokens = 0
        with self.client.post("/v1/chat/completions", json=self.body(prompt, True), stream=True,
                              name=f"chat-stream {prompt_set}", catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            try:
                for chunk in sse_chunks(r):
                    if chunk.get("usage"):
                        tokens = int(chunk["usage"]["completion_tokens"])
                    choices = chunk.get("choices") or []
                    if choices and choices[0].get("delta", {}).get("content"):
                        last = time.perf_counter()
                        first = first or last
            except Exception as e:  # a broken stream is a failed request, not a crash
                r.failure(f"stream broken: {e!r}")
                return
            if first is None or tokens <= 0:
                r.failure("stream ended without content or usage")
                return
            r.request_meta["response_length"] = tokens
            r.request_meta["response_time"] = (time.perf_counter() - start) * 1e3  # whole stream
            r.success()
        ttft = (first - start) * 1e3
        SAMPLES["ttft_ms"].append(ttft)
        _fire(self.environment, "TTFT", prompt_set, ttft)
        if tokens > 1:
            itl = (last - first) * 1e3 / (tokens - 1)
            SAMPLES["itl_ms"].append(itl)
            _fire(self.environment, "ITL", prompt_set, itl)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank-interpolated percentile (statistics.quantiles), None without samples."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def summarize(environment) -> dict:
    """Requests/s, output tokens/s, p50/p95 TTFT and ITL, failures, over the whole run."""
    stats = environment.stats
    chat = [e for (name, method), e in stats.entries.items()
            if method == "POST" and name.startswith("chat")]
    requests_ok = sum(e.num_requests - e.num_failures for e in chat)
    failures = sum(e.num_failures for e in chat) + sum(
        e.num_failures for (_, m), e in stats.entries.items() if m != "POST")
    tokens = sum(e.total_content_length for e in chat)
    end = stats.total.last_request_timestamp or time.time()
    duration = max(end - STARTED.get("t", stats.total.start_time), 1e-9)

    def r3(x):
        return None if x is None else round(x, 3)

    return {
        "users": environment.runner.target_user_count if environment.runner else None,
        "duration_s": round(duration, 2),
        "requests": sum(e.num_requests for e in chat),
        "failures": failures,
        "requests_per_s": r3(requests_ok / duration),
        "output_tokens": tokens,
        "output_tokens_per_s": r3(tokens / duration),
        "ttft_p50_ms": r3(percentile(SAMPLES["ttft_ms"], 0.50)),
        "ttft_p95_ms": r3(percentile(SAMPLES["ttft_ms"], 0.95)),
        "itl_p50_ms": r3(percentile(SAMPLES["itl_ms"], 0.50)),
        "itl_p95_ms": r3(percentile(SAMPLES["itl_ms"], 0.95)),
        "streamed_requests": len(SAMPLES["ttft_ms"]),
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
    path = environment.parsed_options.summary_json
    if path:
        Path(path).write_text(json.dumps(summarize(environment), indent=2) + "\n")

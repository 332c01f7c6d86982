"""Observability on a real DOMINO server (CPU, float32 SmolLM2, constructed repeat drafter, B = 4):
the domino_ counters agree with the per-request statistics summed over the requests sent, a
headless locust run completes without failures, and a real Prometheus scraping the server
answers every PromQL query the README and the Grafana dashboard publish.

One server for the module. The repeat drafter (tests/harness/drafters.py) is accepted on a
repetitive prompt and rejected elsewhere, so rounds with 0..3 accepted drafts and head overrides
occur.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest
import requests
import yaml

from domino_sglang.cli.local_server import free_port, sse_chunks
from tests.harness.drafters import make_repeat_drafter
from tests.harness.promql import ROOT, dashboard_queries, readme_queries
from tests.harness.servers import start_server

pytestmark = pytest.mark.server
BLOCK = 4
REPEAT_PROMPT = "Repeat the word cat ten times: cat cat cat cat"


@pytest.fixture(scope="module")
def server(target_path, tmp_path_factory):
    drafter = make_repeat_drafter(target_path, tmp_path_factory.mktemp("obs") / "repeat4", BLOCK)
    with start_server("domino-obs", ["--dtype", "float32", "--max-total-tokens", "16384"],
                      ["--speculative-algorithm", "DOMINO", "--speculative-draft-model-path",
                       str(drafter),
                       # the drafter's own rounds: copying " cat" (lookup.py) would take them over
                       "--speculative-domino-lookup", "off"]) as s:
        yield s


def scrape(server) -> dict[tuple[str, str], float]:
    """/metrics as {(name, label text without model_name): value}, summed over the rest."""
    out: dict[tuple[str, str], float] = {}
    for line in requests.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        keep = ",".join(sorted(lab for lab in labels.rstrip("}").split(",")
                               if lab and lab.split("=")[0] in ("position", "outcome", "reason",
                                                                "kind", "le", "part")))
        out[(name, keep)] = out.get((name, keep), 0.0) + float(value)
    return out


def delta(after, before, name, labels=""):
    return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)


def chat(server, prompt, max_tokens, stream=False):
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "return_spec_tokens_details": True,
            "stream": stream}
    r = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=600,
                      stream=stream)
    r.raise_for_status()
    if not stream:
        return r.json()["sglext"]["spec_tokens_details"]
    details = None
    for chunk in sse_chunks(r):
        if (chunk.get("sglext") or {}).get("spec_tokens_details"):
            details = chunk["sglext"]["spec_tokens_details"]
    assert details is not None, "no spec_tokens_details in the stream"
    return details


def test_domino_counters_equal_per_request_stats(server, tokenizer):
    before = scrape(server)
    stats = []
    ids = tokenizer(REPEAT_PROMPT).input_ids
    for max_tokens in (40, 10):  # native API: meta_info
        r = requests.post(f"{server.url}/generate", json={
            "input_ids": ids, "sampling_params": {"temperature": 0,
                                                  "max_new_tokens": max_tokens}}, timeout=600)
        r.raise_for_status()
        stats.append(r.json()["meta_info"])
    stats.append(chat(server, REPEAT_PROMPT, 24))                           # OpenAI, plain
    stats.append(chat(server, "Explain photosynthesis briefly.", 16, stream=True))  # streamed
    after = scrape(server)

    rounds = sum(s["spec_verify_ct"] for s in stats)
    accepted = sum(s["spec_num_correct_drafts"] for s in stats)
    assert rounds > 0 and accepted > 0  # the repeat drafter is accepted on the cat prompt
    assert delta(after, before, "domino_verify_rounds_total") == rounds
    assert delta(after, before, "sglang:spec_verify_calls_total") == rounds
    assert delta(after, before, "domino_draft_tokens_accepted_total") == accepted
    # one request at a time: one batched round per request-round, each of one kind (no
    # prompt lookup on this server: plain or the drafter's)
    kinds = {k: delta(after, before, "domino_rounds_total", f'kind="{k}"')
             for k in ("plain", "draft", "mixed", "copy")}
    assert sum(kinds.values()) == rounds and kinds["draft"] > 0, kinds
    # Requests were sent one at a time, so every batched round verified one request: the
    # draft-length histogram has one observation per round and proposed = sum of (L - 1).
    # (SGLang's per-request spec_num_proposed_drafts assumes L = B; the adaptive policy may
    # verify fewer, so ours can only be smaller.)
    proposed = delta(after, before, "domino_draft_tokens_proposed_total")
    assert delta(after, before, "domino_draft_length_count") == rounds
    assert proposed == delta(after, before, "domino_draft_length_sum") - rounds
    assert accepted <= proposed <= sum(s["spec_num_proposed_drafts"] for s in stats)
    # accepted at position p = rounds with >= p accepted drafts (from the per-request histograms)
    for p in range(1, BLOCK):
        expected = sum(n for s in stats
                       for k, n in enumerate(s["spec_correct_drafts_histogram"]) if k >= p)
        got = delta(after, before, "domino_accepted_tokens_by_position_total", f'position="{p}"')
        assert got == expected, (p, got, expected)
    # tau per request: SGLang's accept length = completion tokens / rounds
    for s in stats:
        if "completion_tokens" in s:
            assert s["spec_accept_length"] == pytest.approx(s["completion_tokens"]
                                                           / s["spec_verify_ct"])
    # the head overrides the backbone on the repetitive prompt (the drafter is built that way)
    right = delta(after, before, "domino_head_changed_tokens_total", 'outcome="right"')
    wrong = delta(after, before, "domino_head_changed_tokens_total", 'outcome="wrong"')
    assert right > 0 and right + wrong <= rounds * (BLOCK - 1)
    # one draft/verify timing and one draft-length observation per batched round
    n = delta(after, before, "domino_draft_seconds_count")
    assert n > 0 and delta(after, before, "domino_verify_seconds_count") == n
    assert delta(after, before, "domino_draft_seconds_sum") > 0
    # the adaptive policy timed its rounds (a calibration round at bs 1, then speculative
    # ones) and learned its costs off the neutral prior (costs.OnlineCosts): k != 1, and the
    # learned draft and per-token overheads exported. k is the learned L = 2 overhead over the
    # prior's: near 0 where drafting costs next to nothing beside the target's forward (float32
    # on an AVX2 CPU: 0.04), so only its sign and finiteness are the server's to guarantee
    k = after[("domino_cost_scale", "")]
    assert k != 1.0 and 0.0 <= k < 16
    draft = after[("domino_cost_overhead", 'part="draft"')]
    per_token = after[("domino_cost_overhead", 'part="per_token"')]
    assert 0.0 <= draft < 16 and 0.0 <= per_token < 16 and (draft, per_token) != (0.36, 0.04)
    tau = (accepted + rounds) / rounds
    print(f"\n{len(stats)} requests: {rounds} rounds, {accepted} accepted drafts, tau {tau:.2f}, "
          f"head overrides right {right:.0f} / wrong {wrong:.0f}, cost scale k {k:.2f}")


def test_headless_locust_run(server, tmp_path):
    # the maintained script as `make loadtest` runs it (a subprocess: tests never import
    # benchmarks/); its summary JSON carries what the run measured
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "loadtest.py"), "--host",
                        server.url, "--users", "3", "--duration", "12s", "--out", str(tmp_path),
                        "--stem", "lt", "--max-tokens", "8", "--stream-ratio", "0.5"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    s = json.loads((tmp_path / "lt_summary.json").read_text())
    print(f"\nlocust: {s['requests']} requests, {s['output_tokens_per_s']} tok/s, "
          f"TTFT p50 {s['ttft_p50_ms']} ms, TPOT p50 {s['tpot_p50_ms']} ms, "
          f"ITL p50 {s['itl_p50_ms']} ms, tau {s['domino']['tau']}")
    assert s["failures"] == 0 and s["errors"] == []
    assert s["requests"] >= 3 and s["output_tokens"] == 8 * s["requests"]
    # one locust entry per HTTP request: nothing else is counted
    assert s["locust_total_requests"] == s["requests"]
    assert s["streamed_requests"] >= 3 and s["ttft_p50_ms"] > 0 and s["tpot_p50_ms"] > 0
    assert s["latency"]["ITL"]["count"] >= s["streamed_requests"]  # several gaps per answer
    assert s["requests"] > s["streamed_requests"]  # non-streamed ones too
    # the run's tau from the /metrics deltas: every request here is speculative
    d = s["domino"]
    assert d["verify_rounds"] > 0 and d["tau"] == round(
        (d["accepted_drafts"] + d["verify_rounds"]) / d["verify_rounds"], 4)
    rows = (tmp_path / "lt_stats.csv").read_text().splitlines()
    types = {r.split(",")[0] for r in rows[1:]}
    names = {r.split(",")[1] for r in rows[1:]}
    assert types == {"POST", ""}  # the requests and the Aggregated row only
    agg = next(r.split(",") for r in rows[1:] if r.split(",")[1] == "Aggregated")
    assert int(agg[2]) == s["requests"]
    assert any(n.startswith("chat-stream ") for n in names)
    assert any(n.startswith("chat ") for n in names)
    lat = (tmp_path / "lt_latency.csv").read_text().splitlines()
    assert {r.split(",")[0] for r in lat[1:]} == {"TTFT", "TPOT", "ITL"}
    for f in ("lt_stats_history.csv", "lt_failures.csv", "lt_summary.json", "lt_summary.md"):
        assert (tmp_path / f).exists(), f
    assert "requests/s" in (tmp_path / "lt_summary.md").read_text()


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    """Debian's prometheus on a loopback port, deploy/prometheus.yml pointed at the server."""
    import shutil

    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not found: `make tools` installs the Debian package prometheus")
    work = tmp_path_factory.mktemp("prometheus")
    cfg = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = "1s"
    cfg["scrape_configs"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{server.port}"]
    (work / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    for _ in range(3):  # a port taken between free_port() and the bind: a new port
        proc, url = _launch_prometheus(binary, work)
        if url is not None:
            break
    else:
        raise AssertionError(f"prometheus: its port was taken 3 times ({work / 'prometheus.log'})")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _launch_prometheus(binary: str, work) -> tuple[subprocess.Popen, str | None]:
    """Start Prometheus on a fresh loopback port and wait until it is ready: (process, url), or
    (exited process, None) when the port was taken before it bound it."""
    port = free_port()
    log_path = work / "prometheus.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={work / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/-/ready", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            if "address already in use" in log_path.read_text(errors="replace"):
                return proc, None
            raise AssertionError(log_path.read_text(errors="replace")[-3000:])
        time.sleep(0.5)
    proc.terminate()
    proc.wait(timeout=30)
    raise AssertionError(f"prometheus not ready after 60 s:\n{log_path.read_text()[-3000:]}")


def query(prom: str, q: str) -> list:
    r = requests.get(f"{prom}/api/v1/query", params={"query": q}, timeout=30).json()
    assert r["status"] == "success", (q, r)
    return r["data"]["result"]


def test_prometheus_answers_every_published_query(server, prometheus, tokenizer):
    # traffic while Prometheus scrapes, so rates over the window are non-zero: first wait for
    # a scrape BEFORE the traffic (else the series could start after it, flat: rate 0, tau NaN)
    deadline = time.monotonic() + 60
    while not query(prometheus, 'domino_verify_rounds_total{job="domino-sglang"}'):
        assert time.monotonic() < deadline, "Prometheus never scraped the server"
        time.sleep(0.5)
    time.sleep(1.5)
    ids = tokenizer(REPEAT_PROMPT).input_ids
    requests.post(f"{server.url}/generate", json={"input_ids": ids, "sampling_params": {
        "temperature": 0, "max_new_tokens": 16}}, timeout=600).raise_for_status()
    chat(server, "Write a haiku about the sea.", 8, stream=True)
    # the scraped counters are the server's own: wait (30 s at most) for a scrape after the
    # last request (1 s interval, but a scrape can run late on a busy machine)
    direct = scrape(server)[("domino_verify_rounds_total", "")]
    deadline, scraped = time.monotonic() + 30, None
    while scraped != direct and time.monotonic() < deadline:
        time.sleep(0.5)
        result = query(prometheus, "sum(domino_verify_rounds_total)")
        scraped = float(result[0]["value"][1]) if result else None
    assert scraped == direct, (scraped, direct)
    up = query(prometheus, 'max_over_time(up{job="domino-sglang"}[30s])')
    assert up and up[0]["value"][1] == "1"
    # rate() needs two samples of a series, and some first appeared with this traffic: each
    # query gets until the deadline (a few more 1 s scrapes) to answer
    deadline = time.monotonic() + 30
    for source, queries in (("README", readme_queries()), ("dashboard", dashboard_queries())):
        for q in queries:
            while not (result := query(prometheus, q)) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert result, f"{source} query returned nothing: {q}"
    tau = float(query(prometheus, readme_queries()[1])[0]["value"][1])
    assert math.isfinite(tau) and 1.0 <= tau <= BLOCK
    print(f"\nPrometheus: {len(readme_queries())} README + {len(dashboard_queries())} dashboard "
          f"queries answered; tau over 5m {tau:.2f}")

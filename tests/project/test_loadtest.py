"""The load test's accounting without a server: TTFT / TPOT / per-chunk ITL of a streamed
answer, the prompts file, and tau from /metrics deltas (benchmarks/loadgen.py, used by
benchmarks/loadtest.py and locustfile.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.loadgen import (
    domino_deltas,
    latency_summary,
    load_prompt_file,
    parse_domino_counters,
    stream_latencies,
)

ROOT = Path(__file__).resolve().parents[2]


def test_stream_latencies_separate_ttft_tpot_and_chunk_gaps():
    # request sent at t = 10.0 s; 4 content chunks carrying 7 tokens (a speculative server
    # sends several tokens per chunk)
    lat = stream_latencies(10.0, [10.5, 10.7, 10.8, 11.1], tokens=7)
    assert lat["TTFT"] == [pytest.approx(500.0)]
    assert lat["TPOT"] == [pytest.approx(600.0 / 6)]  # (t_last - t_first) / (tokens - 1)
    assert lat["ITL"] == [pytest.approx(x) for x in (200.0, 100.0, 300.0)]  # one per gap
    one = stream_latencies(0.0, [0.25], tokens=1)
    assert one == {"TTFT": [pytest.approx(250.0)], "TPOT": [], "ITL": []}
    assert stream_latencies(0.0, [], tokens=0) == {"TTFT": [], "TPOT": [], "ITL": []}


def test_latency_summary_percentiles():
    samples = [("ITL", "s", float(v)) for v in range(1, 101)] + [("TTFT", "s", 7.0)]
    out = latency_summary(samples)
    assert out["ITL"]["count"] == 100 and out["ITL"]["mean_ms"] == 50.5
    assert out["ITL"]["p50_ms"] == 50.5 and out["ITL"]["p99_ms"] == pytest.approx(99.01)
    assert out["TTFT"] == {"count": 1, "mean_ms": 7.0, "p50_ms": 7.0, "p90_ms": 7.0,
                           "p99_ms": 7.0}
    assert out["TPOT"]["count"] == 0 and out["TPOT"]["p50_ms"] is None


def test_prompt_file(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "hi"}) + "\n\n" + json.dumps(
        {"messages": [{"role": "user", "content": "yo"}], "max_tokens": 5}) + "\n")
    assert load_prompt_file(f) == [[{"role": "user", "content": "hi"}],
                                   [{"role": "user", "content": "yo"}]]
    f.write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: expected"):
        load_prompt_file(f)
    f.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"p.jsonl:1: not JSON"):
        load_prompt_file(f)


def test_loadtest_checks_its_prompts_file_before_the_server(tmp_path):
    # the maintained script, run as users run it: the shipped prompts file passes its check
    # (then no server answers on the closed port), a broken one is refused by line
    script = [sys.executable, str(ROOT / "benchmarks" / "loadtest.py"), "--host",
              "http://127.0.0.1:9", "--out", str(tmp_path)]
    shipped = ROOT / "benchmarks" / "data" / "loadtest-prompts.jsonl"
    r = subprocess.run([*script, "--prompts", str(shipped)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "no healthy server at http://127.0.0.1:9" in r.stderr, r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    r = subprocess.run([*script, "--prompts", str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "loadtest: --prompts: " in r.stderr and "bad.jsonl:2" in r.stderr


def test_tau_from_metrics_deltas():
    m = 'model_name="m"'
    before = f"""# HELP x
domino_verify_rounds_total{{{m}}} 100.0
domino_draft_tokens_accepted_total{{{m}}} 50.0
domino_draft_tokens_proposed_total{{{m}}} 300.0
domino_rounds_total{{{m},kind="draft"}} 10.0
domino_draft_length_bucket{{{m},le="4"}} 3.0
domino_cost_scale{{{m}}} 1.0
"""
    after = before.replace(" 100.0", " 160.0").replace(" 50.0", " 140.0").replace(
        " 300.0", " 480.0").replace("domino_cost_scale{" + m + "} 1.0",
                                    "domino_cost_scale{" + m + "} 1.25")
    d = domino_deltas(parse_domino_counters(before), parse_domino_counters(after))
    assert d["verify_rounds"] == 60 and d["accepted_drafts"] == 90
    assert d["tau"] == 2.5  # (90 + 60) / 60: committed tokens per round, bonus included
    assert d["acceptance_rate"] == 0.5  # 90 / 180
    assert d["cost_scale"] == 1.25
    assert d["counters"]['domino_rounds_total{kind="draft"}'] == 0
    assert not any("bucket" in k for k in d["counters"])

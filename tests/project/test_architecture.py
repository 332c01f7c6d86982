"""The package's layers: which part of domino_sglang may import which, and no import cycles.

Data flows one way: the CLI starts SGLang, SGLang loads the integration, the integration runs
the device-neutral round (spec/) over the drafter model (model/). Every import counts, also one
inside a function or under TYPE_CHECKING: a lazy import still couples the two modules. The
allowed dependencies are the table below; a planted forbidden import and a planted cycle show
the checks able to fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "domino_sglang"

# part -> the parts it may import (a part: a subpackage, or a module at the package's root)
ALLOWED: dict[str, set[str]] = {
    "paths": set(),
    "model": {"paths"},  # checkpoint config, drafter module, vocabulary, hub, shards
    "spec": {"model"},  # the round, torch only: no SGLang, no device runtime
    "sglang_compat": {"model"},  # every SGLang name; builds model.shard.Shard from its TP group
    "http": {"sglang_compat", "spec"},
    "cpu": {"paths", "sglang_compat", "spec", "model"},
    "integration": {"paths", "sglang_compat", "spec", "model", "http", "cpu"},
    "train": {"paths", "model", "spec"},  # never the worker, never SGLang
    "cli": {"paths", "sglang_compat", "spec", "model", "http", "cpu", "integration", "train"},
    "__init__": {"integration"},  # register() only
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path) -> set[str]:
    """The package's modules `path` imports, anywhere in the file."""
    package, name = root.name, module_name(path, root)
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    modules = {module_name(p, root) for p in root.rglob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from package import module` imports the module (package __init__s hold no code)
            subs = {f"{base}.{a.name}" for a in node.names} & modules
            found |= subs or {base}
    return {m for m in found if m in modules and m != name and m.split(".")[0] == package}


def graph(root: Path) -> dict[str, set[str]]:
    return {module_name(p, root): imports(p, root) for p in sorted(root.rglob("*.py"))}


def part(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def forbidden(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in edges.items() for d in deps
                  if part(d) != part(m) and part(d) not in ALLOWED.get(part(m), set()))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that is on one (depth-first search)."""
    found, state = [], {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = "open"
        for d in sorted(edges.get(m, ())):
            if state.get(d) == "open":
                found.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    return found


def test_every_part_is_in_the_table():
    assert {part(m) for m in graph(PACKAGE)} <= set(ALLOWED)


def test_the_table_is_layered():
    """The allowed dependencies themselves form no cycle between parts."""
    assert cycles(ALLOWED) == []


def test_imports_follow_the_layers():
    assert forbidden(graph(PACKAGE)) == []


def test_no_import_cycles():
    assert cycles(graph(PACKAGE)) == []


def test_only_sglang_compat_imports_sglang():
    """Every SGLang name the package uses goes through sglang_compat.py (tests pin it)."""
    users = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "sglang" or n.startswith("sglang.") for n in names):
                users.append(module_name(path, PACKAGE))
    assert set(users) == {"domino_sglang.sglang_compat"}


def test_the_checks_find_a_planted_forbidden_import_and_a_planted_cycle(tmp_path):
    root = tmp_path / "domino_sglang"
    for sub in ("spec", "model", "integration"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text('"""x"""\n')
    (root / "__init__.py").write_text('"""x"""\n')
    (root / "model" / "a.py").write_text("def f():\n    from domino_sglang.integration import w\n")
    (root / "integration" / "w.py").write_text("from domino_sglang.model import a\n")
    (root / "spec" / "p.py").write_text("from .q import x\n")
    (root / "spec" / "q.py").write_text("from domino_sglang.spec import p\n")
    edges = graph(root)
    assert forbidden(edges) == ["domino_sglang.model.a -> domino_sglang.integration.w"]
    assert sorted(sorted(set(c)) for c in cycles(edges)) == [
        ["domino_sglang.integration.w", "domino_sglang.model.a"],
        ["domino_sglang.spec.p", "domino_sglang.spec.q"]]


TESTS = Path(__file__).resolve().parents[1]
# tests/ folders that mirror no subpackage: the served tests, the reliability suite, the harness
# (shared helpers, fixtures, and tests of those), and the project's own checks (docs, packaging)
APART = {"server", "reliability", "harness", "project"}


def test_tests_mirror_the_package():
    """Each subpackage's unit tests sit in tests/<subpackage>/; no test file sits flat in tests/."""
    subpackages = {p.parent.name for p in PACKAGE.glob("*/*.py")}
    folders = {p.parent.name for p in TESTS.glob("*/__init__.py")}
    assert subpackages <= folders, f"subpackages without a tests/ folder: {subpackages - folders}"
    stray = folders - subpackages - APART
    assert not stray, f"tests/ folders that mirror nothing: {stray}"
    assert not list(TESTS.glob("test_*.py")), "test files flat in tests/: move them to their part"
    for folder in folders:
        assert list((TESTS / folder).glob("test_*.py")), f"tests/{folder}/ holds no tests"

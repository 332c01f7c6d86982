"""Product code reads as product code: no dates, issue or stage numbers in domino_sglang's
Python (measurements and lineage live in docs/ and benchmarks/results/)."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "domino_sglang"
LAB_NOTES = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}|issue [0-9]+|stage [0-9]+")


def lab_notes(root: Path) -> list[str]:
    return [f"{path.relative_to(root.parent)}:{n}: {line.strip()}"
            for path in sorted(root.rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if LAB_NOTES.search(line)]


def test_no_dates_issue_or_stage_numbers_in_the_package(tmp_path):
    assert lab_notes(PACKAGE) == []
    planted = tmp_path / "domino_sglang"  # the check itself finds what it is for
    planted.mkdir()
    (planted / "x.py").write_text('"""Fixed in issue 12 (2026-01-02)."""\n')
    assert len(lab_notes(planted)) == 1


NEUTRAL = ("rollout", "sampling", "verify", "pointer", "graphs", "planner", "policy", "costs",
           "lookup", "observer", "context", "kernels", "proposer", "drafter")


def test_the_device_neutral_round_imports_no_device_runtime():
    """The round's device-neutral modules never import the CPU runtime (cpu/): its kernels are
    installed at start-up by the worker (kernels.install)."""
    import ast

    found = {m: [n.module for n in ast.walk(ast.parse((PACKAGE / f"{m}.py").read_text()))
                 if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(
                     "domino_sglang.cpu")] for m in NEUTRAL}
    assert {m: v for m, v in found.items() if v} == {}


def test_an_installed_argmax_is_used_and_equals_torchs():
    import torch

    from domino_sglang import kernels
    from domino_sglang.cpu.argmax import argmax as cpu_argmax

    x = torch.randn(5, 3, 1024)
    calls = []

    def counted(t):
        calls.append(t.shape)
        return cpu_argmax(t)

    try:
        kernels.install(argmax=counted)
        assert torch.equal(kernels.argmax(x), x.argmax(dim=-1)) and calls == [x.shape]
    finally:
        kernels.install(argmax=None)
    assert torch.equal(kernels.argmax(x), x.argmax(dim=-1)) and len(calls) == 1

"""benchmarks/gpu_check.py at small dimensions on the CPU: it runs with SGLang
unimportable, every check passes (static-buffer draft runner == the dynamic call for the
backbone, greedy, sampled and pointer rollouts; verify; the device copy index; a few training
steps whose loss decreases), and the script
imports only torch and the standard library at module level."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def test_module_level_imports_are_torch_and_stdlib():
    tree = ast.parse(SCRIPT.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    assert names - {"torch"} <= set(sys.stdlib_module_names) | {"__future__"}, names


def test_quick_cpu_run_passes_without_sglang(tmp_path):
    out = tmp_path / "gpu_check.json"
    code = ("import sys, runpy; sys.modules['sglang'] = None; "  # `import sglang` fails
            f"sys.argv = ['gpu_check.py', '--device', 'cpu', '--quick', '--out', {str(out)!r}]; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
                          cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ok"] and result["copy_index"]["equal_copy_table"]
    kinds = {(r["kind"], r["bs"]) for r in result["draft"] if r["equal"]}
    assert kinds == {(k, b) for k in ("backbone", "greedy", "sampled", "pointer")
                     for b in (1, 3)}
    assert all(r["greedy_equal_cpu"] for r in result["verify"])
    startup = result["startup"]  # the start-up capture: memory figure == allocated, no growth
    assert startup["ok"] and startup["buffer_bytes"] == startup["allocated_bytes"] > 0
    assert startup["shrinking_sequence_ok"] and startup["trace_built_nothing"]
    assert startup["lengths"] == [2, 4, 8] and startup["capture_bytes_by_kind"]  # the widths
    sampled = result["sampled_rounds"]  # bounded top-k: the whole sort's tokens, bs 1 and 3
    assert [r["bs"] for r in sampled] == [1, 3] and all(r["equal"] for r in sampled)
    widths = result["draft_widths"]  # the draft pass timed per verify width and batch size
    assert widths["ok"] and set(widths["ms"]) == {f"bs{b}_W{w}" for b in (1, 3) for w in (2, 4, 8)}
    train = result["train"]  # a few optimizer steps of the training loss: finite, decreasing
    assert train["finite"] and train["decreased"] and len(train["losses"]) == train["steps"]


def test_static_runner_reads_its_buffers_and_rejects_other_shapes():
    from domino_sglang.spec.graphs import StaticRunner, bucket_for

    runner = StaticRunner(lambda x: (x * 2,), {"x": torch.zeros(3)}, capture=False)
    assert torch.equal(runner(x=torch.tensor([1.0, 2.0, 3.0]))[0], torch.tensor([2.0, 4.0, 6.0]))
    with pytest.raises(ValueError, match="input 'x' has shape"):
        runner(x=torch.zeros(4))
    assert (bucket_for(1), bucket_for(3), bucket_for(9), bucket_for(65)) == (1, 4, 16, None)

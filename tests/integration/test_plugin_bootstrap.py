"""The install-time hook and the plugin entry point: active only when asked, never shadowing."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

PROBE = (
    "import importlib.util, sys\n"
    "from domino_sglang.cpu import bootstrap\n"
    "spec = importlib.util.find_spec('sgl_kernel')\n"
    "print(bootstrap.is_active(), spec is not None and spec.origin)\n"
)


def _probe(env_extra: dict, pythonpath: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SGLANG_USE_CPU_ENGINE", "DOMINO_SGLANG_NO_CPU_KERNELS", "PYTHONPATH")}
    env.update(env_extra)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.strip()


def test_hook_is_off_without_the_cpu_engine():
    assert _probe({}) == "False False"


def test_hook_provides_the_cpu_ops_when_the_cpu_engine_is_requested():
    assert _probe({"SGLANG_USE_CPU_ENGINE": "1"}) == "True domino_sglang.cpu.kernels"


def test_hook_can_be_disabled():
    assert _probe({"SGLANG_USE_CPU_ENGINE": "1", "DOMINO_SGLANG_NO_CPU_KERNELS": "1"}) \
        == "False False"


def test_hook_never_shadows_a_real_sgl_kernel(tmp_path):
    real = tmp_path / "sgl_kernel"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    out = _probe({"SGLANG_USE_CPU_ENGINE": "1"}, pythonpath=str(tmp_path))
    assert out == f"False {real / '__init__.py'}"


def test_standin_exposes_only_our_ops():
    code = (
        "import sgl_kernel, sgl_kernel.speculative\n"
        "from domino_sglang.cpu import kernels\n"
        "assert sgl_kernel.assign_req_to_token_pool_cpu is kernels.assign_req_to_token_pool_cpu\n"
        "for bad in ('from sgl_kernel import silu_and_mul', 'import sgl_kernel.flash_attn'):\n"
        "    try:\n"
        "        exec(bad)\n"
        "    except ImportError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit('imported: ' + bad)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_entry_point_and_idempotent_register():
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "domino"]
    assert len(eps) == 1 and eps[0].value == "domino_sglang:register"
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    register = eps[0].load()
    register()
    register()
    assert ATTENTION_BACKEND_CHOICES.count("domino_cpu") == 1
    assert "domino_cpu" in ATTENTION_BACKENDS

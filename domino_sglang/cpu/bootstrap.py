"""Pre-import hook: give SGLang's CPU engine the few `sgl_kernel` CPU ops it calls, in pure torch.

SGLang imports `sgl_kernel.*_cpu` ops at module import time when `SGLANG_USE_CPU_ENGINE=1`, and
its scheduler subprocesses import those modules before plugins load, so a plugin `register()` is
too late. The `domino_sglang_cpu.pth` file that our wheel installs into site-packages calls
`install()` at interpreter start-up, only when the CPU engine is requested. `install()` then does
nothing unless no real `sgl_kernel` is installed: a real (GPU or CPU) build is never shadowed.

The stand-in module exposes ONLY the ops implemented in `domino_sglang.cpu.kernels` (top level,
plus `sgl_kernel.speculative` which SGLang's NGRAM tree code imports); every other name and
submodule raises ImportError, so SGLang's own `try: from sgl_kernel import X`
fallbacks keep working. This module must stay cheap: it runs in every Python process of the venv
that has the env var set, and it imports torch only when `sgl_kernel` is actually imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

STANDIN_NAME = "sgl_kernel"
# module name -> name of the tuple in domino_sglang.cpu.kernels listing the ops it exposes
_MODULES = {
    STANDIN_NAME: "SGL_KERNEL_CPU_OPS",
    f"{STANDIN_NAME}.speculative": "SGL_KERNEL_SPECULATIVE_OPS",
}
DISABLE_ENV = "DOMINO_SGLANG_NO_CPU_KERNELS"
HUGEPAGES_TUNABLE = "glibc.malloc.hugetlb"
NCCL_ENV, NO_NCCL = "SGLANG_NCCL_SO_PATH", "none: the CPU engine communicates over gloo"


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `sgl_kernel` (and `sgl_kernel.speculative`) and builds them from our torch ops."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MODULES:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, self, origin="domino_sglang.cpu.kernels",
            is_package=fullname == STANDIN_NAME,
        )

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        from domino_sglang.cpu import kernels

        for name in getattr(kernels, _MODULES[module.__name__]):
            setattr(module, name, getattr(kernels, name))
        module.__version__ = "0.0.0+domino-sglang-cpu-standin"
        module.DOMINO_SGLANG_STANDIN = True


_FINDER = _StandInFinder()


def env_switch(name: str) -> bool:
    """Whether environment variable `name` is "1": the one rule for the switches of the process
    environment that the CPU runtime reads (SGLANG_USE_CPU_ENGINE and our kill switches).
    DOMINO's serving options are flags (options.py), never environment variables."""
    return os.environ.get(name) == "1"


def malloc_tunables_with_hugepages() -> str:
    """This process's GLIBC_TUNABLES with glibc.malloc.hugetlb=1 added (glibc then advises
    transparent huge pages for what it maps), unless it sets that tunable already (the user's
    value wins); what `domino-sglang serve` hands a CPU server."""
    given = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t]
    if any(t.split("=", 1)[0] == HUGEPAGES_TUNABLE for t in given):
        return ":".join(given)
    return ":".join([*given, f"{HUGEPAGES_TUNABLE}=1"])


def should_install() -> bool:
    """True when the CPU engine is requested and no real sgl_kernel can be found."""
    if not env_switch("SGLANG_USE_CPU_ENGINE") or env_switch(DISABLE_ENV):
        return False
    if _FINDER in sys.meta_path:
        return False
    return importlib.util.find_spec(STANDIN_NAME) is None


def install() -> bool:
    """Put the stand-in finder at the end of sys.meta_path (idempotent). Returns True if active."""
    if _FINDER in sys.meta_path:
        return True
    if not should_install():
        return False
    sys.meta_path.append(_FINDER)
    # Tensor parallelism on the CPU engine runs over gloo (SGLang's all-reduce on CPU tensors),
    # but SGLang also opens NCCL for every TP group when it can load libnccl, which the CUDA
    # build of torch ships: its communicator then asks for a CUDA device and the server dies.
    # A library path that does not load makes SGLang skip NCCL ("missing NCCL library").
    os.environ.setdefault(NCCL_ENV, NO_NCCL)
    return True


def is_active() -> bool:
    return _FINDER in sys.meta_path

"""sglang_compat.py is the one place the plugin touches SGLang's private internals: pin the SGLang
version it was written against and check that every touched name still exists there."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import re
import subprocess
import sys

import pytest

from domino_sglang import sglang_compat


def _resolve(path: str):
    """The object at a dotted path `module[.Class[.attr]]`: the longest importable module prefix,
    then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def test_pinned_sglang_version():
    assert importlib.metadata.version("sglang") == sglang_compat.SGLANG_VERSION == "0.5.23", (
        "sglang_compat.py was written against sglang 0.5.23: re-check TOUCHPOINTS and the "
        "worker's round before moving the pin")


@pytest.mark.parametrize("path,fields", sorted(
    sglang_compat.TOUCHPOINTS["dataclass fields"].items()))
def test_dataclass_fields_exist(path, fields):
    cls = _resolve(path)
    names = {f.name for f in dataclasses.fields(cls)}
    assert not set(fields) - names, f"{path} lost fields {sorted(set(fields) - names)}"


@pytest.mark.parametrize("path,keywords", sorted(sglang_compat.TOUCHPOINTS["keywords"].items()))
def test_keyword_arguments_exist(path, keywords):
    params = inspect.signature(_resolve(path)).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    missing = [k for k in keywords if k not in params]
    assert takes_any or not missing, f"{path} no longer takes {missing}"


@pytest.mark.parametrize("path,names", sorted(sglang_compat.TOUCHPOINTS["attributes"].items()))
def test_attributes_exist(path, names):
    obj = _resolve(path)
    assert [n for n in names if not hasattr(obj, n)] == []


@pytest.mark.parametrize("path,names", sorted(sglang_compat.TOUCHPOINTS["init assigns"].items()))
def test_init_assigns_attributes(path, names):
    source = inspect.getsource(_resolve(path).__init__)
    assigned = set(re.findall(r"self\.(\w+)\s*=(?!=)", source))  # self.a = ...
    for targets in re.findall(r"^\s*(self\.\w+(?:\s*,\s*self\.\w+)+)\s*=", source, re.M):
        assigned.update(re.findall(r"self\.(\w+)", targets))  # self.a, self.b = ...
    assert [n for n in names if n not in assigned] == []


@pytest.mark.parametrize("path,names", sorted(sglang_compat.TOUCHPOINTS["class assigns"].items()))
def test_class_assigns_attributes(path, names):
    source = inspect.getsource(_resolve(path))
    assert [n for n in names if f"self.{n} =" not in source] == []


@pytest.mark.parametrize("path,names", sorted(sglang_compat.TOUCHPOINTS["struct fields"].items()))
def test_struct_fields_exist(path, names):
    fields = _resolve(path).__struct_fields__
    assert [n for n in names if n not in fields] == []


def test_hook_targets_exist():
    for target, when in sglang_compat.HOOKS.values():
        assert callable(_resolve(target)), target
        assert hasattr(_resolve("sglang.srt.plugins.hook_registry.HookType"), when)


def test_resolution_steps_are_overridable_and_run_by_the_pipeline():
    from sglang.srt.arg_groups import pipeline
    from sglang.srt.arg_groups.resolution_hooks import _OVERRIDABLE_HOOKS

    source = inspect.getsource(pipeline.run_resolution_pipeline)
    for step in sglang_compat.RESOLUTION_STEPS.values():
        assert step in _OVERRIDABLE_HOOKS and f"run_hook({step}," in source, step


@pytest.mark.parametrize("name,module", sorted(sglang_compat.LAZY.items()))
def test_lazy_reexports_are_sglangs_objects(name, module):
    assert getattr(sglang_compat, name) is getattr(importlib.import_module(module), name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        sglang_compat.NoSuchThing  # noqa: B018


def test_modules_probed_by_name_are_the_ones_compat_imports():
    """guards.py looks SGLang's HTTP server up in sys.modules by name (never importing it):
    that name must stay the module sglang_compat takes the app from."""
    http = importlib.import_module(sglang_compat.HTTP_SERVER)
    assert sglang_compat.loaded_http_server() is http and hasattr(http, "app")


def test_cpu_kernels_mirror_sglangs_tree_mask_modes():
    """cpu/tree_kernels.py (imported at interpreter start-up, so without SGLang) hard-codes
    these."""
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode

    from domino_sglang.cpu import tree_kernels

    assert (tree_kernels._FULL_MASK, tree_kernels._QLEN_ONLY,
            tree_kernels._QLEN_ONLY_BITPACKING) == (
        TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY, TreeMaskMode.QLEN_ONLY_BITPACKING)


def test_the_cli_imports_no_sglang():
    code = ("import sys, domino_sglang.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_round_fields_restored_even_on_error():
    class Batch:
        pass

    batch = Batch()
    for i, name in enumerate(sglang_compat.ROUND_FIELDS):
        setattr(batch, name, i)
    with pytest.raises(RuntimeError), sglang_compat.batch_round_state(batch):
        for name in sglang_compat.ROUND_FIELDS:
            setattr(batch, name, "changed")
        raise RuntimeError("forward failed")
    assert [getattr(batch, n) for n in sglang_compat.ROUND_FIELDS] == list(
        range(len(sglang_compat.ROUND_FIELDS)))


def test_host_lens_grown_for_the_verify_build_only():
    import torch

    class Batch:
        seq_lens_cpu, seq_lens_sum = torch.tensor([3, 5]), 8

    batch = Batch()
    with sglang_compat.host_lens_grown(batch, 4):
        assert batch.seq_lens_cpu.tolist() == [7, 9] and batch.seq_lens_sum == 16
    assert batch.seq_lens_cpu.tolist() == [3, 5] and batch.seq_lens_sum == 8
    batch.seq_lens_cpu = None
    with sglang_compat.host_lens_grown(batch, 4):
        assert batch.seq_lens_cpu is None and batch.seq_lens_sum == 8

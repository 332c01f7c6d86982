"""Loaded by Python at start-up when benchmarks/studies/round_walk.py puts this folder on
PYTHONPATH: in the process that imports domino_sglang.integration.worker (SGLang's scheduler), wrap
DominoWorker.decode_round so that each round runs under a profile function recording every call
into domino_sglang that crosses from one of its modules into another. One JSON line per round
to $DOMINO_WALK_OUT. Measurement only: the product code has no hook for it."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections import Counter

OUT = os.environ.get("DOMINO_WALK_OUT")
SKIP = int(os.environ.get("DOMINO_WALK_SKIP", "3"))  # warm-up rounds not recorded


def _module_of(filename: str, root: str) -> str | None:
    """domino_sglang.x.y of a file under the package folder `root`, else None."""
    if not filename.startswith(root):
        return None
    return "domino_sglang." + filename[len(root):].removesuffix(".py").replace(os.sep, ".")


def _wrap(worker_module) -> None:
    cls = worker_module.DominoWorker
    inner = cls.decode_round
    root = os.path.dirname(os.path.dirname(worker_module.__file__)) + os.sep  # the package
    seen = {"rounds": 0}

    def decode_round(self, batch, *args, **kwargs):
        seen["rounds"] += 1
        if seen["rounds"] <= SKIP:
            return inner(self, batch, *args, **kwargs)
        edges: Counter = Counter()
        names: dict = {}

        def module(code):
            found = names.get(code)
            if found is None:
                found = names[code] = _module_of(code.co_filename, root) or ""
            return found

        def profile(frame, event, arg):
            if event != "call":
                return
            callee = module(frame.f_code)
            if not callee:
                return
            caller, direct = frame.f_back, True
            while caller is not None and not module(caller.f_code):
                caller, direct = caller.f_back, False
            if caller is None:
                return
            src = module(caller.f_code)
            if src != callee:
                edges[(src, caller.f_code.co_qualname, callee, frame.f_code.co_qualname,
                       direct)] += 1

        sampled = not bool((batch.sampling_info.top_ks <= 1).all())
        sys.setprofile(profile)
        try:
            out = inner(self, batch, *args, **kwargs)
        finally:
            sys.setprofile(None)
        bs, length, kind = self.observer.last_round
        line = {"kind": kind, "bs": bs, "L": length, "sampled": sampled,
                "edges": [[*k, n] for k, n in edges.items()]}
        with open(OUT, "a") as f:
            f.write(json.dumps(line) + "\n")
        return out

    cls.decode_round = decode_round


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the worker once domino_sglang.integration.worker has been executed."""

    def find_spec(self, name, path, target=None):
        if name != "domino_sglang.integration.worker":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module)

        loader.exec_module = exec_and_wrap
        return spec


if OUT:
    import importlib.util

    sys.meta_path.insert(0, _Finder())

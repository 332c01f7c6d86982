"""Loaded by Python at start-up when benchmarks/round_profile.py puts this folder on PYTHONPATH:
in SGLang's scheduler process, time each decode round by stage (and, every OPS_EVERY-th round
instead of timing it, count the torch ops each stage dispatches). A DOMINO server's stages are
its worker's own methods; a plain server's round is the target worker's decode forward. One
JSON line per round to $DOMINO_PROFILE_OUT. Measurement only: the product code has no hook."""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import time

OUT = os.environ.get("DOMINO_PROFILE_OUT")
OPS_EVERY = int(os.environ.get("DOMINO_PROFILE_OPS_EVERY", "4"))
SKIP = int(os.environ.get("DOMINO_PROFILE_SKIP", "3"))


class Rounds:
    """The state of the round being recorded: stage times (ms) or op counts, and a stack."""

    def __init__(self):
        self.n = 0
        self.active = None  # {"stages": {}, ...} while a round runs
        self.stack: list[str] = []
        self.last_end = None
        self.counting = False

    def enter(self, name: str):
        self.stack.append(name)
        return time.perf_counter()

    def leave(self, name: str, t0: float):
        self.stack.pop()
        if self.active is not None and not self.counting:
            dt = (time.perf_counter() - t0) * 1e3
            st = self.active["stages"]
            st[name] = st.get(name, 0.0) + dt
            if self.stack:  # a nested stage's time is not its parent's own
                parent = self.stack[-1]
                st[parent] = st.get(parent, 0.0) - dt


R = Rounds()


def _counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if R.active is not None:
                name = R.stack[-1] if R.stack else "round (own)"
                ops = R.active["ops"]
                ops[name] = ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    return Count


def stage(name: str, fn):
    def wrapped(*args, **kwargs):
        t0 = R.enter(name)
        try:
            return fn(*args, **kwargs)
        finally:
            R.leave(name, t0)

    return wrapped


def round_wrapper(fn, describe):
    """The round: fn(self, batch, ...) timed whole ("round (own)" is what no stage took)."""
    count_mode = None

    def wrapped(self, batch, *args, **kwargs):
        nonlocal count_mode
        if not describe.applies(batch):
            if batch is None or not batch.forward_mode.is_extend():
                return fn(self, batch, *args, **kwargs)
            return timed_prefill(fn, batch, self, batch, *args, **kwargs)
        R.n += 1
        start = time.perf_counter()
        gap = None if R.last_end is None else (start - R.last_end) * 1e3
        if R.n <= SKIP:
            out = fn(self, batch, *args, **kwargs)
            R.last_end = time.perf_counter()
            return out
        R.counting = R.n % OPS_EVERY == 0
        R.active = {"stages": {}, "ops": {}}
        t0 = R.enter("round (own)")
        try:
            if R.counting:
                count_mode = count_mode or _counter()
                with count_mode():
                    out = fn(self, batch, *args, **kwargs)
            else:
                out = fn(self, batch, *args, **kwargs)
        finally:
            R.leave("round (own)", t0)
        end = time.perf_counter()
        line = {"counting": R.counting, "bs": len(batch.reqs), **describe.after(self, batch),
                "round_ms": (end - start) * 1e3, "gap_ms": gap,
                "stages": R.active["stages"], "ops": R.active["ops"]}
        R.active, R.counting, R.last_end = None, False, end
        with open(OUT, "a") as f:
            f.write(json.dumps(line) + "\n")
        return out

    return wrapped


def timed_prefill(fn, batch, *args, **kwargs):
    """A prefill between two decode rounds, timed (one "prefill" line: ms, new tokens); the gap
    before the next round is not the scheduler's own."""
    start = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        end = time.perf_counter()
        R.last_end = None
        if R.n > SKIP:
            with open(OUT, "a") as f:
                f.write(json.dumps({"prefill": True, "ms": (end - start) * 1e3,
                                    "tokens": int(sum(batch.extend_lens))}) + "\n")


def after_prefill(fn):
    """The DOMINO worker's prefill, timed as timed_prefill."""
    def wrapped(self, batch, *args, **kwargs):
        return timed_prefill(fn, batch, self, batch, *args, **kwargs)

    return wrapped


class Domino:
    @staticmethod
    def applies(batch) -> bool:
        return not (batch.forward_mode.is_extend() or batch.is_extend_in_batch)

    @staticmethod
    def after(worker, batch) -> dict:
        bs, length, kind = worker.observer.last_round
        sampled = not bool((batch.sampling_info.top_ks <= 1).all())
        return {"kind": kind.split("+")[0] + (" sampled" if sampled else ""), "L": length}


class Plain:
    @staticmethod
    def applies(batch) -> bool:
        return batch is not None and batch.forward_mode.is_decode()

    @staticmethod
    def after(worker, batch) -> dict:
        return {"kind": "plain decoding", "L": 1}


def _patch(name: str, module) -> None:
    if name == "domino_sglang.integration.worker":
        W = module.DominoWorker
        for meth, label in (("open_chain", "open chain"), ("accept", "accept"),
                            ("commit", "commit"), ("write_draft_context", "draft context"),
                            ("settle_tree", "settle tree")):
            setattr(W, meth, stage(label, getattr(W, meth)))
        for fn, label in (("verify_forward", "verify forward"),  # target.py's, as imported
                          ("decode_forward", "verify forward"),
                          ("target_logits", "logits processing"),
                          ("target_choices", "tree accept"), ("follow", "tree accept")):
            setattr(module, fn, stage(label, getattr(module, fn)))
        W.decode_round = round_wrapper(W.decode_round, Domino)
        W.prefill = after_prefill(W.prefill)
        from domino_sglang.spec import observer, planner, pointer
        from domino_sglang.spec.proposers import domino, lookup

        planner.RoundPlanner.plan = stage("plan", planner.RoundPlanner.plan)
        lookup.PromptLookup.propose = stage("lookup", lookup.PromptLookup.propose)
        observer.RoundObserver.record = stage("observe", observer.RoundObserver.record)
        from domino_sglang.integration import draft_pass

        D = domino.DominoProposer
        draft_pass.DraftPass.__call__ = stage("draft pass", draft_pass.DraftPass.__call__)
        D.static_rollout = stage("head rollout", D.static_rollout)
        domino.greedy_rollout = stage("head rollout", domino.greedy_rollout)
        domino.sampled_rollout = stage("head rollout", domino.sampled_rollout)
        domino.grow_tree = stage("grow tree", domino.grow_tree)
        from domino_sglang.spec import tree

        tree.DraftTree.custom_mask = stage("tree mask", tree.DraftTree.custom_mask)
        for meth in ("history", "for_round"):
            setattr(pointer.CopyPaths, meth, stage("copy index", getattr(pointer.CopyPaths, meth)))
    elif name == "sglang.srt.managers.tp_worker" and os.environ.get("DOMINO_PROFILE_PLAIN"):
        T = module.TpModelWorker
        T.forward_batch_generation = round_wrapper(T.forward_batch_generation, Plain)
        from sglang.srt.model_executor.model_runner import ModelRunner

        ModelRunner.forward = stage("target forward", ModelRunner.forward)
        ModelRunner.sample = stage("sample", ModelRunner.sample)


class _Finder(importlib.abc.MetaPathFinder):
    WATCH = {"domino_sglang.integration.worker", "sglang.srt.managers.tp_worker"}

    def find_spec(self, name, path, target=None):
        if name not in self.WATCH:
            return None
        self.WATCH = self.WATCH - {name}
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if self.WATCH:
                sys.meta_path.insert(0, self)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(name, module)

        spec.loader.exec_module = exec_and_patch
        return spec


if OUT:
    sys.meta_path.insert(0, _Finder())

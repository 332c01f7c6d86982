"""Training recipes: one TOML file, optionally in phases run in order into one output folder.

A recipe is TrainConfig keys (config.py). A multi-phase recipe adds `[[phase]]` tables; every
phase is the base keys overridden by its own table, then by the command line (`--set`, flags):

    data = "answers.jsonl"          # base: every phase's defaults
    out = "runs/my-drafter"
    lr = 1.5e-4
    [[phase]]
    name = "grow"                   # required, unique: the phase's folder OUT/<name>
    steps = 800
    [[phase]]
    name = "distill"
    distill = 1.0
    keep_draft_vocab = true         # train over the previous phase's draft vocabulary

Phase k > 0 starts from phase k-1's exported drafter unless its table sets `init`. A phase whose
checkpoint reached its `steps` is done and skipped, so re-running the recipe resumes at the first
unfinished phase (and inside it at its last checkpoint, as train() does). The previous phase's
feature cache is hard-linked into the next phase's folder when both read the same target in the
same feature dtype (the features depend on nothing else). When the last phase ends its drafter is
copied to OUT/drafter. A recipe without `[[phase]]` is one phase trained in OUT itself.

Depends on config.py, features.py (sizing the feature cache), parallel.py and loop.py
(train()).
"""

from __future__ import annotations

import os
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

import torch

from domino_sglang.model.vocab import FILE as VOCAB_FILE
from domino_sglang.train.config import TrainConfig, TrainConfigError, config_from_dict
from domino_sglang.train.features import cache_bytes, feature_plan, free_bytes
from domino_sglang.train.loop import train
from domino_sglang.train.parallel import init_dist, resolve_device

PHASE_KEYS = ("name", "keep_draft_vocab")  # phase-only keys, beside any TrainConfig key


@dataclass
class Phase:
    name: str  # "" for a recipe without phases
    conf: TrainConfig  # conf.out is this phase's folder
    keep_draft_vocab: bool = False  # copy the previous phase's draft_vocab.json first
    init_from_previous: bool = False  # conf.init is the previous phase's drafter


def load_recipe(path: str | Path | None, overrides: dict | None = None,
                defaults: dict | None = None) -> tuple[list[Phase], Path | None]:
    """The recipe's phases in order and the root output folder (None without phases).
    `defaults` < base keys < phase table < `overrides`; every phase is validated up front, so a
    bad key in the last phase fails before the first one trains."""
    raw: dict = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise TrainConfigError(f"train: cannot read config {path}: {exc}") from exc
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    tables = raw.pop("phase", None)
    if tables is None:
        conf = config_from_dict({**(defaults or {}), **raw, **overrides})
        return [Phase("", conf)], None
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise TrainConfigError(f"train: {path}: 'phase' must be one or more [[phase]] tables")
    base = {**(defaults or {}), **raw}
    root_out = overrides.get("out", base.get("out", ""))
    if not root_out:
        raise TrainConfigError("train: 'out' is required")
    root = Path(str(root_out)).expanduser()
    phases: list[Phase] = []
    for i, table in enumerate(tables):
        table = dict(table)
        name = table.pop("name", None)
        if not isinstance(name, str) or not name or "/" in name or name in ("drafter", "."):
            raise TrainConfigError(f"train: {path}: phase {i + 1} needs a 'name' (a folder name), "
                                   f"got {name!r}")
        if any(p.name == name for p in phases):
            raise TrainConfigError(f"train: {path}: phase name {name!r} is used twice")
        keep_vocab = table.pop("keep_draft_vocab", False)
        if type(keep_vocab) is not bool:
            raise TrainConfigError(f"train: phase {name!r}: 'keep_draft_vocab' must be bool, "
                                   f"got {keep_vocab!r}")
        if keep_vocab and i == 0:
            raise TrainConfigError(f"train: phase {name!r}: 'keep_draft_vocab' needs a previous "
                                   "phase")
        if "out" in table:
            raise TrainConfigError(f"train: phase {name!r}: 'out' is the recipe's (phases train "
                                   "in OUT/<name>)")
        merged = {**base, **table, **overrides, "out": str(root / name)}
        from_previous = i > 0 and "init" not in table
        if from_previous:
            merged["init"] = str(root / phases[-1].name / "drafter")
        try:
            conf = config_from_dict(merged)
        except TrainConfigError as exc:
            raise TrainConfigError(f"{exc} (phase {name!r})") from exc
        phases.append(Phase(name, conf, keep_vocab, from_previous))
    return phases, root


def phase_step(phase: Phase) -> int:
    """The step this phase's checkpoint reached (0: not started)."""
    state = Path(phase.conf.out) / "checkpoint" / "state.pt"
    if not state.is_file():
        return 0
    return int(torch.load(state, weights_only=True, map_location="cpu")["step"])


def plan(phases: list[Phase], root: Path | None) -> str:
    """One line per phase: what it trains on, from what, and how far it got (`--plan`)."""
    lines = [f"recipe: {len(phases)} phase(s) into {root if root else phases[0].conf.out}"]
    for i, p in enumerate(phases):
        c = p.conf
        init = ("previous phase" if p.init_from_previous else c.init) or "fresh (target's layers)"
        data = c.data + (f" ids<={c.max_id}" if c.max_id >= 0 else "")
        data += f" skip {c.skip_ids}" if c.skip_ids else ""
        data += f" x{c.oversample[2]} ids {c.oversample[0]}..{c.oversample[1]}" \
            if c.oversample else ""
        extras = [f"{k}={getattr(c, k)}" for k in ("add_layers", "draft_vocab", "short_blocks",
                                                    "distill", "copy_gate") if getattr(c, k)]
        if p.keep_draft_vocab:
            extras.append("keep_draft_vocab")
        done = phase_step(p)
        status = "done" if done >= c.steps else (f"at step {done}" if done else "to run")
        lines.append(f"{i + 1:2d}. {p.name or '(single)'}: {c.steps} steps, lr {c.lr:g}, lambda "
                     f"decay {c.lambda_decay_frac:g}, seed {c.seed}; init {init}; data {data}"
                     f"{'; ' + ' '.join(extras) if extras else ''} [{status}]")
        lines.append("    " + _features_line(c))
    return "\n".join(lines)


def _features_line(conf: TrainConfig) -> str:
    """The phase's target features: records, tokens, steps' records, and the cache's size on
    disk against the free space (or online: nothing written)."""
    sized = feature_plan(conf)
    per_step = f"{conf.batch_size} records x {conf.anchors} blocks per step per process"
    if sized is None:
        return (f"features {conf.features}: {per_step}; sized when the run starts (data or "
                f"target not there yet, or conversations to tokenise)")
    head = f"{sized.records} records, {sized.tokens} tokens; {per_step}"
    if conf.features == "online":
        return f"features online: {head}; nothing written (a target forward per record per step)"
    cache = Path(conf.out) / "features"
    free = free_bytes(cache)
    have = cache_bytes(cache)
    return (f"features cache: {head}; cache {sized.bytes / 1e9:.3f} GB in {cache} "
            f"({have / 1e9:.3f} GB there), {free / 1e9:.1f} GB free"
            + ("" if sized.bytes - have <= free else " -- DOES NOT FIT: the run would refuse"))


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link src's files into dst (copies where links fail, e.g. across file systems)."""
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link, dirs_exist_ok=True)


def _prepare_phase(prev: Phase, phase: Phase) -> None:
    out = Path(phase.conf.out)
    out.mkdir(parents=True, exist_ok=True)
    if phase.keep_draft_vocab and not (out / VOCAB_FILE).exists():
        vocab = Path(prev.conf.out) / VOCAB_FILE
        if not vocab.is_file():
            raise TrainConfigError(f"train: phase {phase.name!r} keeps the draft vocabulary of "
                                   f"phase {prev.name!r}, which has none ({vocab})")
        shutil.copy2(vocab, out / VOCAB_FILE)
    src = Path(prev.conf.out) / "features"
    if (phase.conf.features == "cache" and src.is_dir() and not (out / "features").exists()
            and prev.conf.target == phase.conf.target
            and prev.conf.feature_dtype == phase.conf.feature_dtype):
        _link_tree(src, out / "features")


def run_recipe(phases: list[Phase], root: Path | None, progress: bool = True) -> Path:
    """Train the phases in order (skipping finished ones); returns the final drafter folder."""
    if root is None:
        return train(phases[0].conf, progress=progress)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    owns_group = world > 1 and not torch.distributed.is_initialized()
    if owns_group:  # one process group for every phase (train() leaves a caller's group open)
        init_dist(resolve_device(phases[0].conf.device))
    try:
        _run_phases(phases, rank, world, progress)
    finally:
        if owns_group:
            torch.distributed.destroy_process_group()
    last = Path(phases[-1].conf.out) / "drafter"
    if rank == 0:
        shutil.copytree(last, root / "drafter", dirs_exist_ok=True)
    return root / "drafter"


def _run_phases(phases: list[Phase], rank: int, world: int, progress: bool) -> None:
    for i, phase in enumerate(phases):
        if phase_step(phase) >= phase.conf.steps and (Path(phase.conf.out) / "drafter").is_dir():
            if rank == 0:
                print(f"train: phase {phase.name} done, skipped", flush=True)
            continue
        if rank == 0:
            if i > 0:
                _prepare_phase(phases[i - 1], phase)
            print(f"train: phase {i + 1}/{len(phases)} {phase.name}", flush=True)
        if world > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()
        train(phase.conf, progress=progress)

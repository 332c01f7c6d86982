"""`domino-sglang train`'s loop: `train()` runs (or resumes) one run and exports its drafter.

One step, per process: `batch_size` regenerated sequences; for each, the target's features of the
drafter's target layers (features.py) and `anchors` random block starts inside the response.
Every block [x_a, MASK x (B-1)] is drafted in one backbone pass that sees the context features of
positions < a (as in serving, where the verified token x_a is not yet in the draft cache) and the
whole block (non-causal); the loss is the base-anchored curriculum of curriculum.py (module.py).

Exact resume: the data order and anchors of step t are functions of (seed, t, rank) only
(records.py), and a checkpoint holds the drafter, the optimizer and the step, so stopping at t
and resuming gives the same parameters as an uninterrupted run. Under `torchrun` the same command
runs DDP or FSDP (parallel.py); every rank reads its own slice of each step's global batch.

Device (`device`: auto|cpu|cuda): the target and the drafter are placed on one device (CUDA when
present for auto; under torchrun rank r takes cuda:LOCAL_RANK), with bf16 autocast on CUDA
(`compute_dtype` auto). Data (`data`): a regenerated JSONL, or conversations (ShareGPT-style
JSON/JSONL, OpenAI chat JSONL) trained on as written: off-policy, and logged as such.

A run folder: init/ (the starting drafter, warm_start.py), checkpoint/ (drafter.pt, state.pt),
drafter/ (the export, every save_every steps), log.jsonl (report.py), features/ (the cache).
Depends on the other train modules and domino_sglang.model, never on the serving side.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from domino_sglang.model.config import DraftConfig, load_draft_config
from domino_sglang.model.drafter import DominoDrafter, save_drafter
from domino_sglang.model.vocab import FILE as VOCAB_FILE
from domino_sglang.model.vocab import (
    build_draft_vocab,
    load_draft_vocab,
    special_token_ids,
    write_draft_vocab,
)
from domino_sglang.train.config import TrainConfig, TrainConfigError
from domino_sglang.train.curriculum import lambda_at
from domino_sglang.train.evaluate import evaluate
from domino_sglang.train.features import TargetFeatures, cache_plan, check_cache_fits
from domino_sglang.train.module import DrafterTrainModule
from domino_sglang.train.parallel import (
    dist_backend,
    full_optim_state,
    full_state,
    init_dist,
    resolve_device,
)
from domino_sglang.train.records import (
    epoch_pool,
    load_extra_records,
    load_records,
    prepare_data,
    sample_block_anchors,
    sample_draft_lengths,
    step_records,
)
from domino_sglang.train.report import RunReport
from domino_sglang.train.warm_start import drafter_config, write_start_drafter


def train(conf: TrainConfig, progress: bool = True, stop_at: int | None = None,
          on_step=None) -> Path:
    """Run (or resume) training; returns the exported drafter folder out/drafter.

    stop_at ends this run early after that step (as an interruption would, after its checkpoint);
    on_step(step, drafter) is called after every optimizer step (tests, probes).
    """
    from domino_sglang.paths import target_dir

    if conf.threads:
        torch.set_num_threads(conf.threads)
    owns_group = not torch.distributed.is_initialized()  # else the caller's to end
    at = _place(conf)
    out = Path(conf.out)
    target = Path(conf.target) if conf.target else target_dir()
    if not (target / "config.json").is_file():
        raise TrainConfigError(f"train: target {target} has no config.json "
                               "(run domino-sglang prepare-target)")
    dcfg = drafter_config(conf, target)
    out.mkdir(parents=True, exist_ok=True)
    data = _load_data(conf, target, out, at)
    m = _build_model(conf, target, out, dcfg, data, at)
    report = RunReport(out, conf, at.rank, m.step, progress)
    if m.step == 0:  # what this run trains on, where
        report.run({"data": str(data.path),
                    "data_policy": "off-policy" if data.off_policy else "on-policy",
                    "device": str(at.device), "world": at.world,
                    "backend": dist_backend(at.device) if at.world > 1 else None,
                    "bf16": at.bf16})
    if data.off_policy and at.rank == 0:
        print(f"train: {conf.data} is used as written (off-policy: the answers are not the "
              f"target's own; regenerate them for on-policy data)", flush=True)
    if data.held and m.step == 0:  # the starting point (an --init drafter's score)
        report.eval({"step": 0, "eval": _held_out_eval(m, data.held, conf, at)}, live=False)
    while m.step < conf.steps:
        lam = lambda_at(m.step, conf.steps, conf.lambda_decay_frac)
        for group in m.opt.param_groups:
            group["lr"] = lr_at(m.step, conf) * group["lr_scale"]
        items, soft = _batch(conf, data, m.feats, m.step, at)
        loss, st, gnorm = _update(m, conf, at, items, soft, lam)  # m.step += 1
        report.step(m.step, st, loss, gnorm, lam, lr_at(m.step - 1, conf))
        if data.held and _due(m.step, conf.eval_every, conf) and (at.rank == 0 or at.fsdp):
            report.eval({"step": m.step, "eval": _held_out_eval(m, data.held, conf, at)})
        if _due(m.step, conf.save_every, conf):
            _save(m, out, conf, at)
        if on_step is not None:
            on_step(m.step, m.drafter)
        if stop_at is not None and m.step >= stop_at:
            break
    report.close()
    if at.world > 1:
        torch.distributed.barrier()
        if owns_group:  # a group left open can abort its process at exit (gloo, seen in CI)
            torch.distributed.destroy_process_group()
    return out / "drafter"


def lr_at(step: int, conf: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_frac * lr."""
    warm = int(conf.warmup_frac * conf.steps)
    if step < warm:
        return conf.lr * (step + 1) / warm
    t = (step - warm) / max(1, conf.steps - warm)
    return conf.lr * (conf.min_lr_frac + (1 - conf.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def _due(step: int, every: int, conf: TrainConfig) -> bool:
    """Whether a periodic action (log, eval, save) runs after `step`: every `every` steps and
    after the last."""
    return step % every == 0 or step == conf.steps


# ---- setting a run up ----
@dataclass(frozen=True)
class _Placement:
    """Where this process trains."""

    device: torch.device
    rank: int
    world: int
    fsdp: bool  # strategy fsdp over several processes (one process: nothing to shard over)
    bf16: bool  # the forward autocast to bfloat16


def _place(conf: TrainConfig) -> _Placement:
    device = resolve_device(conf.device)
    rank, world = init_dist(device)
    bf16 = conf.compute_dtype == "bfloat16" or (conf.compute_dtype == "auto"
                                                and device.type == "cuda")
    return _Placement(device, rank, world, fsdp=conf.strategy == "fsdp" and world > 1,
                      bf16=bf16)


@dataclass
class _Data:
    """The run's records."""

    path: Path  # the records file (conversations: tokenised into the run folder)
    off_policy: bool  # answers used as written, not the target's own
    train: list[dict]  # trained on, extra_data included
    held: list[dict]  # the last eval_records records, held out for the evaluation
    pool: list[int]  # one epoch's indices into `train` (epoch_pool: oversample)
    top: int  # the highest id trained on before extra_data: the draft vocabulary's voters


def _load_data(conf: TrainConfig, target: Path, out: Path, at: _Placement) -> _Data:
    path, off_policy = prepare_data(Path(conf.data), target, out, conf.max_seq_len, at.rank,
                                    at.world, conf.chat_template)
    records = load_records(path, conf.max_seq_len, conf.max_id, conf.skip_ids)
    held = records[-conf.eval_records:] if 0 < conf.eval_records < len(records) else []
    train_recs = records[: len(records) - len(held)]
    top = max(r["id"] for r in train_recs)
    train_recs += load_extra_records(conf.extra_data, conf.max_seq_len, conf.distill,
                                     {r["id"] for r in records})
    return _Data(path, off_policy, train_recs, held, epoch_pool(train_recs, conf.oversample),
                 top)


@dataclass
class _Model:
    """The drafter under training and what drives it."""

    dcfg: dict  # the exported drafter's config.json
    drafter: DominoDrafter
    feats: TargetFeatures
    module: DrafterTrainModule  # fsdp: sharded in place over the processes
    forward: nn.Module  # `module`, or its DDP wrapper
    opt: torch.optim.Optimizer
    step: int  # optimizer steps taken (a resumed run: the checkpoint's)
    replica: DrafterTrainModule | None  # fsdp: rank 0's whole copy, for the held-out evaluation
    export: dict | None  # files exported beside the drafter (its draft vocabulary)


def _build_model(conf: TrainConfig, target: Path, out: Path, dcfg: dict, data: _Data,
                 at: _Placement) -> _Model:
    """The drafter (resumed from out/checkpoint when there is one), the target's features and
    the optimizer, placed and wrapped for DDP or sharded for FSDP."""
    dconf = _start_config(conf, target, out, dcfg, data, at)
    if conf.features == "cache" and at.rank == 0:
        check_cache_fits(cache_plan(data.train + data.held, dconf.num_context_features,
                                    dconf.hidden_size, getattr(torch, conf.feature_dtype),
                                    conf.distill_topk if conf.distill else 0),
                         out / "features")
    drafter = DominoDrafter.from_pretrained(dconf, dtype=torch.float32, device=at.device).train()
    feats = TargetFeatures(target, list(dconf.target_layer_ids), getattr(torch, conf.feature_dtype),
                           out / "features" if conf.features == "cache" else None,
                           conf.distill_topk if conf.distill else 0, at.device, shard=at.fsdp)
    if at.fsdp:  # the sharded target's forwards are collective: all of them before the loop
        feats.precompute(data.train + data.held, at.rank, at.world)
    vocab = (load_draft_vocab(out, dconf.vocab_size) if conf.draft_vocab
             else None)  # [Vd] token ids
    export = {VOCAB_FILE: (out / VOCAB_FILE).read_text()} if vocab is not None else None
    if vocab is not None:
        vocab = vocab.to(at.device)
    module = DrafterTrainModule(drafter, feats.embed_weight, feats.lm_head_weight, vocab)
    step, state = _resume(out / "checkpoint", drafter, at)
    replica = _shard(module, dconf, feats, at) if at.fsdp else None
    opt = _optimizer(conf, drafter, module, state, at.fsdp)
    forward = module
    if at.world > 1 and not at.fsdp:
        forward = nn.parallel.DistributedDataParallel(
            module, device_ids=[at.device.index] if at.device.type == "cuda" else None,
            find_unused_parameters=True)
    return _Model(dcfg, drafter, feats, module, forward, opt, step, replica, export)


def _start_config(conf: TrainConfig, target: Path, out: Path, dcfg: dict, data: _Data,
                  at: _Placement) -> DraftConfig:
    """The config of the drafter the run starts from, out/init, which rank 0 writes once with
    the draft vocabulary (both fixed for resumes)."""
    if at.rank == 0 and not (out / "init" / "config.json").exists():
        write_start_drafter(out, conf, target, dcfg)
    if at.rank == 0 and conf.draft_vocab and not (out / VOCAB_FILE).exists():
        ids = build_draft_vocab(data.path, conf.draft_vocab, data.top, conf.skip_ids,
                                always=special_token_ids(target))
        write_draft_vocab(out, ids, source=Path(data.path).name, max_id=data.top)
    if at.world > 1:
        torch.distributed.barrier()
    return load_draft_config(out / "init")


def _resume(ckpt: Path, drafter: DominoDrafter, at: _Placement) -> tuple[int, dict | None]:
    """(step, training state) of the checkpoint in `ckpt`, its weights loaded into `drafter`;
    (0, None) when there is none."""
    if not (ckpt / "state.pt").exists():
        return 0, None
    state = torch.load(ckpt / "state.pt", weights_only=True, map_location=at.device)
    if state.get("strategy", "ddp") != ("fsdp" if at.fsdp else "ddp"):
        raise TrainConfigError(f"train: the checkpoint in {ckpt} was written by strategy "
                               f"{state.get('strategy', 'ddp')} (fsdp: under torchrun); "
                               "resume it with that strategy")
    drafter.load_state_dict(torch.load(ckpt / "drafter.pt", weights_only=True,
                                       map_location=at.device))
    return int(state["step"]), state


def _shard(module: DrafterTrainModule, dconf: DraftConfig, feats: TargetFeatures,
           at: _Placement) -> DrafterTrainModule | None:
    """Shard `module` in place over the processes (FSDP2); returns rank 0's whole replica of
    the drafter for the held-out evaluation (None on the other ranks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    replica = None
    if at.rank == 0:
        replica = DrafterTrainModule(
            DominoDrafter.from_pretrained(dconf, dtype=torch.float32, device=at.device).eval(),
            feats.embed_weight, feats.lm_head_weight, module.draft_vocab)
    # one FSDP unit: the forward (module.forward) gathers the drafter whole and the backward
    # reduce-scatters its gradients (averaged over ranks, as DDP), so each rank keeps 1/world
    # of the parameters, gradients and AdamW state between steps
    fully_shard(module, mesh=init_device_mesh(at.device.type, (at.world,)))
    return replica


def _optimizer(conf: TrainConfig, drafter: DominoDrafter, module: DrafterTrainModule,
               state: dict | None, fsdp: bool) -> torch.optim.Optimizer:
    """AdamW over the drafter, a copy gate in a group of its own (lr x copy_gate_lr_scale, no
    weight decay); a resumed run's state loaded."""
    gate = list(drafter.copy_gate.parameters()) if drafter.copy_gate is not None else []
    rest = [p for p in drafter.parameters() if all(p is not g for g in gate)]
    groups = [{"params": rest, "lr_scale": 1.0}]
    if gate:  # a new gate starts far from its optimum (Adam moves a weight ~lr per step)
        groups.append({"params": gate, "lr_scale": conf.copy_gate_lr_scale, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=conf.lr, weight_decay=conf.weight_decay,
                            betas=(0.9, 0.95))
    if state is not None and fsdp:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(module, opt, state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
    elif state is not None:
        opt.load_state_dict(state["optimizer"])
    return opt


# ---- one step ----
def _batch(conf: TrainConfig, data: _Data, feats: TargetFeatures, step: int, at: _Placement
           ) -> tuple[list[tuple], list[tuple] | None]:
    """This rank's items of `step` (ids, features, anchors, first-draft-only anchors[, draft
    lengths]) and with distillation the target's top-k of each: functions of (seed, step,
    rank) only."""
    items, soft = [], [] if conf.distill else None
    recs = [data.train[data.pool[idx]] for idx in step_records(
        len(data.pool), step, conf.batch_size, at.rank, at.world, conf.seed)]
    step_feats = feats.many(recs)  # the step's missing features in batched forwards
    for rec, rec_feats in zip(recs, step_feats):
        g = torch.Generator().manual_seed(conf.seed * 1_000_003 + step * 7919 + rec["id"])
        anchors, first = sample_block_anchors(rec["start"], len(rec["ids"]), conf.anchors,
                                              conf.first_anchors, g)
        item = (torch.tensor(rec["ids"], device=at.device), rec_feats, anchors, first)
        if conf.short_blocks > 0:  # drawn after the anchors: other runs' streams unchanged
            item += (sample_draft_lengths(len(anchors) + len(first), conf.block_size,
                                          conf.short_blocks, g),)
        items.append(item)
        if soft is not None:
            soft.append(feats.soft(rec))
    return items, soft


def _update(m: _Model, conf: TrainConfig, at: _Placement, items: list[tuple],
            soft: list[tuple] | None, lam: float) -> tuple[float, dict, float]:
    """One optimizer step on `items` (m.step advances); returns (loss, stats, grad norm)."""
    with torch.autocast(at.device.type, dtype=torch.bfloat16, enabled=at.bf16):
        loss, st = m.forward(items, lam, conf.gamma, soft, conf.distill,
                             conf.distill_temperature)
    m.opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(m.drafter.parameters(), conf.grad_clip)
    if hasattr(gnorm, "full_tensor"):  # fsdp: a DTensor over the ranks' shards
        gnorm = gnorm.full_tensor()
    m.opt.step()
    m.step += 1
    return float(loss.detach()), st, float(gnorm)


def _held_out_eval(m: _Model, held: list[dict], conf: TrainConfig, at: _Placement
                   ) -> dict | None:
    """The evaluation on rank 0 (None elsewhere); under fsdp every rank must call it."""
    if not at.fsdp:
        return evaluate(m.module, m.feats, held, conf) if at.rank == 0 else None
    full = full_state(m.module)
    if at.rank != 0:
        return None
    m.replica.drafter.load_state_dict(full)
    return evaluate(m.replica, m.feats, held, conf)


# ---- checkpoints ----
def _save(m: _Model, out: Path, conf: TrainConfig, at: _Placement) -> None:
    """The checkpoint and the exported drafter after step m.step (fsdp: gathered by every rank,
    written by rank 0)."""
    full = opt_full = None
    if at.fsdp:
        full, opt_full = full_state(m.module), full_optim_state(m.module, m.opt)
    if at.rank == 0:
        _save_checkpoint(out, m.drafter, m.opt, m.step, conf, full, opt_full)
        weights = full if at.fsdp else {k: v.cpu() for k, v in m.drafter.state_dict().items()}
        save_drafter(out / "drafter", m.dcfg, weights, dtype=torch.bfloat16,
                     extra_files=m.export)


def _save_checkpoint(out: Path, model: DominoDrafter, opt: torch.optim.Optimizer, step: int,
                     conf: TrainConfig, model_state: dict | None = None,
                     opt_state: dict | None = None) -> None:
    """out/checkpoint/{drafter.pt,state.pt} replaced atomically (temp folder, then rename)."""
    import shutil

    tmp = out / f".checkpoint.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(model.state_dict() if model_state is None else model_state, tmp / "drafter.pt")
    torch.save({"optimizer": opt.state_dict() if opt_state is None else opt_state, "step": step,
                "config": asdict(conf), "strategy": "ddp" if opt_state is None else "fsdp"},
               tmp / "state.pt")
    final = out / "checkpoint"
    old = out / f".checkpoint.old-{os.getpid()}"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)

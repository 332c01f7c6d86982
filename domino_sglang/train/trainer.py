"""`domino-sglang train`: the loop (config, data order, features, DDP, checkpoints, exact resume).

One step, per process: `batch_size` regenerated sequences; for each, the target's features of the
drafter's target layers (transformers, in the serving dtype; `features`: cached on disk per
record as safetensors, or computed in the step and never written: `cache_plan` sizes the cache
before a run, which refuses to start when the disk cannot hold it), and
`anchors` random block starts inside the response. Every block [x_a, MASK x (B-1)] is drafted in
one backbone pass that sees the context features of positions < a (as in serving, where the
verified token x_a is not yet in the draft cache) and the whole block (non-causal); the loss is
the base-anchored curriculum of curriculum.py.

Exact resume: the data order and anchors of step t are functions of (seed, t, rank) only, and a
checkpoint holds the drafter, the optimizer and the step, so stopping at t and resuming gives the
same parameters as an uninterrupted run. Under `torchrun` the same command runs DDP (NCCL when the
tensors are on CUDA, gloo when they are on the CPU, whatever the host has); every rank reads its
own slice of each step's global batch.

Device (`device`: auto|cpu|cuda): the target and the drafter are placed on one device (CUDA when
present for auto; under torchrun rank r takes cuda:LOCAL_RANK), with bf16 autocast on CUDA
(`compute_dtype` auto). Data (`data`): a regenerated JSONL, or conversations (ShareGPT-style
JSON/JSONL, OpenAI chat JSONL) trained on as written: off-policy, and logged as such.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from domino_sglang.config import load_draft_config, make_draft_config
from domino_sglang.model import DominoDrafter, init_drafter_weights, save_drafter
from domino_sglang.pointer import CopyIndex, PointerCopy, copy_table, gate_inputs
from domino_sglang.train.curriculum import IGNORE, accuracies, block_loss, lambda_at, tau_sim
from domino_sglang.vocab import FILE as VOCAB_FILE
from domino_sglang.vocab import (
    build_draft_vocab,
    load_draft_vocab,
    special_token_ids,
    write_draft_vocab,
)


class TrainConfigError(ValueError):
    """A bad training config; the message names the key."""


@dataclass
class TrainConfig:
    data: str = ""  # regenerated JSONL (domino-sglang regenerate), or conversations (ShareGPT
    #                 JSON/JSONL, OpenAI chat JSONL) used as written: off-policy (conversations.py)
    extra_data: list = field(default_factory=list)  # more record JSONLs, trained on whole (no
    #                   max_id / skip_ids, never held out): e.g. ShareGPT's own answers
    #                   (`regenerate --source sharegpt-answers`), which need distill = 1
    out: str = ""  # run folder: checkpoint/, drafter/, log.jsonl
    target: str = ""  # target checkpoint folder (default: the prepared SmolLM2)
    init: str = ""  # start from this drafter folder (default: a fresh one from the fields below)
    num_layers: int = 2
    add_layers: int = 0  # with init: grow it by this many layers, inserted below its own and
    #                      starting as the identity (see grow_drafter), so training resumes
    #                      from the init drafter's exact function with more capacity
    grow_gru: int = 0  # with init: widen the head's GRU by this many units and its low-rank
    grow_emb: int = 0  # correction by this many ranks, starting as init's head (grow_head)
    block_size: int = 16
    num_features: int = 3
    gru_hidden_dim: int = 256
    emb_dim: int = 64
    steps: int = 1000
    batch_size: int = 2  # sequences per step per process
    anchors: int = 16  # blocks per sequence
    first_anchors: int = 0  # more blocks per sequence trained on their first draft only (the
    #                         backbone's position 0, which the head never corrects and which
    #                         bounds tau): a full backbone pass, one lm_head row each
    max_seq_len: int = 768  # tokens of a record kept (prompt + answer; --max-length)
    chat_template: str = ""  # conversations data: a Jinja chat template file to tokenise them
    #                          with (default: the target's own), as the server will format
    max_id: int = -1  # use only records with id <= max_id (-1: all): a stage's data stays fixed
    #                   while the regenerated file grows (ids are ShareGPT positions)
    skip_ids: list = field(default_factory=list)  # [first, last]: also leave out the ids in
    #                   first..last, a gap the regeneration filled after this stage ran
    oversample: list = field(default_factory=list)  # [first, last, factor]: the records with
    #                   ids in first..last appear `factor` times per epoch (a small new domain
    #                   among many answers, e.g. the stdlib code prompts at ids >= 1000000)
    lr: float = 6e-4
    min_lr_frac: float = 0.1
    warmup_frac: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lambda_decay_frac: float = 0.5  # lambda 1 -> 0 over this fraction of the steps
    gamma: float = 7.0  # position weights exp(-k / gamma)
    feature_dtype: str = "bfloat16"  # the serving precision of the target
    features: str = "cache"  # cache: the target's features written once per record under
    #                          out/features (safetensors) and read back every epoch; online:
    #                          computed in each step, nothing written (no disk, a target forward
    #                          per record per step)
    compute_dtype: str = "auto"  # "bfloat16": autocast the forward (fp32 master weights);
    #                              auto: bfloat16 on CUDA, float32 on the CPU
    device: str = "auto"  # auto (CUDA when present) | cpu | cuda
    report_to: str = ""  # "tensorboard": also log scalars to out/tensorboard (optional dependency)
    eval_records: int = 8  # the last N records are held out for evaluation
    eval_every: int = 100
    log_every: int = 10
    save_every: int = 50
    threads: int = 0  # torch threads per process, 0 = leave torch's default
    seed: int = 0
    warm_start: bool = True  # fresh drafter: copy the target's last layers and final norm
    short_blocks: float = 0.0  # this fraction of the blocks is drafted at a random length
    #                            2..B-1 (the mask positions after it absent, as a short
    #                            round's draft pass would run it) instead of the full B
    draft_vocab: int = 0  # > 0: train over a draft vocabulary of this many tokens (vocab.py),
    #                       the most frequent answer tokens of the training records, as served:
    #                       6x fewer logit rows at 8,192; exported with the drafter. 0: all V
    distill: float = 0.0  # beta in [0, 1]: weight of the soft CE against the target's top-k
    #                       distribution in every CE (curriculum.py); 0 = the greedy labels only
    distill_topk: int = 64  # target logits kept per position (cached beside the features)
    distill_temperature: float = 1.0  # tau of the target's soft distribution
    copy_gate: bool = False  # a pointer-generator drafter (pointer.py): every CE scores the
    #                          mixture of its draft distribution and the history's copy
    #                          candidate; an init drafter without a gate gets one (g ~ 0.12)
    copy_gate_lr_scale: float = 20.0  # the gate's learning rate is lr times this
    strategy: str = "ddp"  # under torchrun: ddp (a replica per process) | fsdp (FSDP2: the
    #                        target and the drafter sharded over the processes)

    def validate(self) -> TrainConfig:
        for key in ("data", "out"):
            if not getattr(self, key):
                raise TrainConfigError(f"train: '{key}' is required")
        positive = ("num_layers", "block_size", "num_features", "gru_hidden_dim", "emb_dim",
                    "steps", "batch_size", "anchors", "max_seq_len", "lr", "gamma",
                    "log_every", "save_every", "eval_every")
        for key in positive:
            if getattr(self, key) <= 0:
                raise TrainConfigError(f"train: '{key}' must be positive, got {getattr(self, key)}")
        for key in ("warmup_frac", "lambda_decay_frac", "min_lr_frac", "short_blocks"):
            if not 0 <= getattr(self, key) <= 1:
                raise TrainConfigError(
                    f"train: '{key}' must be in [0, 1], got {getattr(self, key)}")
        if not 2 <= self.block_size <= 64:
            raise TrainConfigError(f"train: 'block_size' must be in 2..64, got {self.block_size}")
        for key, fresh in (("add_layers", "num_layers"), ("grow_gru", "gru_hidden_dim"),
                           ("grow_emb", "emb_dim")):
            if getattr(self, key) < 0:
                raise TrainConfigError(f"train: '{key}' must be >= 0, got {getattr(self, key)}")
            if getattr(self, key) and not self.init:
                raise TrainConfigError(f"train: '{key}' grows an 'init' drafter; set 'init' "
                                       f"(a fresh drafter takes '{fresh}')")
        if self.first_anchors < 0:
            raise TrainConfigError(f"train: 'first_anchors' must be >= 0, got {self.first_anchors}")
        if self.compute_dtype not in ("auto", "bfloat16", "float32"):
            raise TrainConfigError(f"train: 'compute_dtype' must be auto, bfloat16 or float32, "
                                   f"got {self.compute_dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise TrainConfigError(f"train: 'device' must be auto, cpu or cuda, "
                                   f"got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise TrainConfigError("train: 'device' is cuda but torch sees no CUDA device")
        if self.strategy not in ("ddp", "fsdp"):
            raise TrainConfigError(f"train: 'strategy' must be ddp or fsdp, got {self.strategy!r}")
        if self.strategy == "fsdp":
            try:
                from torch.distributed.fsdp import fully_shard  # noqa: F401
            except ImportError as exc:
                raise TrainConfigError(f"train: 'strategy' fsdp needs torch >= 2.6 (FSDP2 "
                                       f"fully_shard); this is torch {torch.__version__}") from exc
        if self.features not in ("cache", "online"):
            raise TrainConfigError(f"train: 'features' must be cache or online, "
                                   f"got {self.features!r}")
        if self.strategy == "fsdp" and self.features != "cache":
            raise TrainConfigError("train: 'strategy' fsdp needs features = cache (the sharded "
                                   "target's features are computed before the first step)")
        if self.report_to not in ("", "tensorboard"):
            raise TrainConfigError(f"train: 'report_to' must be '' or tensorboard, "
                                   f"got {self.report_to!r}")
        if self.feature_dtype not in ("bfloat16", "float16", "float32"):
            raise TrainConfigError(f"train: 'feature_dtype' must be bfloat16, float16 or float32, "
                                   f"got {self.feature_dtype!r}")
        if self.max_id < -1:
            raise TrainConfigError(f"train: 'max_id' must be -1 (all) or a record id, "
                                   f"got {self.max_id}")
        if self.oversample and not (len(self.oversample) == 3
                                    and all(type(i) is int for i in self.oversample)
                                    and 0 <= self.oversample[0] <= self.oversample[1]
                                    and self.oversample[2] >= 1):
            raise TrainConfigError(f"train: 'oversample' must be [] or [first, last, factor] "
                                   f"with 0 <= first <= last and factor >= 1, "
                                   f"got {self.oversample}")
        if self.skip_ids and not (len(self.skip_ids) == 2
                                  and all(type(i) is int for i in self.skip_ids)
                                  and 0 <= self.skip_ids[0] <= self.skip_ids[1]):
            raise TrainConfigError(f"train: 'skip_ids' must be [] or [first, last] with "
                                   f"0 <= first <= last, got {self.skip_ids}")
        if not all(isinstance(p, str) and p for p in self.extra_data):
            raise TrainConfigError(f"train: 'extra_data' must be a list of file paths, "
                                   f"got {self.extra_data}")
        if self.draft_vocab < 0:
            raise TrainConfigError(f"train: 'draft_vocab' must be >= 0 (0: the full vocabulary), "
                                   f"got {self.draft_vocab}")
        if self.max_seq_len <= self.block_size:
            raise TrainConfigError("train: 'max_seq_len' must exceed 'block_size'")
        if not 0 <= self.distill <= 1:
            raise TrainConfigError(f"train: 'distill' must be in [0, 1], got {self.distill}")
        if self.distill_topk < 1:
            raise TrainConfigError(f"train: 'distill_topk' must be >= 1, got {self.distill_topk}")
        if not self.copy_gate_lr_scale > 0:
            raise TrainConfigError(f"train: 'copy_gate_lr_scale' must be positive, "
                                   f"got {self.copy_gate_lr_scale}")
        if not self.distill_temperature > 0:
            raise TrainConfigError(f"train: 'distill_temperature' must be positive, "
                                   f"got {self.distill_temperature}")
        return self


def load_train_config(path: str | Path | None, overrides: dict | None = None,
                      defaults: dict | None = None) -> TrainConfig:
    """`defaults` (e.g. target_defaults) < TOML file (optional) < overrides; unknown keys and
    wrong types are errors."""
    raw: dict = dict(defaults or {})
    if path is not None:
        try:
            raw.update(tomllib.loads(Path(path).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise TrainConfigError(f"train: cannot read config {path}: {exc}") from exc
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if "phase" in raw:
        raise TrainConfigError(f"train: {path} has [[phase]] tables: load it with "
                               "train.recipe.load_recipe")
    return config_from_dict(raw)


def config_from_dict(raw: dict) -> TrainConfig:
    """A validated TrainConfig from raw keys; unknown keys and wrong types are errors."""
    raw = dict(raw)
    known = {f.name: f for f in fields(TrainConfig)}
    for key, value in raw.items():
        if key not in known:
            raise TrainConfigError(f"train: unknown key '{key}' (known: {', '.join(known)})")
        kind = type(getattr(TrainConfig(), key))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            raw[key] = value = float(value)
        if type(value) is not kind:
            raise TrainConfigError(f"train: '{key}' must be {kind.__name__}, got {value!r}")
    for key in ("data", "out", "target", "init"):
        if isinstance(raw.get(key), str) and raw[key]:
            raw[key] = str(Path(raw[key]).expanduser())
    if isinstance(raw.get("extra_data"), list):
        raw["extra_data"] = [str(Path(p).expanduser()) if isinstance(p, str) and p else p
                             for p in raw["extra_data"]]
    return TrainConfig(**raw).validate()


# ---- data ----
def load_records(path: str | Path, max_seq_len: int, max_id: int = -1,
                 skip_ids: list[int] | None = None) -> list[dict]:
    """Regenerated records as {"id", "ids" (prompt+response, truncated), "start" (response)},
    by id, only those with id <= max_id unless max_id is -1, and none in skip_ids [first, last]."""
    from domino_sglang.train.regenerate import read_records

    out = []
    for rec in read_records(Path(path)):
        ids = (list(rec["prompt_ids"]) + list(rec["output_ids"]))[:max_seq_len]
        start = len(rec["prompt_ids"])
        if max_id >= 0 and int(rec["id"]) > max_id:
            continue
        if skip_ids and skip_ids[0] <= int(rec["id"]) <= skip_ids[1]:
            continue
        if len(ids) - start >= 2:  # at least one anchor with one label
            out.append({"id": int(rec["id"]), "ids": ids, "start": start})
    out.sort(key=lambda r: r["id"])
    if not out:
        raise TrainConfigError(f"train: {path} has no usable records")
    return out


def load_extra_records(paths: list[str], max_seq_len: int, distill: float,
                       taken: set[int]) -> list[dict]:
    """The records of `extra_data` (as load_records, all of them); ids must be new to `taken`.
    The dataset's own answers (ids from SOURCE_ID_BASE["sharegpt-answers"]) are not the
    target's, so their greedy labels would be wrong: they need distill = 1."""
    from domino_sglang.train.regenerate import SOURCE_ID_BASE

    out: list[dict] = []
    for path in paths:
        if not Path(path).is_file():
            raise TrainConfigError(f"train: extra_data {path} not found")
        recs = load_records(path, max_seq_len)
        clash = next((r["id"] for r in recs if r["id"] in taken), None)
        if clash is not None:
            raise TrainConfigError(f"train: extra_data {path}: record id {clash} is already in "
                                   f"the training data")
        if distill < 1 and any(r["id"] >= SOURCE_ID_BASE["sharegpt-answers"] for r in recs):
            raise TrainConfigError(f"train: extra_data {path} holds the dataset's own answers "
                                   f"(ids >= {SOURCE_ID_BASE['sharegpt-answers']}), which need "
                                   f"'distill' = 1, got {distill}")
        taken |= {r["id"] for r in recs}
        out += recs
    return out


def epoch_pool(records: list[dict], oversample: list[int]) -> list[int]:
    """The record indices one epoch covers: each once, and those with ids in first..last of
    `oversample` = [first, last, factor] `factor` times ([]: range(len(records)))."""
    if not oversample:
        return list(range(len(records)))
    first, last, factor = oversample
    return [i for i, r in enumerate(records)
            for _ in range(factor if first <= r["id"] <= last else 1)]


def step_records(n_records: int, step: int, batch: int, rank: int, world: int, seed: int
                 ) -> list[int]:
    """Indices of this rank's records at `step`: epoch-wise permutations, a pure function."""
    per_step = batch * world
    first = step * per_step + rank * batch
    out = []
    for g in range(first, first + batch):
        epoch, offset = divmod(g, n_records)
        perm = torch.randperm(n_records, generator=torch.Generator().manual_seed(seed + epoch))
        out.append(int(perm[offset]))
    return out


def sample_anchors(start: int, length: int, count: int, generator: torch.Generator
                   ) -> list[int]:
    """`count` distinct anchors a in [start, length-2] (fewer if the response is short)."""
    choices = length - 1 - start
    pick = torch.randperm(choices, generator=generator)[: min(count, choices)]
    return sorted(int(start + i) for i in pick)


def sample_block_anchors(start: int, length: int, full: int, first: int,
                         generator: torch.Generator) -> tuple[list[int], list[int]]:
    """(full-block anchors, first-draft-only anchors): distinct, `full` of them chosen first so
    a short response keeps its full blocks; with first = 0 exactly `sample_anchors`."""
    choices = length - 1 - start
    pick = torch.randperm(choices, generator=generator)[: min(full + first, choices)]
    pick = [int(start + i) for i in pick]
    return sorted(pick[:full]), sorted(pick[full:])


def sample_draft_lengths(n: int, block_size: int, short_frac: float,
                         generator: torch.Generator) -> torch.Tensor:
    """[n] draft lengths: block_size, or with probability short_frac uniform in 2..B-1."""
    short = torch.rand(n, generator=generator) < short_frac
    lengths = torch.randint(2, block_size, (n,), generator=generator)
    return torch.where(short, lengths, torch.full_like(lengths, block_size))


# Padded tokens per batched target forward (TargetFeatures.many), by device: an accelerator
# runs one short record far below its throughput, so records are batched (16 of 512 tokens);
# a CPU's forward is already compute-bound at one record, and larger batches only spill its
# caches (benchmarks/results/train_throughput.md), so it batches short records only.
BATCH_TOKENS = {"cpu": 1024}
BATCH_TOKENS_DEFAULT = 8192
CACHE_SUFFIX = ".safetensors"
# a safetensors file's 8-byte length and JSON header (one or two tensors: under 200 bytes)
FILE_OVERHEAD = 200


@dataclass(frozen=True)
class CachePlan:
    """What a run's feature cache holds: records, their tokens, and the bytes of the feature
    and top-k files (at most FILE_OVERHEAD more per file than the tensors' bytes)."""

    records: int
    tokens: int
    files: int
    tensor_bytes: int

    @property
    def bytes(self) -> int:
        return self.tensor_bytes + self.files * FILE_OVERHEAD


def cache_plan(records: list[dict], num_features: int, hidden: int, dtype: torch.dtype,
               topk: int = 0) -> CachePlan:
    """The feature cache of `records` (each {"ids"}): per token num_features x hidden values in
    `dtype`, and with distillation (topk > 0) k int32 ids and k logits in `dtype`."""
    tokens = sum(len(r["ids"]) for r in records)
    per_token = num_features * hidden * dtype.itemsize
    if topk:
        per_token += topk * (torch.int32.itemsize + dtype.itemsize)
    return CachePlan(records=len(records), tokens=tokens,
                     files=len(records) * (2 if topk else 1), tensor_bytes=tokens * per_token)


def cache_bytes(cache_dir: Path) -> int:
    """The bytes already in a feature cache folder (0 if there is none)."""
    if not cache_dir.is_dir():
        return 0
    return sum(p.stat().st_size for p in cache_dir.glob(f"*{CACHE_SUFFIX}"))


def feature_plan(conf: TrainConfig) -> CachePlan | None:
    """The feature cache `train` would write for `conf` (its records, extra data included), or
    None when it cannot be sized before the run: the data, the target or the init drafter is
    not there yet, or the data is conversations (tokenised with the chat template when the run
    starts)."""
    from domino_sglang.paths import target_dir
    from domino_sglang.train.conversations import is_records_file

    target = Path(conf.target) if conf.target else target_dir()
    data = Path(conf.data)
    if not data.is_file() or not (target / "config.json").is_file() or not is_records_file(data):
        return None
    records = load_records(data, conf.max_seq_len, conf.max_id, conf.skip_ids)
    records += load_extra_records(conf.extra_data, conf.max_seq_len, conf.distill,
                                  {r["id"] for r in records})
    if conf.init and not (Path(conf.init) / "config.json").is_file():
        return None  # the previous phase's drafter, not trained yet
    width = len(_drafter_config(conf, target)["dflash_config"]["target_layer_ids"])
    hidden = json.loads((target / "config.json").read_text())["hidden_size"]
    return cache_plan(records, width, hidden, getattr(torch, conf.feature_dtype),
                      conf.distill_topk if conf.distill else 0)


def free_bytes(path: Path) -> int:
    """The free disk space where `path` is (or will be: its nearest existing parent)."""
    import shutil

    return shutil.disk_usage(next(p for p in (path, *path.parents) if p.exists())).free


def check_cache_fits(plan: CachePlan, cache_dir: Path) -> None:
    """Refuse a run whose feature cache would not fit the free disk, naming the sizes, before
    anything is written (a cache already partly there counts as written)."""
    need = plan.bytes - cache_bytes(cache_dir)
    free = free_bytes(cache_dir)
    if need > free:
        raise TrainConfigError(
            f"train: the feature cache needs {need / 1e9:.2f} GB more in {cache_dir} "
            f"({plan.records} records, {plan.tokens} tokens) but {free / 1e9:.2f} GB are free: "
            "free space, or train with features = online (nothing written)")


def batch_groups(sequences: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Indices of `sequences` grouped into forwards: sorted by length, each group as many as
    fit `max_tokens` padded tokens (group size x its longest), a longer one alone."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    groups, start = [], 0
    while start < len(order):
        end = start + 1  # sorted by length: the last sequence of a group is its longest
        while end < len(order) and (end + 1 - start) * len(sequences[order[end]]) <= max_tokens:
            end += 1
        groups.append(order[start:end])
        start = end
    return groups


class TargetFeatures:
    """The target's hidden states of the drafter's target layers, in the serving dtype.

    target_layer_ids[k] = i means the OUTPUT of decoder layer i = transformers hidden_states[i+1].
    Only layers up to max(ids)+1 are run (the later ones do not feed the drafter), unless
    `topk` > 0: then the whole model runs and `soft(rec)` gives the target's top-k logits at
    every position (distillation; cached beside the features). The embedding and lm_head are
    exposed frozen for the drafter (shared with the target, never trained).
    """

    def __init__(self, target: str | Path, layer_ids: list[int], dtype: torch.dtype,
                 cache_dir: Path | None = None, topk: int = 0,
                 device: torch.device | str = "cpu", shard: bool = False):
        """shard: FSDP2 over the process group (strategy fsdp): each rank holds 1/world of every
        decoder layer, gathered layer by layer as the forward reaches it; the embedding, final
        norm and lm_head stay whole on every rank (the drafter's loss needs them anyway). A
        sharded forward is collective: see precompute()."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype)
        model.eval().requires_grad_(False)
        self.device = torch.device(device)
        self.layer_ids = list(layer_ids)
        if not topk:
            n_keep = max(layer_ids) + 2  # keep one extra layer: the last output may be normed
            model.model.layers = model.model.layers[: min(n_keep, len(model.model.layers))]
        if shard:
            shard_target(model, self.device)
        else:
            model.to(self.device)  # only the layers kept
        self.model, self.topk, self.sharded = model, topk, shard
        self.embed_weight = model.get_input_embeddings().weight.detach().float()  # [V, H]
        self.lm_head_weight = model.get_output_embeddings().weight.detach().float()  # [V, H]
        self.cache_dir = cache_dir
        self._recent_soft: dict = {}  # many(): record id -> its soft targets
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)

    def _cached(self, rec: dict, name: str):
        """(the cache file of record `rec`'s features (name "") or top-k (".topK"), its value
        or None): a tensor [T, K*H], or (ids [T, k], logits [T, k]); None when absent or written
        for a record of another length."""
        path = (None if self.cache_dir is None
                else self.cache_dir / f"{rec['id']}{name}{CACHE_SUFFIX}")
        if path is not None and path.exists():
            from safetensors.torch import load_file

            found = load_file(path, device=str(self.device))
            value = found["features"] if "features" in found else (found["ids"], found["logits"])
            first = value[0] if isinstance(value, tuple) else value
            if first.shape[0] == len(rec["ids"]):
                return path, value
        return path, None

    @staticmethod
    def _store(path: Path | None, value) -> None:
        """Write one record's features or top-k (safetensors, no pickle) atomically."""
        if path is not None:
            from safetensors.torch import save_file

            named = (dict(zip(("ids", "logits"), value)) if isinstance(value, tuple)
                     else {"features": value})
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            save_file({k: v.detach().cpu().contiguous() for k, v in named.items()}, tmp)
            tmp.replace(path)

    @torch.no_grad()
    def __call__(self, rec: dict) -> torch.Tensor:
        """[T, K*H] features of record `rec` (read from / written to the cache)."""
        path, feats = self._cached(rec, "")
        if feats is not None:
            return feats
        ids = torch.tensor([rec["ids"]], device=self.device)
        if self.topk:  # the whole model runs anyway: keep its top-k logits too
            return self._forward(rec)[0]
        hs = self.model.model(input_ids=ids, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i + 1][0] for i in self.layer_ids], dim=-1)  # [T, K*H]
        self._store(path, feats.clone())
        return feats

    @torch.no_grad()
    def many(self, records: list[dict], max_tokens: int | None = None) -> list[torch.Tensor]:
        """[T_r, K*H] features of every record (read from / written to the cache), the missing
        ones computed in batches: records sorted by length, right-padded into forwards of at
        most `max_tokens` padded tokens (default: BATCH_TOKENS of the device). Causal attention
        keeps a record's positions blind to the padding after it, so each equals its own
        forward up to the GEMMs' rounding (tests/test_train_features.py). With `topk` the soft
        targets are cached too (soft())."""
        if max_tokens is None:
            max_tokens = BATCH_TOKENS.get(self.device.type, BATCH_TOKENS_DEFAULT)
        out: list[torch.Tensor | None] = [None] * len(records)
        self._recent_soft = {}  # soft targets of this call's forwards (there may be no cache)
        todo = []
        for i, rec in enumerate(records):
            cached = self._cached(rec, "")[1]
            soft_ok = not self.topk or self._cached(rec, f".top{self.topk}")[1] is not None
            if cached is not None and soft_ok:
                out[i] = cached
            else:
                todo.append(i)
        for group in batch_groups([records[i]["ids"] for i in todo], max_tokens):
            for j, feats in zip(group, self._batch_forward([records[todo[j]] for j in group])):
                out[todo[j]] = feats
        return out

    def _batch_forward(self, group: list[dict]) -> list[torch.Tensor]:
        """One target forward over `group` right-padded: each record's features (stored)."""
        lengths = [len(rec["ids"]) for rec in group]
        ids = torch.zeros(len(group), max(lengths), dtype=torch.int64)
        for j, rec in enumerate(group):
            ids[j, :lengths[j]] = torch.tensor(rec["ids"])
        # no attention mask: the padding is on the right, and the causal mask alone keeps every
        # real position from seeing it (positions count from 0 in every row, as alone)
        model = self.model if self.topk else self.model.model
        out = model(input_ids=ids.to(self.device), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        result = []
        for j, rec in enumerate(group):
            one = feats[j, :lengths[j]].clone()  # [T, K*H]
            self._store(self._cached(rec, "")[0], one)
            if self.topk:
                top = out.logits[j, :lengths[j]].topk(self.topk, dim=-1)
                soft = (top.indices.int(), top.values.to(one.dtype))
                self._recent_soft[rec["id"]] = soft
                self._store(self._cached(rec, f".top{self.topk}")[0], soft)
            result.append(one)
        return result

    @torch.no_grad()
    def precompute(self, records: list[dict], rank: int, world: int) -> None:
        """Cache every record's features (and top-k) in lockstep: a sharded target's forward is a
        collective, so every rank runs the same number of forwards, each a batch of records
        (batch_groups; rank r takes the r-th batch of each `world`, the last round padded with
        a repeat). Afterwards the training loop only reads the cache."""
        def missing(rec: dict) -> bool:
            return (self._cached(rec, "")[1] is None
                    or bool(self.topk) and self._cached(rec, f".top{self.topk}")[1] is None)

        torch.distributed.barrier()
        todo = [rec for rec in records if missing(rec)]  # the same list on every rank
        torch.distributed.barrier()
        groups = batch_groups([rec["ids"] for rec in todo],
                              BATCH_TOKENS.get(self.device.type, BATCH_TOKENS_DEFAULT))
        for i in range(0, len(groups), world):  # every rank a group: the forwards in lockstep
            self._batch_forward([todo[j] for j in groups[min(i + rank, len(groups) - 1)]])
        torch.distributed.barrier()

    @torch.no_grad()
    def soft(self, rec: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's top-k at every position of `rec`: (token ids [T, k] int32, logits
        [T, k] in the feature dtype); row t is the distribution of the token after x_t."""
        recent = self._recent_soft.get(rec["id"])
        if recent is not None and recent[0].shape[0] == len(rec["ids"]):
            return recent
        _, soft = self._cached(rec, f".top{self.topk}")
        return soft if soft is not None else self._forward(rec)[1]

    def _forward(self, rec: dict) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out = self.model(input_ids=torch.tensor([rec["ids"]], device=self.device),
                         output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i + 1][0] for i in self.layer_ids], dim=-1)
        top = out.logits[0].topk(self.topk, dim=-1)  # [T, k]
        soft = (top.indices.int(), top.values.to(feats.dtype))
        path, cached = self._cached(rec, "")
        if cached is None:
            self._store(path, feats.clone())
        self._store(self._cached(rec, f".top{self.topk}")[0], soft)
        return feats, soft


def shard_target(model: nn.Module, device: torch.device) -> None:
    """FSDP2 (`fully_shard`) on each decoder layer of a transformers causal LM; its other
    children (embedding, rotary, final norm, lm_head) move to `device` whole. Assumes the usual
    layout model.model.layers (every causal LM transformers ships for SGLang targets)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    for parent in (model, model.model):
        for name, child in parent.named_children():
            if name not in ("model", "layers"):
                child.to(device)


def _full_state(module: nn.Module) -> dict:
    """The drafter's full state dict, gathered from an FSDP-sharded training module onto rank 0's
    CPU (a collective: every rank calls it; the other ranks get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True,
                                                                  cpu_offload=True))
    return {k.removeprefix("drafter."): v for k, v in full.items()}


def _full_optim_state(module: nn.Module, opt: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(module, opt, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))


# ---- the model under training ----
class DrafterTrainModule(nn.Module):
    """Drafter + frozen target embedding/lm_head; forward(batch) -> (loss, stats)."""

    def __init__(self, drafter: DominoDrafter, embed_weight: torch.Tensor,
                 lm_head_weight: torch.Tensor, draft_vocab: torch.Tensor | None = None):
        super().__init__()
        self.drafter = drafter
        self.register_buffer("embed_weight", embed_weight, persistent=False)
        self.register_buffer("lm_head_weight", lm_head_weight, persistent=False)
        # token ids [Vd] the served rollout drafts from (vocab.py): the loss and the rollouts
        # run over it (None: the full vocabulary)
        self.draft_vocab = draft_vocab

    def forward(self, items: list[tuple], lam: float, gamma: float,
                soft: list[tuple] | None = None, distill: float = 0.0, tau: float = 1.0
                ) -> tuple[torch.Tensor, dict]:
        """items: (ids [T], features [T, K*H], anchors[, first-draft-only anchors[, draft
        lengths [n]]]) per sequence; all of a sequence's blocks are drafted in one backbone
        pass. soft: per sequence the target's top-k (ids [T, k], logits [T, k]) for the
        distillation term of weight `distill` at temperature `tau` (curriculum.py)."""
        conf = self.drafter.conf
        B, P = conf.block_size, conf.block_size - 1
        zs, prevs, labels, z0s, y0s = [], [], [], [], []
        tops: list[list[torch.Tensor]] = [[], [], [], []]  # ids, logits; position-0 ids, logits
        for j, (ids, feats, anchors, *rest) in enumerate(items):
            first = rest[0] if rest else []
            lengths = rest[1] if len(rest) > 1 else None
            z, prev, lab = self._blocks(ids, feats, list(anchors) + list(first), B, lengths)
            n = len(anchors)
            zs.append(z[:n])
            prevs.append(prev[:n])
            labels.append(lab[:n])
            z0s.append(z[n:, 0])  # [m, H]
            y0s.append(lab[n:, 0])  # [m]
            if soft is not None:  # label at x_{a+k+1}: the target's row after x_{a+k}
                dev = soft[j][0].device
                rows = (torch.tensor(list(anchors) + list(first), device=dev)[:, None]
                        + torch.arange(P, device=dev)).clamp(max=len(ids) - 1)  # [n+m, P]
                top_ids, top_logits = soft[j][0][rows].long(), soft[j][1][rows]  # [n+m, P, k]
                tops[0].append(top_ids[:n])
                tops[1].append(top_logits[:n])
                tops[2].append(top_ids[n:, 0])
                tops[3].append(top_logits[n:, 0])
        z, prev, lab = torch.cat(zs), torch.cat(prevs), torch.cat(labels)  # [N, P, ..]
        assert z.shape[1] == P
        copy = None
        if self.drafter.copy_gate is not None:  # the copy path of a pointer drafter
            z0 = torch.cat(z0s)
            c, c0 = self._copies(items, P)  # (candidates, match lengths) [N, P] and [M]
            c, c0 = [tuple(t.to(z.device) for t in pair) for pair in (c, c0)]
            gate = self.drafter.copy_gate
            copy = (c[0], gate(gate_inputs(z, c[1])).squeeze(-1),
                    c0[0], gate(gate_inputs(z0, c0[1])).squeeze(-1))
        return block_loss(z, prev, lab, self.lm_head_weight, self.drafter.prefix_gru,
                          self.drafter.embed_proj, lam, gamma, (torch.cat(z0s), torch.cat(y0s)),
                          self.draft_vocab, tuple(torch.cat(t) for t in tops)
                          if soft is not None else None, distill, tau, copy)

    @staticmethod
    def _copies(items: list[tuple], P: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """The copy candidate and match length (pointer.copy_table) of every label position:
        for the block at anchor a, position k's history is x_0 .. x_{a+k} (teacher-forced).
        Returns ((cand, match) [N, P] of the blocks, (cand, match) [M] of the first-only rows),
        in `forward`'s order."""
        blocks: list[list[torch.Tensor]] = [[], []]
        firsts: list[list[torch.Tensor]] = [[], []]
        for ids, _, anchors, *rest in items:
            first = rest[0] if rest else []
            cand, match = copy_table(ids.tolist())
            ends = (torch.tensor(list(anchors) + list(first), dtype=torch.long)[:, None]
                    + torch.arange(P)).clamp(max=len(ids) - 1)  # [n+m, P]
            n = len(anchors)
            blocks[0].append(cand[ends[:n]])
            blocks[1].append(match[ends[:n]])
            firsts[0].append(cand[ends[n:, 0]])
            firsts[1].append(match[ends[n:, 0]])
        return ((torch.cat(blocks[0]), torch.cat(blocks[1])),
                (torch.cat(firsts[0]), torch.cat(firsts[1])))

    def _blocks(self, ids: torch.Tensor, feats: torch.Tensor, anchors: list[int], B: int,
                lengths: torch.Tensor | None = None):
        """Draft every block of one sequence in one backbone pass.

        Returns z [n, B-1, H], GRU inputs [n, B-1, H] (embeds of x_a..x_{a+B-2}), labels [n, B-1].
        lengths [n] (2..B, default B): block j is drafted as [x_a, MASK x (L_j - 1)] alone, i.e.
        its keys past L_j are masked out and its labels from position L_j - 1 on are IGNORE.
        """
        conf = self.drafter.conf
        T, n, dev = ids.shape[0], len(anchors), ids.device
        a = torch.tensor(anchors, device=dev)  # [n]
        offs = torch.arange(B, device=dev)
        pos = (a[:, None] + offs).reshape(-1)  # [n*B] block positions
        chain = torch.full((n, B), conf.mask_token_id, dtype=torch.long, device=dev)
        chain[:, 0] = ids[a]
        if lengths is not None:
            lengths = lengths.to(dev)
        ctx_kv = self.drafter.context_kv(feats, torch.arange(T, device=dev))  # k, v [T, Hkv, D]
        # mask [n*B, T + n*B]: context positions < a (own anchor), and the own block, all of it
        blk = torch.arange(n, device=dev).repeat_interleave(B)  # [n*B] block index of each query
        ctx_ok = torch.arange(T, device=dev)[None, :] < a[blk][:, None]
        own_ok = blk[:, None] == blk[None, :]
        if lengths is not None:  # a short block's queries see only its first L_j positions
            own_ok &= (offs.repeat(n) < lengths[blk])[None, :]
        mask = torch.cat((ctx_ok, own_ok), dim=1)
        rep = conf.num_heads // conf.num_kv_heads

        def attend(i: int, q, k, v):
            kk = torch.cat((ctx_kv[i][0], k)).repeat_interleave(rep, dim=1)  # [T+nB, Hq, D]
            vv = torch.cat((ctx_kv[i][1], v)).repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q.transpose(0, 1), kk.transpose(0, 1),
                                                 vv.transpose(0, 1), attn_mask=mask)
            return out.transpose(0, 1)  # [nB, Hq, D]

        embeds = F.embedding(chain.reshape(-1), self.embed_weight)  # [n*B, H]
        z = self.drafter.backbone(embeds, pos, attend).view(n, B, -1)[:, : B - 1]
        tgt = a[:, None] + offs[None, : B - 1]  # [n, B-1] positions of x_a .. x_{a+B-2}
        inside = tgt + 1 < T
        if lengths is not None:
            inside &= offs[None, : B - 1] < (lengths[:, None] - 1)
        lab = torch.where(inside, ids[(tgt + 1).clamp(max=T - 1)], torch.full_like(tgt, IGNORE))
        prev = F.embedding(ids[tgt.clamp(max=T - 1)], self.embed_weight)  # [n, B-1, H]
        return z, prev, lab


def lr_at(step: int, conf: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_frac * lr."""
    warm = int(conf.warmup_frac * conf.steps)
    if step < warm:
        return conf.lr * (step + 1) / warm
    t = (step - warm) / max(1, conf.steps - warm)
    return conf.lr * (conf.min_lr_frac + (1 - conf.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def resolve_device(name: str) -> torch.device:
    """auto -> cuda when torch sees one, else cpu; cuda -> this rank's GPU (LOCAL_RANK)."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TrainConfigError("train: 'device' is cuda but torch sees no CUDA device")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def dist_backend(device: torch.device) -> str:
    """NCCL only when the tensors live on CUDA; gloo for CPU tensors, even on a GPU host
    (NCCL cannot reduce CPU tensors)."""
    return "nccl" if device.type == "cuda" else "gloo"


def _dist(device: torch.device | None = None) -> tuple[int, int]:
    device = device if device is not None else torch.device("cpu")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group(dist_backend(device))
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _drafter_config(conf: TrainConfig, target: Path) -> dict:
    """The trained drafter's config.json: init's (grown by add_layers), or a new one. A drafter
    trained on short blocks says so (`short_draft`: the server then drafts only the L tokens a
    round verifies); one trained from such a drafter without them keeps init's flag."""
    if conf.init:
        cfg = json.loads((Path(conf.init) / "config.json").read_text())
        cfg["num_hidden_layers"] = cfg.get("num_hidden_layers", 0) + conf.add_layers
        head = cfg["dflash_config"]
        head["gru_hidden_dim"] = head.get("gru_hidden_dim", 0) + conf.grow_gru
        head["emb_dim"] = head.get("emb_dim", 0) + conf.grow_emb
    else:
        cfg = make_draft_config(json.loads((target / "config.json").read_text()),
                                num_layers=conf.num_layers, block_size=conf.block_size,
                                num_features=conf.num_features,
                                gru_hidden_dim=conf.gru_hidden_dim, emb_dim=conf.emb_dim)
    if conf.short_blocks > 0:
        cfg["dflash_config"]["short_draft"] = True
    if conf.copy_gate:
        cfg["dflash_config"]["copy_gate"] = True
    return cfg


def add_copy_gate(weights: dict, hidden: int, bias: float = -2.0) -> dict:
    """A new copy gate for a drafter without one (pointer.py): w = 0, b = `bias`, so it starts
    as g = sigmoid(b) everywhere (0.12) and learns from there."""
    from domino_sglang.config import COPY_MAX_MATCH

    return {**weights, "copy_gate.weight": torch.zeros(1, hidden + COPY_MAX_MATCH + 1),
            "copy_gate.bias": torch.full((1,), bias)}


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


def evaluate(module: DrafterTrainModule, feats: TargetFeatures, records: list[dict],
             conf: TrainConfig) -> dict:
    """Per-position teacher-forced accuracy (base and final) and tau_sim on held-out records."""
    valid = correct_b = correct_f = None
    with torch.no_grad():
        for rec in records:
            g = torch.Generator().manual_seed(10_000_019 * (rec["id"] + 1))
            anchors = sample_anchors(rec["start"], len(rec["ids"]), conf.anchors, g)
            ids = torch.tensor(rec["ids"], device=module.embed_weight.device)
            _, st = module([(ids, feats(rec), anchors)], 0.0, conf.gamma)
            if valid is None:
                valid, correct_b, correct_f = st["valid"], st["correct_base"], st["correct_final"]
            else:
                valid = [x + y for x, y in zip(valid, st["valid"])]
                correct_b = [x + y for x, y in zip(correct_b, st["correct_base"])]
                correct_f = [x + y for x, y in zip(correct_f, st["correct_final"])]
    acc_b, acc_f = accuracies(valid, correct_b), accuracies(valid, correct_f)
    return {"acc_base": acc_b, "acc_final": acc_f,
            "tau_sim_base": tau_sim(acc_b), "tau_sim_final": tau_sim(acc_f),
            **rollout_tau(module, feats, records, conf),
            "tau_replay_final": replay_tau(module, feats, records),
            "tau_replay_base": replay_tau(module, feats, records, use_head=False)}


def replay_tau(module: DrafterTrainModule, feats: TargetFeatures, records: list[dict],
               use_head: bool = True) -> float:
    """The tau a server measures (fixed block, no prompt lookup) when it generates these
    records' responses: committed tokens / verify rounds of `replay_rounds` over each record,
    which equal the served rounds exactly when the responses are the target's greedy output
    (regenerated data; tests/test_shipped_drafter.py checks it against a served run). The
    estimate a run logs while training (held-out records, head on and off); on data used as
    written (off-policy) it is the tau of replaying those answers instead."""
    rounds = [replay_rounds(module, feats, rec, use_head=use_head) for rec in records]
    tokens = sum(len(rec["ids"]) - rec["start"] for rec in records)
    return tokens / max(sum(rounds), 1)


def rollout_tau(module: DrafterTrainModule, feats: TargetFeatures, records: list[dict],
                conf: TrainConfig) -> dict:
    """tau as serving would measure it on held-out records, without a server.

    Unlike tau_sim (teacher-forced accuracies), the head rolls out over its OWN drafts, exactly
    as `greedy_rollout` does in the worker (candidate pool included); the record's next tokens
    are the greedy target's choices, so a block commits 1 + the longest prefix of drafts equal
    to them. Returns tau_rollout_{final,base} (head on / backbone only).
    """
    from domino_sglang.config import DEFAULT_CANDIDATE_POOL
    from domino_sglang.rollout import greedy_rollout

    head, B = _head_params(module), module.drafter.conf.block_size
    committed = {"final": [], "base": []}
    with torch.no_grad():
        for rec in records:
            g = torch.Generator().manual_seed(10_000_019 * (rec["id"] + 1))
            ids = torch.tensor(rec["ids"], device=module.embed_weight.device)
            anchors = sample_anchors(rec["start"], len(rec["ids"]), conf.anchors, g)
            z, _, labels = module._blocks(ids, feats(rec), anchors, B)  # [n, B-1, H], [n, B-1]
            z = torch.cat((z, z[:, -1:]), dim=1)  # [n, B, H]: rollout reads z[:, :B-1] only
            bonus = ids[torch.tensor(anchors)]
            for name, use_head in (("final", True), ("base", False)):
                copy = _pointer(module, [rec["ids"][:a + 1] for a in anchors])
                chain = greedy_rollout(z, bonus, head, DEFAULT_CANDIDATE_POOL, use_head=use_head,
                                       copy=copy)
                match = (chain == labels).int().cumprod(dim=1)  # IGNORE labels never match
                committed[name] += (1 + match.sum(dim=1)).tolist()
    return {f"tau_rollout_{k}": sum(v) / len(v) for k, v in committed.items()}


@torch.no_grad()
def replay_rounds(module: DrafterTrainModule, feats: TargetFeatures, rec: dict,
                  use_head: bool = True, draft_lens: tuple[int, ...] | None = None,
                  short_draft: bool = False) -> int:
    """Verify rounds the worker's greedy loop needs to commit rec's generated tokens.

    rec = {"id", "ids": prompt + generated, "start": prompt length}, generated greedily by the
    target. Round by round, as `DominoWorker.decode_round` with a fixed block:
        a = start (x_a, the prefill's token, is the first bonus); repeat while a < T - 1:
        draft [x_a, MASK x (B-1)] from the features of positions < a, k = longest prefix of
        drafts equal to x_{a+1..}, a += k + 1
    draft_lens: the worker's pinned pattern (--speculative-domino-debug-draft-len L0,L1,..): a
    round at committed length a verifies L = draft_lens[a mod len] chain tokens (L - 1 drafts;
    L = 1: plain, a += 1).
    short_draft: a round of L < B drafts [x_a, MASK x (L-1)] alone (the worker's short draft).
    Equal to the served spec_verify_ct when serving computes what the drafter computes.
    """
    from domino_sglang.config import DEFAULT_CANDIDATE_POOL
    from domino_sglang.rollout import greedy_rollout

    ids = torch.tensor(rec["ids"], device=module.embed_weight.device)  # [T]
    f = feats(rec)  # [T, K*H]
    T, B, head = len(ids), module.drafter.conf.block_size, _head_params(module)
    a, rounds = rec["start"], 0
    index = CopyIndex()  # a pointer drafter's, extended round by round as the worker's
    while a < T - 1:
        rounds += 1
        n = (draft_lens[a % len(draft_lens)] if draft_lens else B) - 1  # drafts verified
        if n == 0:
            a += 1
            continue
        short = torch.tensor([n + 1]) if short_draft and n + 1 < B else None
        z, _, labels = module._blocks(ids, f, [a], B, short)  # [1, B-1, H], [1, B-1]
        # [1, L, H], as the worker rolls out: its candidate pool is shared by these L positions
        z = torch.cat((z, z[:, -1:]), dim=1)[:, :n + 1]
        copy = None
        if module.drafter.copy_gate is not None:
            index.sync(rec["ids"][:a + 1])
            copy = PointerCopy(module.drafter.copy_gate, [index], ids.device)
        chain = greedy_rollout(z, ids[a:a + 1], head, DEFAULT_CANDIDATE_POOL, use_head=use_head,
                               copy=copy)
        a += 1 + int((chain == labels[:, :n]).int().cumprod(dim=1).sum())  # chain [1, L-1]
    return rounds


def _pointer(module: DrafterTrainModule, histories: list[list[int]]) -> PointerCopy | None:
    """A pointer drafter's copy path for blocks whose histories (x_t last) are given; None for
    a drafter without a copy gate."""
    if module.drafter.copy_gate is None:
        return None
    indexes = [CopyIndex() for _ in histories]
    for index, history in zip(indexes, histories):
        index.sync(history)
    return PointerCopy(module.drafter.copy_gate, indexes, module.embed_weight.device)


def _head_params(module: DrafterTrainModule):
    """The rollout's view of the drafter under training (shared tensors, fp32), over the
    module's draft vocabulary if it has one (as the worker serves it)."""
    from domino_sglang.rollout import HeadParams

    d = module.drafter
    return HeadParams(embed=nn.Embedding.from_pretrained(module.embed_weight),
                      lm_head_weight=module.lm_head_weight, prefix_gru=d.prefix_gru,
                      embed_proj=d.embed_proj).with_vocab(module.draft_vocab)


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
    device = resolve_device(conf.device)
    rank, world = _dist(device)
    fsdp = conf.strategy == "fsdp" and world > 1  # one process: nothing to shard over
    bf16 = conf.compute_dtype == "bfloat16" or (conf.compute_dtype == "auto"
                                                and device.type == "cuda")
    out = Path(conf.out)
    target = Path(conf.target) if conf.target else target_dir()
    if not (target / "config.json").is_file():
        raise TrainConfigError(f"train: target {target} has no config.json "
                               "(run domino-sglang prepare-target)")
    dcfg = _drafter_config(conf, target)
    out.mkdir(parents=True, exist_ok=True)
    data, off_policy = prepare_data(Path(conf.data), target, out, conf.max_seq_len, rank, world,
                                    conf.chat_template)
    records = load_records(data, conf.max_seq_len, conf.max_id, conf.skip_ids)
    held = records[-conf.eval_records:] if 0 < conf.eval_records < len(records) else []
    train_recs = records[: len(records) - len(held)]
    top = max(r["id"] for r in train_recs)  # the draft vocabulary's voters: not the held-out
    train_recs += load_extra_records(conf.extra_data, conf.max_seq_len, conf.distill,
                                     {r["id"] for r in records})
    pool = epoch_pool(train_recs, conf.oversample)  # [n per epoch] indices into train_recs

    seed_dir = out / "init"  # the starting drafter in upstream layout (validates the config)
    if rank == 0 and not (seed_dir / "config.json").exists():
        init_gate = conf.init and json.loads((Path(conf.init) / "config.json").read_text())[
            "dflash_config"].get("copy_gate", False)
        if conf.init and (conf.add_layers or conf.grow_gru or conf.grow_emb
                          or (conf.copy_gate and not init_gate)):
            weights = grow_drafter(Path(conf.init), target, conf.add_layers)
            weights = grow_head(weights, conf.grow_gru, conf.grow_emb, seed=conf.seed)
            if conf.copy_gate and not init_gate:
                weights = add_copy_gate(weights, dcfg["hidden_size"])
            save_drafter(seed_dir, dcfg, weights, dtype=torch.float32)
        elif conf.init:
            import shutil

            shutil.copytree(conf.init, seed_dir)
        else:
            dconf0 = _load_conf_from_dict(dcfg, out / ".init-config")
            weights = init_drafter_weights(dconf0, seed=conf.seed)
            if conf.warm_start:
                weights.update(warm_start_weights(target, dconf0))
            save_drafter(seed_dir, dcfg, weights, dtype=torch.float32)
    if rank == 0 and conf.draft_vocab and not (out / VOCAB_FILE).exists():  # fixed for resumes
        ids = build_draft_vocab(data, conf.draft_vocab, top, conf.skip_ids,
                                always=special_token_ids(target))
        write_draft_vocab(out, ids, source=Path(data).name, max_id=top)
    if world > 1:
        torch.distributed.barrier()
    dconf = load_draft_config(seed_dir)
    if conf.features == "cache" and rank == 0:
        check_cache_fits(cache_plan(train_recs + held, dconf.num_context_features,
                                    dconf.hidden_size, getattr(torch, conf.feature_dtype),
                                    conf.distill_topk if conf.distill else 0),
                         out / "features")
    drafter = DominoDrafter.from_pretrained(dconf, dtype=torch.float32, device=device).train()
    feats = TargetFeatures(target, list(dconf.target_layer_ids), getattr(torch, conf.feature_dtype),
                           out / "features" if conf.features == "cache" else None,
                           conf.distill_topk if conf.distill else 0, device, shard=fsdp)
    if fsdp:  # the sharded target's forwards are collective: all of them before the loop
        feats.precompute(train_recs + held, rank, world)
    vocab = (load_draft_vocab(out, dconf.vocab_size) if conf.draft_vocab
             else None)  # [Vd] token ids
    export = {VOCAB_FILE: (out / VOCAB_FILE).read_text()} if vocab is not None else None
    if vocab is not None:
        vocab = vocab.to(device)
    module = DrafterTrainModule(drafter, feats.embed_weight, feats.lm_head_weight, vocab)
    step, state = 0, None
    ckpt = out / "checkpoint"
    if (ckpt / "state.pt").exists():
        state = torch.load(ckpt / "state.pt", weights_only=True, map_location=device)
        if state.get("strategy", "ddp") != ("fsdp" if fsdp else "ddp"):
            raise TrainConfigError(f"train: the checkpoint in {ckpt} was written by strategy "
                                   f"{state.get('strategy', 'ddp')} (fsdp: under torchrun); "
                                   "resume it with that strategy")
        drafter.load_state_dict(torch.load(ckpt / "drafter.pt", weights_only=True,
                                           map_location=device))
        step = int(state["step"])
    replica = None  # fsdp: rank 0's whole copy of the drafter, for the held-out evaluation
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if rank == 0:
            replica = DrafterTrainModule(
                DominoDrafter.from_pretrained(dconf, dtype=torch.float32, device=device).eval(),
                feats.embed_weight, feats.lm_head_weight, vocab)
        # one FSDP unit: the forward (module.forward) gathers the drafter whole and the backward
        # reduce-scatters its gradients (averaged over ranks, as DDP), so each rank keeps 1/world
        # of the parameters, gradients and AdamW state between steps
        fully_shard(module, mesh=init_device_mesh(device.type, (world,)))
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
    ddp = module
    if world > 1 and not fsdp:
        ddp = nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=True)

    def held_out_eval() -> dict | None:
        """The evaluation on rank 0 (None elsewhere); under fsdp every rank must call it."""
        if not fsdp:
            return evaluate(module, feats, held, conf) if rank == 0 else None
        full = _full_state(module)
        if rank != 0:
            return None
        replica.drafter.load_state_dict(full)
        return evaluate(replica, feats, held, conf)

    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=conf.steps, initial=step, desc="train", unit="step")
    log = (out / "log.jsonl").open("a") if rank == 0 else None
    tb = _tensorboard(out) if rank == 0 and conf.report_to == "tensorboard" else None
    if log is not None and step == 0:  # what this run trains on, where
        log.write(json.dumps({"step": 0, "run": {
            "data": str(data), "data_policy": "off-policy" if off_policy else "on-policy",
            "device": str(device), "world": world, "backend": dist_backend(device)
            if world > 1 else None, "bf16": bf16}}) + "\n")
        log.flush()
    if off_policy and rank == 0:
        print(f"train: {conf.data} is used as written (off-policy: the answers are not the "
              f"target's own; regenerate them for on-policy data)", flush=True)
    window: dict = {}
    if held and step == 0:  # the starting point (an --init drafter's score)
        ev = {"step": 0, "eval": held_out_eval()}
        if log is not None:
            log.write(json.dumps(ev) + "\n")
            log.flush()
        if bar is not None:
            bar.write(_eval_line(ev))
    while step < conf.steps:
        lam = lambda_at(step, conf.steps, conf.lambda_decay_frac)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, conf) * group["lr_scale"]
        items, soft = [], [] if conf.distill else None
        recs = [train_recs[pool[idx]] for idx in step_records(len(pool), step, conf.batch_size,
                                                              rank, world, conf.seed)]
        step_feats = feats.many(recs)  # the step's missing features in batched forwards
        for rec, rec_feats in zip(recs, step_feats):
            g = torch.Generator().manual_seed(conf.seed * 1_000_003 + step * 7919 + rec["id"])
            anchors, first = sample_block_anchors(rec["start"], len(rec["ids"]), conf.anchors,
                                                  conf.first_anchors, g)
            item = (torch.tensor(rec["ids"], device=device), rec_feats, anchors, first)
            if conf.short_blocks > 0:  # drawn after the anchors: other runs' streams unchanged
                item += (sample_draft_lengths(len(anchors) + len(first), conf.block_size,
                                              conf.short_blocks, g),)
            items.append(item)
            if soft is not None:
                soft.append(feats.soft(rec))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, st = ddp(items, lam, conf.gamma, soft, conf.distill,
                           conf.distill_temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(drafter.parameters(), conf.grad_clip)
        if hasattr(gnorm, "full_tensor"):  # fsdp: a DTensor over the ranks' shards
            gnorm = gnorm.full_tensor()
        opt.step()
        step += 1
        loss_value = float(loss.detach())
        _accumulate(window, st, loss_value, float(gnorm))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}", lam=f"{lam:.2f}")
        if log is not None and (step % conf.log_every == 0 or step == conf.steps):
            entry = _summary(window, step, lam, lr_at(step - 1, conf))
            log.write(json.dumps(entry) + "\n")
            log.flush()
            if tb is not None:
                for key in ("loss", "lambda", "lr", "grad_norm", "ce_base", "ce_final",
                            "tau_sim_base", "tau_sim_final"):
                    tb.add_scalar(f"train/{key}", entry[key], step)
            if bar is not None:
                bar.write(f"step {step}: loss {entry['loss']:.3f} tau_sim base "
                          f"{entry['tau_sim_base']:.2f} final {entry['tau_sim_final']:.2f} "
                          f"acc {' '.join(f'{a:.2f}' for a in entry['acc_final'][:6])}")
            window = {}
        if held and (step % conf.eval_every == 0 or step == conf.steps) and (
                log is not None or fsdp):
            ev = {"step": step, "eval": held_out_eval()}
        if held and log is not None and (step % conf.eval_every == 0 or step == conf.steps):
            log.write(json.dumps(ev) + "\n")
            log.flush()
            if tb is not None:
                for key, value in ev["eval"].items():
                    if key.startswith("tau_"):
                        tb.add_scalar(f"eval/{key}", value, step)
            if bar is not None:
                bar.write(_eval_line(ev))
                bar.set_postfix(tau=f"{ev['eval']['tau_replay_final']:.2f}")
        if step % conf.save_every == 0 or step == conf.steps:
            full = opt_full = None
            if fsdp:  # gathered by every rank, written by rank 0
                full, opt_full = _full_state(module), _full_optim_state(module, opt)
            if rank == 0:
                _save_checkpoint(out, drafter, opt, step, conf, full, opt_full)
                weights = full if fsdp else {k: v.cpu() for k, v in drafter.state_dict().items()}
                save_drafter(out / "drafter", dcfg, weights, dtype=torch.bfloat16,
                             extra_files=export)
        if on_step is not None:
            on_step(step, drafter)
        if stop_at is not None and step >= stop_at:
            break
    if bar is not None:
        bar.close()
    if log is not None:
        log.close()
    if tb is not None:
        tb.close()
    if world > 1:
        torch.distributed.barrier()
        if owns_group:  # a group left open can abort its process at exit (gloo, seen in CI)
            torch.distributed.destroy_process_group()
    return out / "drafter"


def warm_start_weights(target: Path, dconf, first: int = 0, count: int = -1) -> dict:
    """Start the backbone from the target's LAST decoder layers and final norm (same widths).

    Drafter layer i takes target layer n_target - first + i (first = 0: num_layers), for the
    first `count` drafter layers (-1: all).

    z feeds the target's lm_head, which expects states shaped like the target's final-normed
    ones; copying the final norm and top layers starts the base logits near the target's own
    next-token distribution instead of at a random ~30-nat cross-entropy. q_norm/k_norm (absent
    in Llama targets) stay at 1.
    """
    from safetensors import safe_open

    files = sorted(target.glob("*.safetensors"))
    tensors = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            for name in sf.keys():
                tensors[name] = sf.get_tensor(name)
    n_target = 1 + max(int(k.split(".")[2]) for k in tensors if k.startswith("model.layers."))
    out = {}
    if tensors.get("model.norm.weight") is not None:
        out["norm.weight"] = tensors["model.norm.weight"].float()
    shapes = dconf.expected_shapes()
    first = first or dconf.num_layers
    for i in range(dconf.num_layers if count < 0 else count):
        src = f"model.layers.{n_target - first + i}."
        for name in shapes:
            if name.startswith(f"layers.{i}.") and not name.endswith(("q_norm.weight",
                                                                      "k_norm.weight")):
                t = tensors.get(src + name[len(f"layers.{i}."):])
                if t is not None and tuple(t.shape) == shapes[name]:
                    out[name] = t.float()
    return out


def grow_drafter(src: Path, target: Path, add: int) -> dict:
    """The weights of drafter `src` with `add` more decoder layers inserted BELOW its own.

    Net2Net-style growth (Chen et al., 2016): each new layer is a pre-norm residual block
    x + o_proj(attn(.)) + down_proj(mlp(.)), so with o_proj and down_proj at ZERO it is the
    identity and the grown drafter computes exactly what `src` did; training then starts from
    src's loss instead of a fresh drafter's. The other weights come from the target's layers
    just below the ones src was warm-started from (same widths), so once the output projections
    move the new layers start from features the target itself computes there.
    """
    from safetensors.torch import load_file

    n_old = load_draft_config(src).num_layers
    grown = {}
    for name, t in load_file(str(src / "model.safetensors")).items():  # src's layers move up
        if name.startswith("layers."):
            i, rest = name[len("layers."):].split(".", 1)
            name = f"layers.{int(i) + add}.{rest}"
        grown[name] = t.float()
    if not add:
        return grown
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = n_old + add
    big = _load_conf_from_dict(cfg, src / ".grow-config")
    # target layers n_target - n_old - add .. n_target - n_old - 1 become drafter layers 0..add-1
    warm = warm_start_weights(target, big, first=add + n_old, count=add)
    fresh = init_drafter_weights(big, seed=0)
    for name in big.expected_shapes():
        if name.startswith("layers.") and int(name.split(".")[1]) < add:
            grown[name] = warm.get(name, fresh[name])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                grown[name] = torch.zeros_like(grown[name])
    return grown


def grow_head(weights: dict, add_gru: int, add_emb: int, seed: int = 0, std: float = 0.02
              ) -> dict:
    """Drafter `weights` with the causal head widened: `add_gru` more GRU units, `add_emb` more
    ranks in the low-rank correction W2 silu(W1 [z; s]).

    Function-preserving like grow_drafter: the new weights are random (std) except where they
    would reach the old outputs, which are zero: the old GRU units read no new unit (W_h* new
    columns), W1's old rows read no new unit, and W2's new columns are zero, so the grown head
    corrects exactly as before. Gradients reach every new weight (the new states are non-zero
    and W2's new columns are the first to move, as with LoRA's zero B).
    """
    if not add_gru and not add_emb:
        return weights
    gen = torch.Generator().manual_seed(seed)
    ih, hh = weights["prefix_gru.weight_ih_l0"].float(), weights["prefix_gru.weight_hh_l0"].float()
    w1, w2 = weights["embed_proj.0.weight"].float(), weights["embed_proj.2.weight"].float()
    g, e = hh.shape[1], w1.shape[0]  # old widths; ih [3g, H], hh [3g, g], w1 [e, H+g], w2 [V, e]
    h, big_g, big_e = ih.shape[1], g + add_gru, e + add_emb

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    new_ih = torch.cat((ih.view(3, g, h), rand(3, add_gru, h)), dim=1)  # [3, G, H]: r, z, n gates
    new_hh = rand(3, big_g, big_g)  # [3, G, G]
    new_hh[:, :g, :g] = hh.view(3, g, g)
    new_hh[:, :g, g:] = 0  # old units never read new ones
    new_w1 = rand(big_e, h + big_g)  # [E, H+G]
    new_w1[:e, : h + g] = w1
    new_w1[:e, h + g:] = 0  # the old ranks never read the new units
    new_w2 = torch.cat((w2, torch.zeros(w2.shape[0], add_emb)), dim=1)  # [V, E]: new ranks silent
    return {**weights, "prefix_gru.weight_ih_l0": new_ih.reshape(3 * big_g, h),
            "prefix_gru.weight_hh_l0": new_hh.reshape(3 * big_g, big_g),
            "embed_proj.0.weight": new_w1, "embed_proj.2.weight": new_w2}


def _load_conf_from_dict(cfg: dict, scratch: Path):
    """Validate a drafter config dict through the same parser the server uses."""
    from domino_sglang.config import parse_draft_config

    return parse_draft_config(cfg, scratch)


def _eval_line(ev: dict) -> str:
    e = ev["eval"]
    return (f"eval step {ev['step']}: tau (as served, replayed) base {e['tau_replay_base']:.2f} "
            f"final {e['tau_replay_final']:.2f}; tau_sim base {e['tau_sim_base']:.2f} final "
            f"{e['tau_sim_final']:.2f}, tau_rollout base {e['tau_rollout_base']:.2f} final "
            f"{e['tau_rollout_final']:.2f}")


def _accumulate(window: dict, st: dict, loss: float, gnorm: float) -> None:
    window.setdefault("loss", []).append(loss)
    window.setdefault("grad_norm", []).append(gnorm)
    window.setdefault("ce_base", []).append(st["ce_base"])
    window.setdefault("ce_final", []).append(st["ce_final"])
    for key in ("valid", "correct_base", "correct_final"):
        prev = window.get(key)
        window[key] = st[key] if prev is None else [x + y for x, y in zip(prev, st[key])]


def _summary(window: dict, step: int, lam: float, lr: float) -> dict:
    mean = {k: sum(v) / len(v) for k, v in window.items() if k in
            ("loss", "grad_norm", "ce_base", "ce_final")}
    acc_b = accuracies(window["valid"], window["correct_base"])
    acc_f = accuracies(window["valid"], window["correct_final"])
    return {"step": step, "lambda": lam, "lr": lr, **mean, "acc_base": acc_b, "acc_final": acc_f,
            "tau_sim_base": tau_sim(acc_b), "tau_sim_final": tau_sim(acc_f)}


def _tensorboard(out: Path):
    """A SummaryWriter on out/tensorboard, or None (with a note) when tensorboard is absent."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("train: report_to = tensorboard, but tensorboard is not installed "
              "(pip install tensorboard); logging to log.jsonl only", flush=True)
        return None
    return SummaryWriter(str(out / "tensorboard"))


def prepare_data(data: Path, target: Path, out: Path, max_seq_len: int, rank: int = 0,
                 world: int = 1, chat_template: str = "") -> tuple[Path, bool]:
    """(records file, off_policy): a regenerated JSONL as is; conversations (conversations.py)
    tokenised with the target's chat template into out/data-as-written.jsonl (rank 0 writes
    it, once), to be trained on as written: off-policy."""
    from domino_sglang.train.conversations import (
        ConversationError,
        is_records_file,
        read_conversations,
        written_records,
    )

    if not data.is_file():
        raise TrainConfigError(f"train: data {data} not found")
    try:
        if is_records_file(data):
            return data, False
        dest = out / "data-as-written.jsonl"
        if rank == 0 and not dest.exists():
            from domino_sglang.train.regenerate import chat_tokenizer

            try:
                tokenizer = chat_tokenizer(target, Path(chat_template) if chat_template
                                           else None)
            except ValueError as exc:
                raise TrainConfigError(f"train: {exc}") from exc
            records = written_records(read_conversations(data), tokenizer, max_seq_len)
            if not records:
                raise TrainConfigError(f"train: {data} has no conversation ending with an "
                                       "assistant answer")
            tmp = dest.with_suffix(".partial")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
            tmp.replace(dest)
    except ConversationError as exc:
        raise TrainConfigError(f"train: {exc}") from exc
    if world > 1:
        torch.distributed.barrier()
    return dest, True


def target_defaults(target_cfg: dict) -> dict:
    """Training defaults sized for a target's config.json (the lowest-priority config layer of
    `domino-sglang train --target`): block 16, the paper's curriculum (lambda linear 1 -> 0 over
    the whole run), draft layers ~ target layers / 7 (1..5: 5 for a 36-layer Qwen3-8B, as
    upstream DFlash drafters have), as many target layers read as draft layers (at least 3, at
    most the L-3 upstream's spread allows), picked by config.spread_layer_ids (the rule of
    SGLang's dflash_utils.build_target_layer_ids: round(1 + k (L-4) / (n-1))), and the causal
    head's GRU ~ hidden/2 (multiple of 64, 64..1024) with a correction rank of a quarter of it."""
    try:
        layers, hidden = int(target_cfg["num_hidden_layers"]), int(target_cfg["hidden_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise TrainConfigError(f"train: the target's config.json lacks {exc}") from exc
    num_layers = min(5, max(1, round(layers / 7)))
    gru = min(1024, max(64, hidden // 2 // 64 * 64))
    return {"block_size": 16, "lambda_decay_frac": 1.0, "num_layers": num_layers,
            "num_features": max(1, min(max(3, num_layers), layers - 3)),
            "gru_hidden_dim": gru, "emb_dim": max(16, gru // 4)}

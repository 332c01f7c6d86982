"""The training run's configuration: `TrainConfig`, its TOML/override parsing and validation.

Layers, lowest first: `target_defaults` (sized for the target), a TOML file, then overrides
(`--set key=value`, flags); unknown keys and wrong types are errors that name the key. Depends
on nothing else in the package.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch


class TrainConfigError(ValueError):
    """A bad training config; the message names the key."""


@dataclass
class TrainConfig:
    """One run's keys (a recipe's TOML, then `--set` overrides), each documented beside it."""

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
        """This config, checked: a TrainConfigError names the first bad key."""
        self._check_sizes()
        self._check_choices()
        self._check_data()
        self._check_loss()
        return self

    def _check_sizes(self) -> None:
        """The required keys, widths, counts, fractions, and the growth of an init drafter."""
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

    def _check_choices(self) -> None:
        """The keys that name one of a few choices (dtypes, device, strategy, features)."""
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

    def _check_data(self) -> None:
        """Which records a run reads, and how many tokens of each."""
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

    def _check_loss(self) -> None:
        """Distillation and the copy gate's learning rate."""
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

"""The target's features a drafter trains on: hidden states of its target layers, and top-k.

Computed with transformers in the serving dtype (`feature_dtype`), and with `features` = cache
written once per record under out/features (safetensors) and read back every epoch, or with
`features` = online computed in each step and never written. `cache_plan` sizes the cache before
a run, which refuses to start when the disk cannot hold it (`check_cache_fits`). Depends on
config.py, records.py and warm_start.py (to size a run's cache) and transformers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from domino_sglang.train.config import TrainConfig, TrainConfigError
from domino_sglang.train.records import load_extra_records, load_records
from domino_sglang.train.warm_start import drafter_config

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
    width = len(drafter_config(conf, target)["dflash_config"]["target_layer_ids"])
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
        forward up to the GEMMs' rounding (tests/train/test_train_features.py). With `topk` the soft
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

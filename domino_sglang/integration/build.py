"""The assembly of a DOMINO worker's round: from SGLang's server arguments and target worker to
the drafter, its head, the proposers, the planner, the policy, the observer and the metrics.

Every start-up decision lives here, taken once and logged: the drafter's checkpoint checked
against the target (one message naming the field, before any weight reaches SGLang's loader),
the serving options, the draft vocabulary, the tensor-parallel layout of the base logits, the
pointer copy's index, the CPU runtime's kernels. The worker (worker.py) keeps the lifecycle,
prefill and the round.

Private SGLang internals (sglang_compat.py): `build_draft_tp_worker`, `ModelRegistry.models`
(register_draft_architecture), `runtime_context.get_spec`, the scheduler's metrics settings,
the TP group.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from domino_sglang.cpu import argmax as cpu_argmax
from domino_sglang.cpu import linear as cpu_linear
from domino_sglang.cpu import native as cpu_native
from domino_sglang.integration.draft_model import sglang_draft_model_class
from domino_sglang.integration.draft_pass import DraftPass
from domino_sglang.model.config import (
    ARCHITECTURE,
    DraftConfig,
    check_against_target,
    load_draft_config,
    load_draft_weights,
)
from domino_sglang.model.shard import Shard
from domino_sglang.model.vocab import load_draft_vocab, load_draft_vocab_file
from domino_sglang.sglang_compat import (
    build_draft_tp_worker,
    get_observability,
    get_parallel,
    get_serving,
    get_spec,
    register_draft_architecture,
    supports_sampling_mask,
    tp_all_gather,
    tp_cpu_group,
    tp_shard,
    tp_verdict_sync,
)
from domino_sglang.spec import options, primitives
from domino_sglang.spec.history import HistoryIndexes
from domino_sglang.spec.metrics import DominoMetrics
from domino_sglang.spec.observer import RoundObserver
from domino_sglang.spec.planner import RoundPlanner
from domino_sglang.spec.pointer import CopyPaths, copy_index_on_device
from domino_sglang.spec.policy import SpeculationPolicy, cost_model
from domino_sglang.spec.proposers import OFFERING, ProposerContext, offering_proposers
from domino_sglang.spec.proposers.domino import DominoProposer
from domino_sglang.spec.proposers.protocol import Proposer
from domino_sglang.spec.rollout import HeadParams
from domino_sglang.spec.tp import (
    RankAgreement,
    gathered_logits,
    group_first,
    group_minimum,
    pooled_logits,
    vocab_range,
    vocab_rows,
)

logger = logging.getLogger("domino_sglang.integration.worker")  # the start-up lines: the worker's


@dataclass
class RoundParts:
    """What a DOMINO worker's round is made of (build_round)."""

    block_size: int  # B, the drafter's block
    conf: DraftConfig  # the drafter's checkpoint
    options: options.DominoConfig  # the serving options
    draft_worker: object  # SGLang's draft TpModelWorker
    draft_model_runner: object
    draft_model: object  # integration/draft_model.py's DominoDraftModel
    shard: Shard | None  # this rank's part at TP > 1, None at TP 1
    metrics: DominoMetrics
    policy: SpeculationPolicy
    draft_pass: DraftPass
    drafter: DominoProposer
    proposers: tuple[Proposer, ...]  # in the order a round asks them
    planner: RoundPlanner
    observer: RoundObserver
    agree: RankAgreement  # one decision on every TP rank (spec/tp.py)


def build_round(server_args, gpu_id: int, nccl_port: int, target_worker) -> RoundParts:
    """Check the drafter against the target, build its draft worker and the round's parts."""
    model_runner, device = target_worker.model_runner, target_worker.device
    block_size = int(get_spec().speculative_num_draft_tokens)
    target_cfg = model_runner.model_config
    conf = load_draft_config(server_args.speculative_draft_model_path, block_size,
                             tokenizer_path=server_args.tokenizer_path or server_args.model_path)
    check_against_target(conf, target_cfg.hidden_size, target_cfg.vocab_size,
                         target_cfg.num_hidden_layers)
    load_draft_weights(conf)
    # the serving options (options.py), from this server's flags and the drafter's config
    opts = options.for_server(server_args, conf, block_size)

    # The draft config names SGLang's DFlashDraftModel; in this (scheduler) process, and only
    # when DOMINO was chosen, that architecture resolves to our drafter class.
    register_draft_architecture(ARCHITECTURE, sglang_draft_model_class())
    bundle = build_draft_tp_worker(
        server_args=server_args, gpu_id=gpu_id, nccl_port=nccl_port,
        target_model_config=target_cfg, algo_label="DOMINO",
    )
    drafter = bundle.draft_model.drafter
    target = model_runner.model
    embed = target.model.embed_tokens  # the target's, shared
    shard = tp_shard()  # None at TP size 1
    # On the CPU the head's small sequential GEMVs run faster in fp32 than in bf16
    # (benchmarks/studies/head_cost.py); a few MB of weights.
    head_dtype = torch.float32 if torch.device(device).type == "cpu" else None
    head, base_layout = build_head(drafter, embed, target.lm_head, target_cfg.vocab_size, conf,
                                   opts, shard, device, head_dtype)
    # each running request's history by its n-grams, read by the pointer copy and prompt lookup
    histories = HistoryIndexes(block_size - 1)
    copy = build_copy(drafter, opts, device, head_dtype, histories)
    metrics = scheduler_metrics(block_size, device)
    profile, cost = cost_model(torch.device(device).type, str(model_runner.dtype),
                               override=opts.cost, short_draft=opts.short_draft)
    policy = SpeculationPolicy.from_config(opts, cost)  # adaptive off: fixed block
    # the round's stages besides the worker's own: the plan (L, offers; planner.py), the
    # proposers (the Domino drafter, then the offering proposers over its rows: prompt lookup,
    # proposers/__init__.py) and what the round teaches the metrics and the policy (observer.py)
    draft_pass = DraftPass(bundle.draft_model_runner, embed, device, metrics)
    domino = DominoProposer(draft_pass, head, copy, opts, block_size, metrics)
    offering = offering_proposers(ProposerContext(block_size, conf.mask_token_id, device,
                                                  head.vocab_size, opts, histories))
    for name in OFFERING:  # each registered one's series, at 0 where it is off
        metrics.declare_offering(name)
    planner = RoundPlanner(policy, block_size, device, offering,
                           bans_only=supports_sampling_mask, tree_width=opts.tree_width)
    # every rank decides as one (tp.py): the policy learns from rank 0's round times, the
    # captures from the group's least free memory, the verdict is rank 0's
    cpu_group = tp_cpu_group()
    agree = RankAgreement(*((None, None) if cpu_group is None else
                            (group_first(cpu_group), group_minimum(cpu_group))), tp_verdict_sync())
    observer = RoundObserver(metrics, policy, agree)
    logger.info("DOMINO worker: block %d, %d draft layers, target layers %s, pool %s, head %s, "
                "copy %s, draft pass %s, offering proposers %s, policy %s (cost profile %s: %s), "
                "%s",
                block_size, conf.num_layers, list(conf.target_layer_ids),
                opts.candidate_pool or "full vocabulary", "on" if opts.head else "OFF",
                "on" if copy is not None else "off",
                "L tokens" if opts.short_draft else "whole block",
                ", ".join(p.name for p in offering) or "none",
                "adaptive" if policy.enabled else "fixed block", profile, cost,
                "one rank" if shard is None else
                f"tensor parallel rank {shard.rank} of {shard.size} (draft layers "
                f"{conf.num_heads // shard.size} heads each, base logits {base_layout})")
    return RoundParts(block_size, conf, opts, bundle.draft_worker, bundle.draft_model_runner,
                      bundle.draft_model, shard, metrics, policy, draft_pass, domino,
                      (domino, *offering), planner, observer, agree)


def build_head(drafter, embed, lm_head_module, vocab_size: int, conf: DraftConfig, opts,
               shard: Shard | None, device, head_dtype: torch.dtype | None
               ) -> tuple[HeadParams, str]:
    """The rollout's head (rollout.HeadParams) over the target's embedding and lm_head, its
    GRU and correction in `head_dtype` (None: the drafter's): its draft vocabulary, this rank's
    base logits at TP > 1 and, on the CPU, the runtime's kernels. Returns it and what a TP
    round gathers of the base logits (for the start-up log)."""
    # tensor parallel (tp.py): this rank's rows of the lm_head, ids [start, end); else all of
    # them but SGLang's padding (rows to a multiple of 64): the real vocabulary only
    if shard is None:
        lm_head = lm_head_module.weight[:vocab_size]  # [V, H]
    else:
        start, end = vocab_range(lm_head_module)
        lm_head = lm_head_module.weight  # [V_padded / N, H]
    head = HeadParams.of(drafter, embed, lm_head, head_dtype,
                         full_vocab=0 if shard is None else vocab_size)
    # the draft vocabulary (vocab.py): base logits over its Vd rows of the lm_head only
    vocab = (None if not opts.draft_vocab
             else load_draft_vocab_file(opts.token_map, conf.vocab_size) if opts.token_map
             else load_draft_vocab(conf.path, conf.vocab_size))
    head = head.with_vocab(vocab, None if shard is None or vocab is None else vocab_rows(
        lm_head, start, end, vocab.to(lm_head.device), shard.all_reduce))
    if head.vocab is not None:
        logger.info("DOMINO draft vocabulary: %d of %d tokens (%s)",
                    len(head.vocab), conf.vocab_size, conf.path)
    if torch.device(device).type == "cpu":  # the CPU runtime's exact, faster argmax
        primitives.install(argmax=cpu_argmax.argmax)
    if cpu_linear.is_active():  # the base logits of B-1 positions, packed (cpu/linear.py)
        rows = lm_head if head.vocab is None else head.vocab_lm_head
        head.base_linear = functools.partial(cpu_linear.packed_linear,
                                             packed=cpu_linear.pack(rows))
        # the backbone's and context projection's linears, as the target's are
        cpu_linear.pack_linears(drafter.fc)
        cpu_linear.pack_linears(drafter.layers)
        cpu_native.fuse_drafter(drafter)  # bf16: its norms and rotary too
        head.native = cpu_native.native_head(head)  # bf16 target: greedy positions fused
    base_layout = "over replicated draft rows"  # what a TP round gathers (tp.py)
    if shard is not None and head.vocab is None:  # this rank's logits, gathered
        local = head.base_linear or functools.partial(F.linear, weight=lm_head)
        if opts.candidate_pool and opts.head:
            head.base_linear = pooled_logits(local, end - start, vocab_size,
                                             opts.candidate_pool, tp_all_gather)
            base_layout = "gathered as the pool reads them"
        else:
            head.base_linear = gathered_logits(local, vocab_size, tp_all_gather)
            base_layout = "gathered whole"
    return head, base_layout


def build_copy(drafter, opts, device, head_dtype: torch.dtype | None,
               histories: HistoryIndexes) -> CopyPaths | None:
    """A pointer-generator drafter's copy paths (pointer.py): its copy gate, in the head's
    dtype, and each running request's copy index, on the device (copy_index_on_device: CUDA by
    default) or the host (`histories`); None without a gate or with the copy off (drafts from
    p alone)."""
    gate = drafter.copy_gate if opts.copy else None
    if gate is None:
        return None
    gate = gate.to(head_dtype) if head_dtype is not None else gate
    return CopyPaths(gate, device,
                     on_device=copy_index_on_device(device, opts.copy_index)
                     or bool(opts.gpu_shape), histories=histories)


def scheduler_metrics(max_draft_len: int, device) -> DominoMetrics:
    """The worker's metrics: enabled when SGLang's own scheduler metrics are
    (`--enable-metrics`, stats-logging rank: attention TP/CP rank 0), with SGLang's
    `model_name` label (+ `dp_rank`)."""
    obs, parallel = get_observability(), get_parallel()
    enabled = bool(obs.enable_metrics) and (
        (parallel.attn_tp_rank == 0 and parallel.attn_cp_rank == 0)
        or bool(obs.enable_metrics_for_all_schedulers))
    if not enabled:
        return DominoMetrics(enabled=False)
    labels = {"model_name": str(get_serving().served_model_name)}
    if parallel.dp_rank is not None:
        labels["dp_rank"] = str(parallel.dp_rank)
    return DominoMetrics(labels, max_draft_len=max_draft_len,
                         cuda=torch.device(device).type == "cuda")

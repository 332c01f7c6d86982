"""Every private SGLang internal the plugin touches, in one place.

Written against sglang==0.5.23 (`SGLANG_VERSION`); tests/integration/test_sglang_compat.py pins that
version and checks that every name, dataclass field, keyword argument and hook target listed in
`TOUCHPOINTS` still exists, so an SGLang upgrade fails there, naming what moved, rather than in
a running server. Nothing here is DOMINO logic: names re-exported as SGLang spells them, the
ScheduleBatch round-state save / restore the worker needs to borrow SGLang's own forward
builders, and the registration calls (speculative registry, hooks, model registry).

Imported at the top: the modules the worker needs, all already loaded by any SGLang process
(so importing this module costs little there; the plugin's `register()` imports it in every SGLang
process). Lazy (inside functions): the model registry (its import scans every model file) and
the algorithm's registration pieces (algorithm.py is also imported by the CLI, without a server).
Lazy re-exports (`LAZY`, resolved on first use through the module's `__getattr__`): the names
the drafter model class (integration/draft_model.py), the CPU runtime (cpu/attention.py,
cpu/linear.py) and the access rules (http/access.py) take from SGLang modules nothing else
here imports.

Every module that touches SGLang imports this one inside the function that needs it, never at
its top: the CLI imports guards.py / server_flags.py / options.py without a server, and
`python -c "import domino_sglang.cli"` imports no SGLang.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator

from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.srt.distributed import (
    get_tp_group,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.layers.sampler import apply_custom_logit_processor
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.runtime_context import (
    get_observability,
    get_parallel,
    get_server_args,
    get_serving,
    get_spec,
)
from sglang.srt.sampling.custom_logit_processor import supports_sampling_mask
from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.draft_worker_common import (
    build_draft_tp_worker,
    make_draft_block_spec_info,
    make_draft_input_v2,
)
from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask
from sglang.srt.utils.async_probe import sanitize_nan_logits
from sglang.srt.utils.common import get_bool_env_var

SGLANG_VERSION = "0.5.23"

__all__ = [
    "BaseSpecWorker", "CaptureHiddenMode", "DFlashVerifyInput", "ForwardBatch", "ForwardMode",
    "GenerationBatchResult", "GrammarTree", "HTTP_SERVER", "KVWriteLoc", "LAZY", "SGLANG_VERSION",
    "TOUCHPOINTS", "apply_custom_logit_processor", "apply_scaling_penalties",
    "assign_extend_cache_locs_func", "batch_round_state", "bound_runtime",
    "build_draft_tp_worker", "declare_resolution", "decode_graph_batch_sizes",
    "free_device_memory", "graph_batch_sizes",
    "build_grammar_vocab_mask", "compute_spec_logprobs", "get_bool_env_var", "get_observability",
    "get_parallel", "get_server_args", "get_serving", "get_spec", "host_lens_grown",
    "loaded_http_server", "make_draft_block_spec_info", "make_draft_input_v2",
    "register_draft_architecture", "register_hooks", "register_resolution_steps",
    "register_spec_algorithm",
    "sanitize_nan_logits", "supports_sampling_mask", "tp_all_gather",
    "tp_cpu_group", "tp_verdict_sync", "capture_stream", "attention_workspace_bytes",
    "rmsnorm_uses_amx", "tp_shard", "verify_graph_runtime",
]  # plus the lazy re-exports of LAZY (not listed: `import *` would import them all)

# The ScheduleBatch fields a plain round (decode_forward) sets for SGLang's own DECODE forward
# and restores afterwards: the scheduler's view of the round must not change.
ROUND_FIELDS = ("forward_mode", "input_ids", "out_cache_loc", "spec_info", "seq_lens",
                "seq_lens_cpu", "seq_lens_sum")

# SGLang's HTTP server module: its FastAPI `app` gets the guards (guards.py) in the process that
# serves it, found in sys.modules (loaded_http_server), never imported by the plugin.
HTTP_SERVER = "sglang.srt.entrypoints.http_server"

# The hooks the plugin registers: (target SGLang function, when) by role.
HOOKS = {
    # algorithm.py
    "clip_max_new_tokens": ("sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens",
                            "AFTER"),
    "cumulate_penalties": ("sglang.srt.speculative.spec_utils.spec_prepare_for_decode", "BEFORE"),
    "refuse_unsupported_outputs": (
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", "BEFORE"),
    # guards.py
    "install_http_guards": (f"{HTTP_SERVER}.launch_server", "BEFORE"),
    "check_input_ids": (
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", "BEFORE"),
    # server_flags.py: the plugin's flags on SGLang's parser, read back from the namespace
    "add_server_flags": ("sglang.srt.server_args.ServerArgs.add_cli_args", "AFTER"),
    "read_http_flags": ("sglang.srt.server_args.ServerArgs.from_cli_args", "BEFORE"),
    "remember_domino_flags": ("sglang.srt.server_args.ServerArgs.from_cli_args", "AFTER"),
}

# The steps of SGLang's server-argument resolution pipeline the plugin wraps (arg_groups/
# pipeline.py, through `register_resolution_hook`), by role: the wrapper runs at that step's
# place in the pipeline and calls the step itself.
RESOLUTION_STEPS = {
    # algorithm.py: a DOMINO server on CUDA that names no backend verifies on flashinfer, decided
    # before SGLang fills its platform default (fa3 on Hopper, trtllm_mha on SM100)
    "default_verify_backend": "handle_attention_backend_compatibility",
}

# Lazy re-exports, as SGLang spells them: name -> SGLang module. `from domino_sglang.sglang_compat
# import RadixAttention` (inside the function that needs it) imports that module then.
LAZY: dict[str, str] = {
    # integration/draft_model.py: the drafter as an SGLang model class
    "LogitsProcessorOutput": "sglang.srt.layers.logits_processor",
    "RadixAttention": "sglang.srt.layers.radix_attention",
    "AttentionType": "sglang.srt.layers.radix_attention",
    # cpu/attention.py: the `domino_cpu` backend and its registration (registry, CLI choices)
    "AttentionBackend": "sglang.srt.layers.attention.base_attn_backend",
    "ATTENTION_BACKENDS": "sglang.srt.layers.attention.attention_registry",
    "ATTENTION_BACKEND_CHOICES": "sglang.srt.arg_groups.choices",
    "DRAFT_ATTENTION_BACKEND_CHOICES": "sglang.srt.arg_groups.choices",
    # cpu/linear.py: the methods it patches (CPU engine only)
    "LogitsProcessor": "sglang.srt.layers.logits_processor",
    "UnquantizedEmbeddingMethod": "sglang.srt.layers.quantization.unquant",
    "UnquantizedLinearMethod": "sglang.srt.layers.quantization.unquant",
    # cpu/forward.py: the model class whose forward it routes, and the classes it recognises
    "LlamaModel": "sglang.srt.models.llama",
    "LlamaDecoderLayer": "sglang.srt.models.llama",
    "LlamaAttention": "sglang.srt.models.llama",
    "LlamaMLP": "sglang.srt.models.llama",
    "AuxHiddenStateList": "sglang.srt.layers.aux_hidden_states",
    "RotaryEmbedding": "sglang.srt.layers.rotary_embedding.base",
    "apply_rotary_emb": "sglang.srt.layers.rotary_embedding.utils",
    "RMSNorm": "sglang.srt.layers.layernorm",
    "SiluAndMul": "sglang.srt.layers.activation",
    # http/access.py: a route's auth level
    "AuthLevel": "sglang.srt.utils.auth",
    "_get_auth_level_from_app_and_scope": "sglang.srt.utils.auth",
}

# What the worker and the algorithm read or write on SGLang objects, for the version test:
#   "dataclass fields": {"module.Class": fields} (ScheduleBatch, ForwardBatch, ...);
#   "keywords": {"module.callable": keyword arguments passed};
#   "attributes": {"module.Class": attribute / method names};
#   "init assigns": {"module.Class": attributes its __init__ sets (a Req has no field list)};
#   "class assigns": {"module.Class": attributes one of its methods sets (not __init__)};
#   "struct fields": {"module.Class": fields of a msgspec Struct}.
TOUCHPOINTS: dict[str, dict[str, tuple[str, ...]]] = {
    "dataclass fields": {
        # capture_stream
        "sglang.srt.distributed.parallel_state.GraphCaptureContext": ("stream",),
        "sglang.srt.managers.schedule_batch.ScheduleBatch": ROUND_FIELDS + (
            "reqs", "req_pool_indices", "sampling_info", "is_extend_in_batch", "prefix_lens",
            "extend_lens", "return_logprob", "has_grammar", "spec_algorithm"),
        "sglang.srt.model_executor.forward_batch_info.ForwardBatch": (
            "forward_mode", "batch_size", "input_ids", "req_pool_indices", "seq_lens",
            "out_cache_loc", "seq_lens_sum", "seq_lens_cpu", "positions", "input_embeds",
            "spec_algorithm", "spec_info", "capture_hidden_mode",
            "global_num_token_non_padded_cpu",
            "extend_prefix_lens", "extend_seq_lens"),  # + cpu/attention.py
        "sglang.srt.model_executor.model_runner.ModelRunnerOutput": (
            "logits_output", "can_run_graph"),
        "sglang.srt.speculative.dflash_info.DFlashVerifyInput": (
            "draft_token", "positions", "draft_token_num", "custom_mask", "capture_hidden_mode"),
        "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo": (
            "top_ks", "is_all_greedy", "acc_additive_penalties", "acc_scaling_penalties",
            "logit_bias", "has_custom_logit_processor", "penalizer_orchestrator"),
        "sglang.srt.layers.vocab_parallel_embedding.VocabParallelEmbeddingShardIndices": (
            "org_vocab_start_index", "org_vocab_end_index"),  # tp.vocab_range
        "sglang.srt.managers.utils.GenerationBatchResult": (
            "logits_output", "next_token_ids", "accept_lens", "can_run_cuda_graph",
            "next_draft_input", "speculative_num_draft_tokens", "new_seq_lens"),
    },
    "keywords": {
        "sglang.srt.speculative.draft_worker_common.build_draft_tp_worker": (
            "server_args", "gpu_id", "nccl_port", "target_model_config", "algo_label"),
        "sglang.srt.speculative.draft_worker_common.make_draft_input_v2": (
            "bonus_tokens", "new_seq_lens"),
        "sglang.srt.speculative.draft_worker_common.make_draft_block_spec_info": (
            "draft_token_num", "device"),
        "sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_func": (
            "req_pool_indices", "req_to_token", "start_offset", "end_offset", "batch_size",
            "draft_token_num", "device"),
        "sglang.srt.layers.logprob_processor.compute_spec_logprobs": ("chain_stride",),
        "sglang.srt.speculative.spec_utils.build_grammar_vocab_mask": (
            "reqs", "tree", "sampling_info", "device", "barrier"),
        "sglang.srt.layers.sampler.apply_custom_logit_processor": ("num_tokens_in_batch",),
        "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation": (
            "batch", "forward_batch", "is_verify", "skip_attn_backend_init",
            "capture_hidden_mode"),
        "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.register": (
            "supports_overlap", "spec_class"),
        # the CUDA graphs: the draft pass, the verify at each captured width
        "sglang.srt.managers.tp_worker.TpModelWorker.init_cuda_graphs": (
            "capture_decode_cuda_graph",),
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner": (
            "attn_backend", "speculative_num_draft_tokens"),
        "sglang.srt.model_executor.model_runner.ModelRunner._get_attention_backend": (
            "init_new_workspace",),
        # integration/draft_model.py
        "sglang.srt.layers.radix_attention.RadixAttention": ("layer_id", "attn_type", "prefix"),
        "sglang.srt.layers.logits_processor.LogitsProcessorOutput": (
            "next_token_logits", "hidden_states"),
        # cpu/linear.py: the wrapped lm_head forward
        "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head": (
            "hidden_states", "lm_head", "embedding_bias", "out"),
    },
    "attributes": {
        "sglang.srt.speculative.dflash_info.DFlashVerifyInput": ("prepare_for_verify",),
        "sglang.srt.managers.schedule_batch.ScheduleBatch": (
            "cumulate_penalty_output_tokens",),
        "sglang.srt.model_executor.forward_batch_info.ForwardMode": (
            "DECODE", "TARGET_VERIFY", "is_idle", "is_decode", "is_target_verify"),
        "sglang.srt.model_executor.forward_batch_info.CaptureHiddenMode": ("FULL", "NULL"),
        "sglang.srt.speculative.spec_utils.GrammarTree": ("from_linear_chain",),
        "sglang.srt.model_executor.cuda_graph_config.Backend": ("DISABLED",),
        "sglang.srt.models.registry.ModelRegistry": ("models",),
        "sglang.srt.plugins.hook_registry.HookRegistry": ("register",),
        "sglang.srt.plugins.hook_registry.HookType": ("BEFORE", "AFTER"),
        "sglang.srt.arg_groups.resolution_hooks": ("register_resolution_hook",
                                                   "_OVERRIDABLE_HOOKS"),
        "sglang.srt.arg_groups.overrides": ("declare_resolution",),
        "sglang.srt.managers.schedule_batch": ("get_request_return_hidden_states_mode",),
        "sglang.srt.managers.overlap_utils": ("FutureMap",),
        "sglang.srt.layers.layernorm": ("_is_cpu_amx_available",),
        "sglang.srt.layers.activation": ("_is_cpu_amx_available",),
        "sglang.srt.speculative.spec_registry": ("CustomSpecAlgo", "get_spec"),
        "sglang.srt.runtime_context._ConfigBag": ("override",),  # get_spec().override
        "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool": (
            "set_kv_buffer", "get_key_buffer", "get_value_buffer"),
        # config.py, metrics.py: what SGLang published for this process
        "sglang.srt.runtime_context": (
            "get_server_args", "get_observability", "get_parallel", "get_serving", "get_exec"),
        # guards.py
        HTTP_SERVER: ("app", "launch_server"),
        # cpu/attention.py
        "sglang.srt.layers.attention.base_attn_backend.AttentionBackend": (
            "init_forward_metadata", "forward_extend", "forward_decode", "support_triton"),
        "sglang.srt.layers.radix_attention.AttentionType": ("ENCODER_ONLY",),
        "sglang.srt.mem_cache.memory_pool.KVWriteLoc": ("for_batch",),
        # cpu/linear.py: the methods it wraps
        "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod": (
            "apply", "process_weights_after_loading"),
        "sglang.srt.layers.quantization.unquant.UnquantizedEmbeddingMethod": (
            "process_weights_after_loading",),
        "sglang.srt.layers.logits_processor.LogitsProcessor": ("_compute_lm_head",),
        # cpu/forward.py: what the lean forward calls
        "sglang.srt.models.llama.LlamaModel": ("forward",),
        "sglang.srt.models.llama.LlamaAttention": ("forward_prepare_native",),
        "sglang.srt.layers.aux_hidden_states.AuxHiddenStateList": ("capture",),
        # attention_workspace_bytes: what each verify runtime's FlashInfer backend allocates
        "sglang.srt.environ.envs": ("SGLANG_FLASHINFER_WORKSPACE_SIZE",),
        "sglang.srt.layers.attention.flashinfer_backend": ("FlashInferAttnBackend",),
        # capture_stream: the context SGLang's graph runners capture in
        "sglang.srt.distributed.parallel_state": ("graph_capture",),
        # tp_verdict_sync: SGLang's own switch (SGLANG_SPEC_TP_SYNC) for broadcasting verdicts
        "sglang.srt.speculative.spec_tp_sync.SpecTpSync": ("enabled", "sync"),
        "sglang.srt.speculative.spec_tp_sync.SpecTpSyncSite": (
            "DFLASH_ACCEPT_GREEDY", "DFLASH_ACCEPT_SAMPLE"),
        # http/access.py
        "sglang.srt.utils.auth.AuthLevel": ("ADMIN_OPTIONAL", "ADMIN_FORCE"),
        # cli/serve.py: `sglang serve` where the `sglang` console script is missing (a command-line
        # string, run in the launched interpreter)
        "sglang.cli.main": ("main",),
    },
    "init assigns": {
        # tp_shard, tp_cpu_group: the TP group's rank, size and CPU group
        "sglang.srt.distributed.parallel_state.GroupCoordinator": (
            "rank_in_group", "world_size", "cpu_group"),
        # tp.vocab_range: the rows of the vocabulary-parallel lm_head this rank holds
        "sglang.srt.layers.vocab_parallel_embedding.VocabParallelEmbedding": ("shard_indices",),
        # verify_graph_runtime: restored around the attention backend's construction
        "sglang.srt.model_executor.model_runner.ModelRunner": ("init_new_workspace",),
        "sglang.srt.managers.schedule_batch.Req": (
            "rid", "origin_input_ids", "output_ids", "sampling_params", "custom_logit_processor"),
        # cpu/attention.py: the layer attributes the backend reads
        "sglang.srt.layers.radix_attention.RadixAttention": (
            "tp_q_head_num", "tp_k_head_num", "tp_v_head_num", "qk_head_dim", "v_head_dim",
            "scaling", "layer_id", "logit_cap", "is_cross_attention", "attn_type"),
        # cpu/forward.py: the modules the lean forward walks
        "sglang.srt.models.llama.LlamaModel": (
            "embed_tokens", "layers", "start_layer", "end_layer", "norm", "pp_group",
            "layers_to_capture"),
        "sglang.srt.models.llama.LlamaDecoderLayer": (
            "self_attn", "mlp", "input_layernorm", "post_attention_layernorm"),
        "sglang.srt.models.llama.LlamaAttention": (
            "qkv_proj", "o_proj", "attn", "rotary_emb", "q_size", "kv_size", "head_dim"),
        "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding": (
            "head_size", "rotary_dim", "is_neox_style", "_apply_rotary_emb_wrapped"),
        "sglang.srt.models.llama.LlamaMLP": (
            "gate_up_proj", "down_proj", "act_fn", "dual_gemm", "activation_quant"),
        # cpu/forward.py: the norm options that keep RMSNorm to the formula the native kernel runs
        "sglang.srt.layers.layernorm.RMSNorm": (
            "weight", "variance_epsilon", "has_weight", "cast_x_before_out_mul", "fp32_residual",
            "override_orig_dtype", "variance_size_override"),
        "sglang.srt.layers.dual_gemm.DualGemm": ("mode",),
        "sglang.srt.layers.quantization.fp8_activation.DenseSiluAndMulQuant": ("enabled",),
        # cpu/linear.py: when SGLang itself would not run the plain lm_head matmul
        "sglang.srt.layers.logits_processor.LogitsProcessor": (
            "use_fp32_lm_head", "rl_on_policy_target"),
    },
    "class assigns": {
        # bound_runtime: the width-1 verify runtime swapped in for a plain round
        "sglang.srt.model_executor.model_runner.ModelRunner": (
            "attn_backend", "decode_cuda_graph_runner",
            "decode_cuda_graph_capture_bs"),  # graph_batch_sizes: what was really captured
        # guards.py (model_config.vocab_size), algorithm.py (server_args)
        "sglang.srt.managers.tokenizer_manager.TokenizerManager": ("model_config", "server_args"),
    },
    "struct fields": {
        "sglang.srt.sampling.sampling_params.SamplingParams": (
            "top_k", "sampling_seed", "frequency_penalty", "presence_penalty",
            "repetition_penalty", "min_new_tokens", "max_new_tokens"),
    },
}


def __getattr__(name: str):
    """The lazy re-exports (LAZY): SGLang's object, imported on first use."""
    module = LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


@contextlib.contextmanager
def batch_round_state(batch, fields: tuple[str, ...] = ROUND_FIELDS) -> Iterator[None]:
    """Save the schedule batch's round fields and restore them on exit (also on error): the
    worker sets them to borrow SGLang's own forward builders for one forward."""
    saved = tuple(getattr(batch, f) for f in fields)
    try:
        yield
    finally:
        for name, value in zip(fields, saved):
            setattr(batch, name, value)


@contextlib.contextmanager
def host_lens_grown(batch, width: int) -> Iterator[None]:
    """The batch's host lengths (`seq_lens_cpu`, `seq_lens_sum`) raised by `width` tokens per
    request while SGLang builds a verify batch (its host bound: committed prefix + one block),
    restored after; nothing to do without a host copy."""
    saved = batch.seq_lens_cpu, batch.seq_lens_sum
    if batch.seq_lens_cpu is not None:
        batch.seq_lens_cpu = batch.seq_lens_cpu + width
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    try:
        yield
    finally:
        batch.seq_lens_cpu, batch.seq_lens_sum = saved


def decode_graph_batch_sizes(device) -> tuple[int, ...]:
    """The batch sizes SGLang captures decode CUDA graphs for, smallest first; () where it
    captures none (not CUDA, `--disable-cuda-graph`, or its graph backend off)."""
    import torch

    if torch.device(device).type != "cuda":
        return ()
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec

    decode = get_exec().graph.cuda_graph_config.decode
    return () if decode.backend == Backend.DISABLED else tuple(sorted(decode.bs))


def rmsnorm_uses_amx() -> bool:
    """Whether SGLang's RMSNorm and SiluAndMul run sgl-kernel's AMX ops on this CPU instead of
    their forward_native."""
    from sglang.srt.layers import activation, layernorm

    return bool(layernorm._is_cpu_amx_available or activation._is_cpu_amx_available)


def tp_shard():
    """This process's model/shard.py Shard of the TP group (rank, size, SGLang's all-reduce), or
    None at TP size 1."""
    from domino_sglang.model.shard import Shard

    group = get_tp_group()
    if group.world_size == 1:
        return None
    return Shard(group.rank_in_group, group.world_size, tensor_model_parallel_all_reduce)


def tp_all_gather(x):
    """SGLang's all-gather over the TP group along the last dimension."""
    return tensor_model_parallel_all_gather(x, dim=-1)


@contextlib.contextmanager
def capture_stream(capture: bool):
    """With `capture`: inside SGLang's graph_capture() context (its TP group's capturable
    communicators on, its capture stream current), yielding that stream, as SGLang's own graph
    runners capture; else nothing entered, None. UNVERIFIED on a GPU (no GPU so far)."""
    if not capture:
        yield None
        return
    from sglang.srt.distributed.parallel_state import graph_capture

    with graph_capture() as context:
        yield context.stream


def tp_cpu_group():
    """The TP group's CPU (gloo) process group, for host-side agreements between ranks
    (spec/tp.py group_minimum, as SGLang's get_available_gpu_memory(distributed=True) uses
    it), or None at TP size 1."""
    group = get_tp_group()
    return None if group.world_size == 1 else group.cpu_group


def tp_verdict_sync():
    """`sync(values, sampled) -> values`: rank 0's verdict on every rank, broadcast over the TP
    group where SGLang's own switch for its DFLASH worker asks it (SGLANG_SPEC_TP_SYNC, by
    default every site: its `dflash-accept-greedy` / `dflash-accept-sample` sites govern
    DOMINO's greedy / sampled verdicts), or None at TP size 1."""
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync, SpecTpSyncSite

    group = get_tp_group()
    if group.world_size == 1:
        return None
    sync = SpecTpSync(group)
    sites = {False: SpecTpSyncSite.DFLASH_ACCEPT_GREEDY, True: SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE}
    if not any(sync.enabled(site) for site in sites.values()):
        return None

    def verdict(values, sampled: bool):
        return sync.sync(sites[sampled], values)
    return verdict


def graph_batch_sizes(model_runner, captured: tuple[int, ...], buckets: tuple[int, ...]
                      ) -> tuple[int, ...]:
    """The batch sizes the draft side's static buffers are built for: the ones SGLang captured
    its target decode graphs for (`decode_cuda_graph_capture_bs`, what its graph runner really
    captured: the configured sizes clamped to the request pool), or, where it captured none
    (`captured` empty: the CPU's GPU-shaped mode), the sizes it would capture, computed as it
    computes them (its default list `buckets`, graphs.BUCKETS, clamped to the request pool)."""
    real = tuple(sorted(getattr(model_runner, "decode_cuda_graph_capture_bs", None) or ()))
    if real or captured:
        return real or tuple(captured)
    pool = int(model_runner.req_to_token_pool.size)
    return tuple(b for b in buckets if b < pool) + (pool,) if pool <= buckets[-1] else buckets


def free_device_memory(device) -> int | None:
    """Free bytes on a CUDA device (torch.cuda.mem_get_info), None elsewhere."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(torch.device(device))[0])


def attention_workspace_bytes(model_runner) -> int:
    """The attention workspace each verify runtime allocates for itself (verify_graph_runtime:
    init_new_workspace), read as the target's backend sized it: FlashInfer's
    SGLANG_FLASHINFER_WORKSPACE_SIZE (raised for Qwen models when the backend was built); 0
    for other backends, whose workspace SGLang does not expose."""
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    backend = getattr(model_runner, "attn_backend", None)
    if not isinstance(backend, FlashInferAttnBackend):
        return 0
    return int(envs.SGLANG_FLASHINFER_WORKSPACE_SIZE.get())


def verify_graph_runtime(model_runner, width: int) -> tuple:
    """A second target runtime whose CUDA graphs verify `width` tokens per request: (attention
    backend with its own workspace, SGLang's DecodeCudaGraphRunner captured for TARGET_VERIFY at
    that width), both built with the speculative width overridden to `width` (backends such as
    FA3 read it once, at construction), as SGLang's UNO and adaptive EAGLE workers build theirs.
    UNVERIFIED on a GPU (no GPU so far)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    saved = model_runner.init_new_workspace
    try:
        with get_spec().override(speculative_num_draft_tokens=width):
            backend = model_runner._get_attention_backend(init_new_workspace=True)
            runner = DecodeCudaGraphRunner(model_runner, attn_backend=backend,
                                           speculative_num_draft_tokens=width)
    finally:
        model_runner.init_new_workspace = saved
    return backend, runner


@contextlib.contextmanager
def bound_runtime(model_runner, runtime: tuple | None) -> Iterator[None]:
    """The model runner's attention backend and decode graph runner swapped for `runtime`'s
    (verify_graph_runtime) while a forward is built and run, restored after (SGLang's UNO
    worker binds its draft runtime the same way); None: the runner's own."""
    if runtime is None:
        yield
        return
    saved = model_runner.attn_backend, model_runner.decode_cuda_graph_runner
    model_runner.attn_backend, model_runner.decode_cuda_graph_runner = runtime
    try:
        yield
    finally:
        model_runner.attn_backend, model_runner.decode_cuda_graph_runner = saved


def register_draft_architecture(architecture: str, model_class: type) -> None:
    """Resolve `architecture` (a draft config's `architectures[0]`) to `model_class` in this
    process's model registry."""
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.models[architecture] = model_class


def custom_spec_algo_base() -> type:
    """SGLang's base class of a plugin speculative algorithm's capabilities."""
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    return CustomSpecAlgo


def future_map(*args):
    """SGLang's FutureMap (the scheduler's per-request futures), built from `args` as is."""
    from sglang.srt.managers.overlap_utils import FutureMap

    return FutureMap(*args)


def register_spec_algorithm(name: str, spec_class: type, factory) -> None:
    """Register a speculative algorithm (no overlap scheduling) unless one of that name is."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec as registered

    if registered(name) is None:
        SpeculativeAlgorithm.register(name, supports_overlap=False, spec_class=spec_class)(factory)


def register_hooks(functions: dict) -> None:
    """Register each function of `functions` (role -> callable, roles of HOOKS) on its target."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for role, fn in functions.items():
        target, when = HOOKS[role]
        HookRegistry.register(target, fn, getattr(HookType, when))


def declare_resolution(server_args, source: str, **fields) -> None:
    """Decide server-argument fields inside SGLang's resolution pipeline (the record keeps the
    operator's input; the decision carries `source`)."""
    from sglang.srt.arg_groups.overrides import declare_resolution as declare

    declare(server_args, source, **fields)


def register_resolution_steps(functions: dict) -> None:
    """Wrap each step of RESOLUTION_STEPS named by `functions` (role -> fn(server_args, step))
    in SGLang's resolution pipeline."""
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    for role, fn in functions.items():
        register_resolution_hook(RESOLUTION_STEPS[role])(fn)


def wants_hidden_states(return_hidden_states) -> bool:
    """Whether a request's `return_hidden_states` value asks for hidden states (SGLang's own
    reading of it)."""
    from sglang.srt.managers.schedule_batch import get_request_return_hidden_states_mode

    return get_request_return_hidden_states_mode(return_hidden_states) != CaptureHiddenMode.NULL


def loaded_http_server():
    """SGLang's HTTP server module if this process has imported it (the launcher, before
    plugins load), else None; never imported here."""
    return sys.modules.get(HTTP_SERVER)

"""The DOMINO speculative algorithm as SGLang sees it: capabilities, server-argument resolution.

Registered through `SpeculativeAlgorithm.register("DOMINO", spec_class=DominoSpec)`, so
`--speculative-algorithm DOMINO` works on the stock server. `DominoSpec` fills the 0.5.23 gap of
`CustomSpecAlgo` (methods the scheduler calls unconditionally) and resolves its own defaults,
each logged once at start-up.

Impersonation, in this one place: `is_dflash_family()` returns True. SGLang keys the plumbing a
parallel block drafter needs on that predicate rather than on capabilities: capture of the target
layers named by the draft config (`spec_aux_hidden_state.py`), draft KV-pool sizing
(`kv_cache_configurator.py`, `pool_configurator.py`), verify-slot reservation through
`DFlashDraftInputV2.prepare_for_decode` (`spec_utils.py`) and the per-request checks. `is_dflash()`
stays False, so SGLang's own DFLASH worker and argument handler are never used.
"""

from __future__ import annotations

import logging

from domino_sglang.spec import options
from domino_sglang.spec.options import NAME, POOL_FLAG, POOL_FLAG_DEFAULT

logger = logging.getLogger(__name__)

MAX_RUNNING_DEFAULT = 48
CPU_BACKEND = "domino_cpu"
# `DFlashDraftInputV2.prepare_for_decode` keeps committed + 2 x block KV slots allocated for every
# running request (the verify block plus SGLang's double-buffer), so each needs this many slots
# beyond its own tokens.
RESERVED_BLOCKS = 2


class DominoArgsError(ValueError):
    """An invalid DOMINO server configuration (one line, names the flag)."""


def _spec_class():
    import torch

    from domino_sglang import sglang_compat

    class DominoSpec(sglang_compat.custom_spec_algo_base()):
        # -- capabilities (see module docstring for the one impersonation) --
        def is_dflash_family(self) -> bool:
            return True

        def supports_target_verify_for_draft(self) -> bool:
            return True  # the drafter's block forward runs in TARGET_VERIFY mode

        def supports_prefill_shared_read_done(self) -> bool:
            return True

        def need_topk(self) -> bool:
            return False  # a single chain, no tree

        def carries_draft_hidden_states(self) -> bool:
            return False

        def get_platform_worker_cls(self):
            return None

        def create_future_map(self, device: torch.device, req_to_token_pool,
                              needs_cpu_seq_lens: bool = True,
                              needs_confidence_relay: bool = False):
            return sglang_compat.future_map(device, self, req_to_token_pool,
                                            needs_cpu_seq_lens, needs_confidence_relay)

        def handle_server_args(self, server_args) -> None:
            resolve_server_args(server_args)

    return DominoSpec


def _local_drafter(server_args, path: str) -> str:
    """The drafter's folder: a hub id (`org/name`) becomes its local snapshot, downloaded
    unless HF_HUB_OFFLINE is set, as `domino-sglang serve --drafter` resolves it (hub.py)."""
    from domino_sglang.model import hub

    if not hub.is_hub_id(path):
        return path
    try:
        local = str(hub.resolve_folder(path, "--speculative-draft-model-path",
                                       allow_patterns=hub.DRAFTER_FILES))
    except hub.HubError as exc:
        raise DominoArgsError(str(exc)) from exc
    _set(server_args, "speculative_draft_model_path", local, f"the local snapshot of {path}")
    return local


def _set(server_args, field: str, value, why: str) -> None:
    old = getattr(server_args, field, None)
    if old != value:
        setattr(server_args, field, value)
        logger.info("DOMINO sets %s=%r (was %r): %s", field, value, old, why)


def check_tensor_parallel(conf, tp_size: int) -> None:
    """At --tp-size N the drafter's layers are split over the ranks as the target's are
    (tp.py): its heads, KV heads and MLP rows must divide by N."""
    for field in ("num_heads", "num_kv_heads", "intermediate_size"):
        n = getattr(conf, field)
        if n % tp_size:
            raise DominoArgsError(f"--tp-size {tp_size} does not divide the drafter's {field} "
                                  f"({n}): its layers are split over the tensor-parallel ranks")


def resolve_server_args(server_args) -> None:
    """Validate and complete the server arguments for DOMINO (steps=1, topk=1, B from config)."""
    from domino_sglang.model.config import DrafterConfigError, load_draft_config

    path = server_args.speculative_draft_model_path
    if not path:
        raise DominoArgsError("DOMINO needs --speculative-draft-model-path (a Domino drafter)")
    path = _local_drafter(server_args, str(path))
    if int(getattr(server_args, "pp_size", 1) or 1) != 1:
        raise DominoArgsError("DOMINO does not support pipeline parallelism (--pp-size must be "
                              "1): the drafter reads target layers that stages would split")
    if getattr(server_args, "enable_dp_attention", False):
        raise DominoArgsError("DOMINO does not support --enable-dp-attention: its ranks run "
                              "different batches, while the drafter's layers and round times "
                              "are shared over the whole TP group")
    if getattr(server_args, "enable_mixed_chunk", False):
        raise DominoArgsError("DOMINO rounds do not mix prefill chunks into decode batches: drop "
                              "--enable-mixed-chunk (SGLang refuses it for custom speculative "
                              "algorithms)")
    if getattr(server_args, "enable_watermark", False):
        raise DominoArgsError("DOMINO does not apply SGLang's watermark to its verify rounds: "
                              "drop --enable-watermark")
    if getattr(server_args, "enable_deterministic_inference", False):
        raise DominoArgsError("DOMINO does not support --enable-deterministic-inference: a "
                              "sampled request without a sampling_seed draws a fresh seed every "
                              "round (give requests a sampling_seed to make them reproducible)")
    topk = server_args.speculative_eagle_topk
    if topk is not None and int(topk) != 1:
        raise DominoArgsError(f"DOMINO verifies a single chain: --speculative-eagle-topk must be "
                              f"1, got {topk}")
    pool = getattr(server_args, "speculative_domino_candidate_pool_size", POOL_FLAG_DEFAULT)
    if pool is not None and int(pool) < 0:
        raise DominoArgsError(f"{POOL_FLAG} must be an integer >= 0 (0 = full vocabulary), "
                              f"got {pool}")
    flag_block = server_args.speculative_num_draft_tokens
    try:
        conf = load_draft_config(path, int(flag_block) if flag_block is not None else None,
                                 tokenizer_path=getattr(server_args, "tokenizer_path", None)
                                 or getattr(server_args, "model_path", None))
    except DrafterConfigError as exc:
        raise DominoArgsError(str(exc)) from exc
    check_tensor_parallel(conf, int(getattr(server_args, "tp_size", 1) or 1))
    try:  # the serving options (options.py), refused here, before any process is spawned
        config = options.for_server(server_args, conf, conf.block_size)
        if config.token_map is not None:
            from domino_sglang.model.vocab import load_draft_vocab_file

            load_draft_vocab_file(config.token_map, conf.vocab_size)
    except (options.DominoOptionError, DrafterConfigError) as exc:
        raise DominoArgsError(str(exc)) from exc
    logger.info("%s", config.line())
    _set(server_args, "speculative_num_steps", 1, "one parallel draft pass per round")
    _set(server_args, "speculative_eagle_topk", 1, "chain verification")
    _set(server_args, "speculative_num_draft_tokens", conf.block_size,
         "block size " + ("from the flag" if flag_block is not None else "from the draft config"))
    if server_args.max_running_requests is None:
        _set(server_args, "max_running_requests", MAX_RUNNING_DEFAULT,
             "running-request default with speculation (override with --max-running-requests)")
        pool = getattr(server_args, "max_total_tokens", None)
        if pool is not None and pool_capacity(pool, conf.block_size) < MAX_RUNNING_DEFAULT:
            _set(server_args, "max_running_requests", max(1, pool_capacity(pool, conf.block_size)),
                 f"the {pool}-token KV pool holds the verify reservations of no more")
    check_pool_fits(getattr(server_args, "max_total_tokens", None),
                    int(server_args.max_running_requests), conf.block_size)
    if not server_args.disable_overlap_schedule:
        _set(server_args, "disable_overlap_schedule", True,
             "the DOMINO worker runs each round synchronously (no overlap scheduling yet)")
    device = str(server_args.device or "cuda")
    if device == "cpu":
        if server_args.speculative_draft_attention_backend is None:
            _set(server_args, "speculative_draft_attention_backend", CPU_BACKEND,
                 "the drafter's non-causal block needs a verify-capable CPU backend")
    else:
        for flag in ("attention_backend", "decode_attention_backend",
                     "prefill_attention_backend"):
            backend = getattr(server_args, flag, None)
            if backend in FIXED_WIDTH_BACKENDS:
                raise DominoArgsError(
                    f"DOMINO: --{flag.replace('_', '-')} {backend} builds every verify for "
                    f"the full block, but DOMINO verifies 1..B tokens per round; use "
                    f"flashinfer (the default) or triton")
        if server_args.attention_backend is None:  # resolved outside SGLang's pipeline
            _set(server_args, "attention_backend", "flashinfer", VERIFY_WHY)
        if server_args.speculative_draft_attention_backend is None:
            _set(server_args, "speculative_draft_attention_backend",
                 server_args.attention_backend, "the drafter runs on the target's attention "
                 "backend")


def default_verify_backend(server_args, step) -> None:
    """Around SGLang's attention-backend resolution step (`step`, which fills the platform's
    default: fa3 on Hopper with CUDA >= 12.3, trtllm_mha on SM100): a DOMINO server on CUDA
    that names no backend is given flashinfer before that default is filled, so everything
    SGLang derives from the backend afterwards (page size, graph settings) sees flashinfer. A
    backend the user named is kept, and refused by resolve_server_args if it cannot verify
    1..B tokens."""
    from domino_sglang import sglang_compat

    backend = verify_backend_default(server_args)
    if backend is not None:
        sglang_compat.declare_resolution(server_args, "DOMINO", attention_backend=backend)
        logger.info("DOMINO sets attention_backend=%r (was None): %s", backend, VERIFY_WHY)
    step(server_args)


VERIFY_WHY = ("its verify reads the round's width (SGLang's Hopper and Blackwell defaults, fa3 "
              "and trtllm_mha, build every verify for the full block)")


def verify_backend_default(server_args) -> str | None:
    """The target attention backend DOMINO gives a CUDA server that names none, else None."""
    named = any(getattr(server_args, f, None) is not None for f in
                ("attention_backend", "decode_attention_backend", "prefill_attention_backend"))
    domino = str(getattr(server_args, "speculative_algorithm", None) or "").upper() == NAME
    on_cpu = str(getattr(server_args, "device", None) or "cuda") == "cpu"
    return "flashinfer" if domino and not on_cpu and not named else None


# CUDA attention backends whose TARGET_VERIFY metadata uses the configured block size, not the
# round's width (flashattention_backend.py and trtllm_mha_backend.py of SGLang 0.5.23 read
# speculative_num_draft_tokens at construction): a round verifying L < B tokens would be wrong
FIXED_WIDTH_BACKENDS = ("fa3", "trtllm_mha")


def pool_capacity(pool_tokens: int, block_size: int) -> int:
    """Running requests whose reservations (RESERVED_BLOCKS blocks + one token each) fit a pool."""
    return pool_tokens // (RESERVED_BLOCKS * block_size + 1)


def check_pool_fits(pool_tokens: int | None, max_running: int, block_size: int) -> None:
    """Refuse a KV pool (`--max-total-tokens`) too small for `max_running` running requests'
    verify reservations. An unknown pool (None: sized from free memory) is not checked."""
    if pool_tokens is None:
        return
    per_request = RESERVED_BLOCKS * block_size + 1
    if pool_tokens < per_request * max_running:
        fits = pool_capacity(pool_tokens, block_size)
        lower = (f"lower --max-running-requests to {fits}" if fits
                 else "lower --speculative-num-draft-tokens")
        raise DominoArgsError(
            f"DOMINO: --max-total-tokens {pool_tokens} cannot hold the verify reservations of "
            f"--max-running-requests {max_running} ({per_request} KV slots each: "
            f"{RESERVED_BLOCKS} x block size {block_size} + 1 token); raise --max-total-tokens "
            f"to >= {per_request * max_running} or {lower}")


def max_output_tokens(n_input: int, block_size: int, pool_tokens: int, page_size: int,
                      row_tokens: int) -> int:
    """Most output tokens a request of `n_input` prompt tokens may get under DOMINO: SGLang's
    room (the pool less a page and one token, at most a request->token row) less the
    reservation of RESERVED_BLOCKS blocks."""
    room = min(pool_tokens - page_size - 1, row_tokens)
    return max(0, room - RESERVED_BLOCKS * block_size - n_input)


def clip_max_new_tokens(_result, scheduler, req) -> None:
    """AFTER hook of `Scheduler.init_req_max_new_tokens`: leave room for the reservations.

    SGLang clips a request's output so that prompt + output fits the KV pool and the
    request->token row. A DOMINO request needs RESERVED_BLOCKS blocks more at every round; without
    this clip, a request that grows to the pool's size is aborted with a 500 ("Out of memory even
    after retracting all other requests") after generating all but its last few tokens. With it,
    such a request ends `length` 2 x block tokens earlier than without speculation."""
    from domino_sglang.sglang_compat import get_spec

    spec = get_spec()
    if str(spec.speculative_algorithm).upper() != NAME:
        return
    params = req.sampling_params
    try:  # an exception here would kill the scheduler: never raise from a hook
        cap = max_output_tokens(len(req.origin_input_ids), int(spec.speculative_num_draft_tokens),
                                scheduler.max_total_num_tokens, scheduler.page_size,
                                scheduler.req_to_token_pool.max_context_len)
    except Exception:
        logger.exception("DOMINO: could not clip max_new_tokens to the pool")
        return
    if params.max_new_tokens is not None and params.max_new_tokens > cap:
        params.max_new_tokens = cap
        params.min_new_tokens = min(params.min_new_tokens, cap)


_registered = False


def register_algorithm() -> None:
    """Register DOMINO with SGLang's speculative registry (idempotent)."""
    global _registered
    if _registered:
        return
    from domino_sglang import sglang_compat

    def factory(server_args):
        from domino_sglang.integration.worker import DominoWorker

        return DominoWorker

    sglang_compat.register_spec_algorithm(NAME, _spec_class(), factory)
    sglang_compat.register_resolution_steps({"default_verify_backend": default_verify_backend})
    sglang_compat.register_hooks({"clip_max_new_tokens": clip_max_new_tokens,
                                  "cumulate_penalties": cumulate_penalties,
                                  "refuse_unsupported_outputs": refuse_unsupported_outputs})
    _registered = True


# Per-request outputs the DOMINO worker does not produce, refused up front (a 400 naming the
# field) rather than answered wrongly: SGLang would abort a sampling-mask request with a 500
# after its first token, and return no hidden states without a word.
UNSUPPORTED_OUTPUTS = {
    "return_sampling_mask": "DOMINO does not capture the sampling support of its verify rounds",
    "return_hidden_states": "DOMINO's rounds return the drafter's features, not the model's",
}


def refuse_unsupported_outputs(tokenizer_manager, obj, input_ids) -> None:
    """BEFORE hook of `TokenizerManager._validate_one_request` (one request) under DOMINO."""
    algorithm = getattr(tokenizer_manager.server_args, "speculative_algorithm", None)
    if str(algorithm or "").upper() != NAME:
        return
    from domino_sglang.sglang_compat import wants_hidden_states

    mask = getattr(obj, "return_sampling_mask", None)
    asked = {
        "return_sampling_mask": mask is True or (isinstance(mask, list) and any(mask)),
        "return_hidden_states": wants_hidden_states(getattr(obj, "return_hidden_states", False)),
    }
    for field, why in UNSUPPORTED_OUTPUTS.items():
        if asked[field]:
            raise ValueError(f"{field} is not supported with --speculative-algorithm DOMINO: "
                             f"{why}")


def cumulate_penalties(batch) -> None:
    """BEFORE hook of `spec_prepare_for_decode`: feed each request's last committed token to the
    batch's penalizers (frequency / presence / repetition penalties, min_new_tokens).

    Plain decoding does this in `ScheduleBatch.prepare_for_decode`, EAGLE in its own prepare;
    SGLang's DFLASH-family path does not, and the worker cannot: it runs on a forward-only copy
    of the sampling info (`copy_for_forward`: orchestrator None, penalties pre-accumulated into
    `acc_additive_penalties` / `acc_scaling_penalties` right after this point). A penalized
    request commits one token per round (planner.one_token_flags), so `output_ids[-1]` is exactly
    the token plain decoding would feed here; for the others the penalizers hold zeros."""
    if getattr(batch.spec_algorithm, "name", None) != NAME:
        return
    orchestrator = batch.sampling_info.penalizer_orchestrator
    if orchestrator is not None and orchestrator.is_required:
        batch.cumulate_penalty_output_tokens()

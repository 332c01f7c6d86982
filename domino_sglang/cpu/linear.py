"""Packed weights for SGLang's unquantized linear layers and lm_head on CPU: oneDNN's blocked
layout, or for bf16 weights the native few-row kernel (native.c) where it runs.

On the CPU engine SGLang 0.5.23 runs every dense projection as `F.linear` / `torch.matmul`,
i.e. MKL, unless the CPU build of sgl-kernel (Intel AMX only) is installed. On these AMD
machines MKL runs a small-M GEMM as one GEMV per row, so a 16-token verify pays several times
one token's cost in the MLP and the lm_head, and its rows differ from the same rows computed
alone. oneDNN with the weight reordered once into its blocked layout (the layout PyTorch's own
inductor uses for CPU linears) is faster at every M and, over K = 576, row-invariant (the
microbenchmark, F.linear against the packed weight: docs/cpu-runtime.md, `linear.py`).

Row-invariance (a row's output does not depend on the other rows of the call) means those
projections give the verify pass exactly the numbers a plain decode step gets. Not all: the
MLP's down projection (K = 1536) computes a row alone (M = 1) in other bits than the same row
among others (M >= 2), fp32 and bf16 alike, so a verify's MLP output can
differ from a plain step's in the last bits; the fp32 exactness tests hold on real prompts
(a flipped argmax needs a near-tie).

bf16 weights go to the native linear kernel (native.c) where it builds and the CPU has
AVX512-BF16: it streams the weights faster than oneDNN's bf16 kernel at every row count measured,
most at one row (benchmarks/studies/linear_rows.py), and every row is row-invariant, the down
projection included. Elsewhere, and for fp32, oneDNN as above.

How it plugs in (SGLang internals, all in `install()`, imported through sglang_compat.py):
`UnquantizedLinearMethod` and `UnquantizedEmbeddingMethod.process_weights_after_loading` (called
after the first load and after every weight update, the hook SGLang's own AMX packing uses) pack
a linear's weight onto the layer and drop an embedding's pack (it is re-made when the embedding
next serves as the lm_head); `UnquantizedLinearMethod.apply` and
`LogitsProcessor._compute_lm_head` use the pack when the input is a CPU tensor of the weight's
dtype; `pack_linears` does the same for the plain nn.Linear layers of the drafter's backbone.
The dense weight stays (embedding lookups, the drafter's shared lm_head and tests read it), so
packed layers hold their weights twice. Off with DOMINO_SGLANG_NO_ONEDNN_LINEAR=1; never active
on GPU.
"""

from __future__ import annotations

import logging

import torch

from domino_sglang.cpu import native
from domino_sglang.cpu.bootstrap import env_switch

logger = logging.getLogger(__name__)

DISABLE_ENV = "DOMINO_SGLANG_NO_ONEDNN_LINEAR"
PACKED_ATTR = "domino_onednn_weight"
# oneDNN picks its blocked layout for this batch size; any M works with the packed weight.
PACK_BATCH_HINT = 16
_installed = False


def supported(weight: torch.Tensor) -> bool:
    """True when oneDNN can run a packed linear over this weight here."""
    if weight.device.type != "cpu" or weight.dim() != 2 or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.float32:
        return True
    return weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack(weight: torch.Tensor) -> torch.Tensor | native.Packed | None:
    """The weight [N, K] packed for `packed_linear`: a bf16 weight in the bf16 kernel's layout
    where that kernel runs here (native.py), else reordered into oneDNN's blocked layout (an
    opaque tensor); None where neither can serve it."""
    packed = native.pack(weight) if weight.dtype == torch.bfloat16 else None
    return packed if packed is not None else onednn_pack(weight)


def onednn_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight [N, K] reordered into oneDNN's blocked layout (an opaque tensor), or None."""
    if not supported(weight):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)


# oneDNN's bf16 kernel for a 2-row input streams the weight slower than the one for 3-6 rows, so
# 2 rows run as 4 (the measurement: benchmarks/studies/linear_rows.py, docs/results/linear_rows.md);
# 1 row gains nothing from it. Two rows are a plain step at bs 2 and a 2-token verify (or
# draft) at bs 1.
PADDED_ROWS = {2: 4}  # bf16 inputs of this many rows run as that many (their rows repeated)


def packed_linear(x: torch.Tensor, packed: torch.Tensor | native.Packed,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias) -> [..., N], W given by `pack(W)`; on oneDNN a bf16 input of 2
    rows runs as 4, its rows twice, the copies dropped from the output (PADDED_ROWS)."""
    if isinstance(packed, native.Packed):
        return native.linear(x, packed, bias)
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    padded = PADDED_ROWS.get(rows) if x.dtype == torch.bfloat16 else None
    if padded is None:
        return _onednn_linear(x, packed, bias)
    flat = x.reshape(rows, width)
    out = _onednn_linear(torch.cat([flat] * (padded // rows)), packed, bias)  # [padded, N]
    return out[:rows].reshape(*x.shape[:-1], out.shape[-1])


def _onednn_linear(x: torch.Tensor, packed: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def refresh(layer: torch.nn.Module) -> None:
    """(Re)pack `layer.weight` onto the layer, or drop a stale pack if it cannot be packed."""
    weight = getattr(layer, "weight", None)
    packed = pack(weight) if isinstance(weight, torch.Tensor) else None
    setattr(layer, PACKED_ATTR, packed)


def forget(layer: torch.nn.Module) -> None:
    """Drop the layer's pack (re-made on next use)."""
    layer.__dict__.pop(PACKED_ATTR, None)


def packed_for(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The layer's packed weight if it can serve input x, else None (the caller's own path)."""
    packed = getattr(layer, PACKED_ATTR, None)
    if packed is None or x.device.type != "cpu" or x.dtype != layer.weight.dtype:
        return None
    return packed


class PackedLinear(torch.nn.Linear):
    """An nn.Linear that runs on its packed weight where it can (`pack_linears`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = packed_for(self, x)
        if packed is None:
            return super().forward(x)
        return packed_linear(x, packed, self.bias)


def pack_linears(module: torch.nn.Module) -> int:
    """Pack every plain nn.Linear in `module` (itself included) in place: each becomes a
    PackedLinear (same parameters, same state dict) holding the pack of its current weight.
    For our own modules (the drafter's backbone), which SGLang's linear methods do not run.
    Returns how many were packed; a weight changed later needs `refresh(layer)`."""
    count = 0
    for layer in module.modules():
        packed = pack(layer.weight) if type(layer) is torch.nn.Linear else None
        if packed is not None:
            layer.__class__ = PackedLinear
            setattr(layer, PACKED_ATTR, packed)
            count += 1
    return count


def is_active() -> bool:
    """True once install() has routed SGLang's linears here (in this process)."""
    return _installed


def should_install() -> bool:
    return (env_switch("SGLANG_USE_CPU_ENGINE") and not env_switch(DISABLE_ENV)
            and torch.backends.mkldnn.is_available())


def install() -> bool:
    """Route SGLang's CPU linears through packed oneDNN weights (idempotent). True if active."""
    global _installed
    if _installed:
        return True
    if not should_install():
        return False
    from domino_sglang.sglang_compat import (
        LogitsProcessor,
        UnquantizedEmbeddingMethod,
        UnquantizedLinearMethod,
    )

    # linears are packed at load; an embedding only when it first serves as the lm_head (an
    # untied input embedding never does), and a weight update drops its pack
    _wrap_postprocess(UnquantizedLinearMethod, refresh)
    _wrap_postprocess(UnquantizedEmbeddingMethod, forget)

    dense_apply = UnquantizedLinearMethod.apply

    def apply(self, layer, x, bias=None):
        packed = packed_for(layer, x)
        if packed is None:
            return dense_apply(self, layer, x, bias)
        return packed_linear(x, packed, bias)

    UnquantizedLinearMethod.apply = apply

    dense_lm_head = LogitsProcessor._compute_lm_head

    def compute_lm_head(self, hidden_states, lm_head, embedding_bias=None, *, out=None):
        # only where SGLang itself would run the plain matmul (no LoRA, bias, fp32 or RL cast)
        if PACKED_ATTR not in lm_head.__dict__ and hasattr(lm_head, "weight"):
            refresh(lm_head)
        packed = packed_for(lm_head, hidden_states)
        if (packed is None or embedding_bias is not None or self.use_fp32_lm_head
                or self.rl_on_policy_target is not None or hasattr(lm_head, "set_lora")):
            return dense_lm_head(self, hidden_states, lm_head, embedding_bias, out=out)
        return packed_linear(hidden_states, packed)

    LogitsProcessor._compute_lm_head = compute_lm_head
    _installed = True
    logger.info("CPU linears and lm_head run on packed oneDNN weights (%s=1 to disable)",
                DISABLE_ENV)
    return True


def _wrap_postprocess(method: type, then) -> None:
    original = method.process_weights_after_loading

    def process_weights_after_loading(self, layer):
        original(self, layer)
        then(layer)

    method.process_weights_after_loading = process_weights_after_loading

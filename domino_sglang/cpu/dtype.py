"""The CPU server's default model dtype: bfloat16 only where the CPU has native bf16 matmuls.

Without AVX512-BF16 / AMX (e.g. AMD Zen 3 or older Intel, AVX2 only) oneDNN emulates bf16, and a
bf16 linear's cost grows with the token count as if it were a matrix-vector product per token:
SmolLM2's 576x1536 MLP projection, 1 thread, AMD EPYC Zen 3 (2026-11-23): 16 tokens 2.90 ms in
bf16 vs 0.50 ms in fp32 (1 token: 0.19 vs 0.10 ms). Multi-token verification in bf16 then costs
~16 plain decode steps and speculation cannot pay; fp32 is faster there at every batch size.
"""

from __future__ import annotations

import torch


def native_bf16() -> bool:
    """Whether oneDNN has native bf16 kernels on this CPU (AVX512-BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def default_cpu_dtype() -> str:
    """`bfloat16` on CPUs with native bf16 matmuls, `float32` elsewhere."""
    return "bfloat16" if native_bf16() else "float32"

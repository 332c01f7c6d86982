"""The CPU server's default model dtype: bfloat16 only where the CPU has native bf16 matmuls.

Without AVX512-BF16 / AMX (e.g. AMD Zen 3 or older Intel, AVX2 only) oneDNN emulates bf16, and a
bf16 linear's cost grows with the token count as if it were a matrix-vector product per token:
so multi-token verification in bf16 costs about as many plain decode steps as it has tokens
and speculation cannot pay; fp32 is faster there at every batch size (docs/cpu-runtime.md).
"""

from __future__ import annotations

import torch


def native_bf16() -> bool:
    """Whether oneDNN has native bf16 kernels on this CPU (AVX512-BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def default_cpu_dtype() -> str:
    """`bfloat16` on CPUs with native bf16 matmuls, `float32` elsewhere."""
    return "bfloat16" if native_bf16() else "float32"

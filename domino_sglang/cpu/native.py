"""The CPU runtime's native bf16 kernels (native.c): built on first use with the machine's C
compiler, loaded beside torch's OpenMP runtime; the linears' packed weights, the residual add
with RMS norm, the rotary embedding, SiLU-and-mul, attention.

Built once per source into `paths.home()/kernels` (a file named by the source's and the flags'
hash, written under a temporary name and renamed, so ranks building at once do not collide).
Unavailable, with the reason logged once, where there is no C compiler, the compiler lacks
AVX512-BF16, the CPU lacks it, or DOMINO_SGLANG_NO_NATIVE_KERNELS=1; bf16 linears then stay on
oneDNN (cpu/linear.py) and the norms and rotary on SGLang's modules (cpu/forward.py).
The library links libgomp, which resolves to the copy torch has already loaded, so its parallel
loops run on torch's threads and follow torch.set_num_threads.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from domino_sglang import paths
from domino_sglang.cpu.bootstrap import env_switch

logger = logging.getLogger(__name__)

DISABLE_ENV = "DOMINO_SGLANG_NO_NATIVE_KERNELS"
SOURCE = Path(__file__).with_name("native.c")
# -ffp-contract=off: a product and a sum round as torch's separate ops do (no fused multiply-add)
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp",
         "-ffp-contract=off", "-shared", "-fPIC"]
BLOCK = 32  # output features per packed block (native.c)
# requests of up to this many queries attend here (decode steps and verifies: a query costs about
# as much alone as among others, so the batched matmuls of a long prefill are faster)
ATTEND_MAX_QUERIES = 16

_library: ctypes.CDLL | None = None
_unavailable: str | None = None  # why the kernel is off, once decided


@dataclasses.dataclass(frozen=True)
class Packed:
    """A bf16 weight [n, k] in native.c's blocked layout ([ceil(n/32)][k/2][32][2])."""
    data: torch.Tensor  # [ceil(n / 32) * k * 32] bf16
    n: int
    k: int


def available() -> bool:
    """True when the kernel is built and loaded here (builds it on the first call)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why the kernel is off (after `available()` said False), else None."""
    return _unavailable


def pack(weight: torch.Tensor) -> Packed | None:
    """The weight [n, k] (bf16, CPU, k even) in the kernel's layout, or None where it can't
    serve it (then the caller keeps its own path)."""
    if (weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2
            or weight.shape[1] % 2 or not available()):
        return None
    n, k = weight.shape
    dense = weight.detach().contiguous()
    data = torch.empty(-(-n // BLOCK) * BLOCK * k, dtype=torch.bfloat16)
    _library.domino_gemv_pack(dense.data_ptr(), n, k, data.data_ptr())
    return Packed(data, n, k)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., k] (bf16) @ W^T (+ bias [n]) -> [..., n] bf16, W given by `pack(W)`."""
    if x.dtype != torch.bfloat16 or x.shape[-1] != packed.k:
        raise ValueError(f"native linear: input {tuple(x.shape)} {x.dtype} does not fit a "
                         f"[{packed.n}, {packed.k}] bf16 weight")
    rows = x.reshape(-1, packed.k)  # a view where it can be one
    if rows.stride(-1) != 1 or rows.stride(0) % 2:
        rows = rows.contiguous()
    if bias is not None:
        bias = bias.to(torch.bfloat16).contiguous()
    out = torch.empty(rows.shape[0], packed.n, dtype=torch.bfloat16)
    _library.domino_gemv(rows.data_ptr(), rows.stride(0), packed.data.data_ptr(),
                         None if bias is None else bias.data_ptr(), out.data_ptr(),
                         rows.shape[0], packed.n, packed.k)
    return out.reshape(*x.shape[:-1], packed.n)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SGLang's RMSNorm.forward_native over bf16 x [T, H] (+ residual [T, H]) with weight [H]:
    (the normed rows, bf16(x + residual) or None), as new tensors."""
    x = x.contiguous()
    out = torch.empty_like(x)
    residual_out = None
    if residual is not None:
        residual = residual.contiguous()
        residual_out = torch.empty_like(x)
    _library.domino_add_rmsnorm(
        x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(), eps,
        out.data_ptr(), None if residual_out is None else residual_out.data_ptr(), x.shape[0],
        x.shape[1])
    return out, residual_out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dim: int) -> torch.Tensor:
    """SGLang's neox-style apply_rotary_emb over every head of bf16 x [T, heads * dim] (rows may
    be a strided view), cos / sin [T, dim / 2] bf16: a new [T, heads * dim]."""
    tokens, width = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()  # halves of the cache's rows: views
    out = torch.empty(tokens, width, dtype=torch.bfloat16)
    _library.domino_rope(x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(),
                         out.data_ptr(), tokens, width // dim, dim)
    return out


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """SGLang's SiluAndMul.forward_native over bf16 x [T, 2d] (gate, then up): [T, d]."""
    rows, width = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(rows, width // 2, dtype=torch.bfloat16)
    _library.domino_silu_mul(x.data_ptr(), x.stride(0), out.data_ptr(), rows, width // 2)
    return out


def rope_f32(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The drafter's apply_rope (model.py) over bf16 x [T, heads, D] with its fp32 tables
    (cos, sin) [T, 1, D]: a new [T, heads, D] bf16, the same roundings (fp32 products and sum,
    then bf16)."""
    tokens, heads, dim = x.shape
    x = x.contiguous()
    cos, sin = (t.contiguous() for t in rope)
    out = torch.empty_like(x)
    _library.domino_rope_f32(x.data_ptr(), heads * dim, cos.data_ptr(), sin.data_ptr(),
                             out.data_ptr(), tokens, heads, dim)
    return out


def fuse_drafter(drafter: torch.nn.Module) -> bool:
    """Run a bf16 drafter's RMS norms and rotary embeddings (model.py) on the native kernels,
    in place: each bf16 RMSNorm becomes a native one (the same formula, one pass), each
    attention rotates with `rope_f32`. True if done (bf16 weights, kernels built here)."""
    from domino_sglang.model import DraftAttention, RMSNorm

    if drafter.fc.weight.dtype != torch.bfloat16 or not available():
        return False
    for module in drafter.modules():
        if type(module) is RMSNorm and module.weight.dtype == torch.bfloat16:
            module.__class__ = _native_rmsnorm_class(RMSNorm)
        elif isinstance(module, DraftAttention):
            module.rotate = rope_f32
    return True


@functools.cache
def _native_rmsnorm_class(base: type) -> type:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # [rows, D]: a norm over the last dim
        return add_rmsnorm(rows, None, self.weight, self.eps)[0].view(x.shape)

    return type("NativeRMSNorm", (base,), {"forward": forward, "__doc__": (
        "model.RMSNorm over bf16 rows on the native kernel (cpu/native.py fuse_drafter).")})


def attention_fits(head_dim: int, value_dim: int, q_heads: int, kv_heads: int) -> bool:
    """Whether `attend` serves these shapes: a head dim a multiple of 32 and a value dim of 16,
    both up to 256, at most 16 query heads per KV head (native.c's register tiles)."""
    return (head_dim % 32 == 0 and value_dim % 16 == 0 and 0 < head_dim <= 256
            and 0 < value_dim <= 256 and q_heads % kv_heads == 0 and q_heads // kv_heads <= 16)


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, locs: torch.Tensor,
           mask: torch.Tensor | None, causal: bool, scaling: float, out: torch.Tensor) -> None:
    """Attention of q [n, Hq, D] over the keys / values at KV-pool slots locs [keys] (int64) of
    k_cache [slots, Hkv, D] / v_cache [slots, Hkv, Dv] (bf16, contiguous; `attention_fits`),
    written into out [n, Hq, Dv] (bf16, contiguous): mask [n, keys] bool (True = may attend)
    where given, else causal (query i sees keys up to keys - n + i) or every key."""
    n, hq, d = q.shape
    q = q.contiguous()
    if mask is not None:
        mask = mask.contiguous()
    _library.domino_attend(
        q.data_ptr(), n, hq, d, k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[1],
        v_cache.shape[2], locs.data_ptr(), locs.shape[0],
        None if mask is None else mask.data_ptr(), int(causal), scaling, out.data_ptr())


def _load() -> ctypes.CDLL | None:
    global _library, _unavailable
    if _library is not None or _unavailable is not None:
        return _library
    try:
        _library = _open(_build())
        logger.info("bf16 linears, norms and rotary run on the native AVX512-BF16 kernels "
                    "(%s=1 to disable)", DISABLE_ENV)
    except _Unavailable as why:
        _unavailable = str(why)
        logger.info("native kernels unavailable (%s): bf16 linears stay on oneDNN", why)
    return _library


class _Unavailable(Exception):
    pass


def _build() -> Path:
    if env_switch(DISABLE_ENV):
        raise _Unavailable(f"{DISABLE_ENV}=1")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise _Unavailable("no C compiler (cc) on PATH")
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:16]
    target = paths.home() / "kernels" / f"domino_native-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", scratch],
                              capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise _Unavailable(f"{Path(compiler).name} could not build {SOURCE.name}: {last}")
        os.replace(scratch, target)
        logger.info("built the native kernels: %s", target)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return target


def _open(path: Path) -> ctypes.CDLL:
    library = ctypes.CDLL(str(path))
    if not library.domino_native_supported():
        raise _Unavailable("this CPU lacks AVX512-BF16")
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    library.domino_gemv_pack.argtypes = [pointer, size, size, pointer]
    library.domino_gemv_pack.restype = None
    library.domino_gemv.argtypes = [pointer, size, pointer, pointer, pointer, size, size, size]
    library.domino_gemv.restype = None
    library.domino_add_rmsnorm.argtypes = [pointer, pointer, pointer, ctypes.c_float, pointer,
                                           pointer, size, size]
    library.domino_add_rmsnorm.restype = None
    library.domino_rope.argtypes = [pointer, size, pointer, pointer, pointer, size, size, size]
    library.domino_rope.restype = None
    library.domino_rope_f32.argtypes = library.domino_rope.argtypes
    library.domino_rope_f32.restype = None
    library.domino_silu_mul.argtypes = [pointer, size, pointer, size, size]
    library.domino_silu_mul.restype = None
    library.domino_attend.argtypes = [pointer, size, size, size, pointer, pointer, size, size,
                                      pointer, size, pointer, ctypes.c_int, ctypes.c_float,
                                      pointer]
    library.domino_attend.restype = None
    return library

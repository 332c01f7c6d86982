"""The CPU runtime's native bf16 kernels (native.c): built on first use with the machine's C
compiler, loaded beside torch's OpenMP runtime; the linears' packed weights, the residual add
with RMS norm, the rotary embedding, SiLU-and-mul, attention, and the head's greedy rollout
positions (NativeHead, fp32, one thread).

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
from typing import TYPE_CHECKING

import torch

from domino_sglang import paths
from domino_sglang.cpu.bootstrap import env_switch

if TYPE_CHECKING:
    from domino_sglang.spec.pointer import PointerCopy
    from domino_sglang.spec.rollout import Candidates, HeadParams

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
    """The drafter's apply_rope (model/drafter.py) over bf16 x [T, heads, D] with its fp32 tables
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
    """Run a bf16 drafter's RMS norms and rotary embeddings (model/drafter.py) on the native
    kernels, in place: each bf16 RMSNorm becomes a native one (the same formula, one pass), each
    attention rotates with `rope_f32`. True if done (bf16 weights, kernels built here)."""
    from domino_sglang.model.drafter import DraftAttention, RMSNorm

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


class NativeHead:
    """The head rollout's greedy positions (rollout.py greedy_rollout) on the native kernels:
    each position one `domino_head_pick` over every row (head logits, the first maximal
    column, the pointer copy's win) and one `domino_gru_step`, in fp32 as the CPU head runs
    (worker.py), on one thread. W1 and the GRU's weights are the head's own tensors; W2 is a
    transposed copy ([E, C]: the draft vocabulary's rows, or all V without one), made once, so
    it follows no later change to the drafter's weights (the drafter is not updated in
    serving; a stale copy could only move acceptance). Draft side only: its picks may differ
    from torch's where two logits tie to within rounding, which can only move acceptance."""

    def __init__(self, head: HeadParams) -> None:
        proj, gru = head.embed_proj, head.prefix_gru
        self.w1 = proj[0].weight.detach().contiguous()  # [E, H + G]
        self.w2t = (proj[2].weight if head.vocab is None else head.vocab_out_weight
                    ).detach().t().contiguous()  # [E, C]
        self.w_ih = gru.weight_ih_l0.detach().contiguous()  # [3G, H]
        self.w_hh = gru.weight_hh_l0.detach().contiguous()  # [3G, G]
        self.embed = head.embed.weight.detach()  # [V, H] bf16, contiguous (native_head)
        self.vocab = None if head.vocab is None else head.vocab.contiguous()  # [C] token ids
        self.column = None  # token id -> its column among the draft vocabulary's, -1 outside
        if self.vocab is not None:
            self.column = torch.full((self.embed.shape[0],), -1, dtype=torch.int32)
            self.column[self.vocab] = torch.arange(len(self.vocab), dtype=torch.int32)
        self.E, self.C = self.w2t.shape
        self.G, self.H = self.w_hh.shape[1], self.w_ih.shape[1]

    def rollout(self, z: torch.Tensor, bonus: torch.Tensor, base: torch.Tensor,
                copy: PointerCopy | None, cand: Candidates | None = None) -> torch.Tensor:
        """The greedy chain [bs, n] of z [bs, >= n, H], the verified tokens bonus [bs] and the
        base logits base [bs, n, C] (fp32); copy: a pointer drafter's host copy path
        (pointer.PointerCopy, started on z) or None; cand: the head's candidate pool
        (rollout.Candidates: positions >= 1 score its K columns) or None."""
        bs, n = base.shape[0], base.shape[1]
        if base.shape[-1] != self.C or z.shape[-1] != self.H:
            raise ValueError(f"native head: base logits {tuple(base.shape)} / states "
                             f"{tuple(z.shape)} do not fit a head of {self.C} columns, "
                             f"hidden {self.H}")
        zf = z[:, :n].to(torch.float32).contiguous()  # [bs, n, H]
        base = base.contiguous()
        pool = None
        if cand is not None:  # [bs, n, K] base, [bs, K, E] W2 rows, [bs, K] token ids
            pool = (cand.base.float().contiguous(), cand.out_weight.float().contiguous(),
                    cand.ids.to(torch.int64).contiguous())
        s = torch.zeros(bs, self.G, dtype=torch.float32)  # the GRU state
        scratch = torch.empty(bs * max(self.C + self.E, self.H + 6 * self.G), dtype=torch.float32)
        if n > 1:
            self._gru(bonus.to(torch.int64).contiguous(), s, scratch)
        # position-major, so each position's row is contiguous for the kernel: [n, bs] each
        chain = torch.empty(n, bs, dtype=torch.int64)
        won = torch.empty(n, bs, dtype=torch.bool)
        gate = None
        if copy is not None:  # the gate's per-position logits [n, bs] and match logits, once
            gate = (copy.z_logit.t().contiguous(), copy.match_logit.contiguous())
        for i in range(n):
            self._pick(i, zf[:, i], s, base[:, i], copy, gate, pool, chain[i], won[i], scratch)
            if copy is not None:
                copy.append(chain[i], won[i])
            if i + 1 < n:
                self._gru(chain[i], s, scratch)
        return chain.t().contiguous()

    def _pick(self, i: int, z: torch.Tensor, s: torch.Tensor, base: torch.Tensor,
              copy: PointerCopy | None, gate: tuple[torch.Tensor, torch.Tensor] | None,
              pool: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
              nxt: torch.Tensor, won: torch.Tensor, scratch: torch.Tensor) -> None:
        """Position i's drafts into nxt [bs] int64 and whether each is the copy into won [bs]
        bool. z [bs, H], s [bs, G], base [bs, C] (rows may be strided); positions >= 1 add the
        head's correction (position 0 is the base logits alone) and score the candidate pool's
        columns where there is one (base [bs, n, K], W2 rows [bs, K, E], ids [bs, K]); gate:
        the copy gate's logits ([n, bs], [max_match + 1]) with a copy path."""
        bs, head = base.shape[0], i > 0
        pool_w2 = pool_ids = None
        if pool is not None and head:
            base, pool_w2, pool_ids = pool[0][:, i], pool[1], pool[2]
        cand = match = gate_z = match_logit = None
        if copy is not None:
            found = torch.tensor(copy.found(), dtype=torch.int64).view(bs, 2).t().contiguous()
            cand, match = found  # [bs] each: (c, n) per row, host lookups
            gate_z, match_logit = gate[0][i], gate[1]
        ptr = _pointer_or_none
        _library.domino_head_pick(
            bs, self.H, self.G, self.E, base.shape[1], int(head), z.data_ptr(), z.stride(0),
            s.data_ptr(), base.data_ptr(), base.stride(0), self.w1.data_ptr(),
            self.w2t.data_ptr(), ptr(pool_w2), ptr(pool_ids), ptr(self.vocab),
            ptr(self.column), self.embed.shape[0],
            ptr(cand), ptr(match), ptr(gate_z), ptr(match_logit),
            0 if match_logit is None else match_logit.shape[0] - 1, nxt.data_ptr(),
            won.data_ptr(), scratch.data_ptr())

    def grow(self, z: torch.Tensor, bonus: torch.Tensor, cand: Candidates, score1: torch.Tensor,
             tok1: torch.Tensor, depth: int, size: int, branches: tuple[torch.Tensor, ...],
             kept: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A draft tree's growth below depth 1 and its cut in one kernel call (tree.py
        grow_tree; `domino_tree_grow`): z [bs, >= n, H] block states, bonus [bs], the pool
        (cand: base [bs, n, C], out_weight [bs, C, E], ids [bs, C]), depth 1's log-probabilities
        score1 [bs, K] and tokens tok1 [bs, K], the given branches ([bs, m_b] each, -1 past
        their end) and the depth they are kept to; returns tokens, parents, depths, branch
        [bs, N] int64 (tree.DraftTree's)."""
        bs, k = tok1.shape
        n, columns = cand.base.shape[1], cand.base.shape[2]
        pool_w2 = cand.out_weight.float().contiguous()
        if (pool_w2.shape != (bs, columns, self.E) or z.shape[-1] != self.H or depth > n
                or k > columns):
            raise ValueError(f"native head: a tree's pool {tuple(pool_w2.shape)}, states "
                             f"{tuple(z.shape)}, depth {depth} or width {k} do not fit")
        m = max((b.shape[1] for b in branches), default=0)
        given = torch.full((len(branches), bs, m), -1, dtype=torch.int64)  # [nb, bs, m]
        for j, b in enumerate(branches):
            given[j, :, :b.shape[1]] = b
        out = torch.empty(4, bs, size, dtype=torch.int64)  # tokens, parents, depths, branch
        zf, pool_base = z[:, :n].float().contiguous(), cand.base.float().contiguous()
        ids, root = cand.ids.to(torch.int64).contiguous(), bonus.to(torch.int64).contiguous()
        s1, t1 = score1.float().contiguous(), tok1.to(torch.int64).contiguous()
        if _library.domino_tree_grow(
                bs, k, depth, size, n, self.H, self.G, self.E, columns, zf.data_ptr(),
                pool_base.data_ptr(), pool_w2.data_ptr(), ids.data_ptr(), self.w1.data_ptr(),
                self.embed.data_ptr(), self.w_ih.data_ptr(), self.w_hh.data_ptr(),
                root.data_ptr(), s1.data_ptr(), t1.data_ptr(), len(branches), m,
                given.data_ptr(), kept, *(t.data_ptr() for t in out)) != 0:
            raise MemoryError("native head: a tree's growth could not allocate its scratch")
        return out[0], out[1], out[2], out[3]

    def _gru(self, tokens: torch.Tensor, s: torch.Tensor, scratch: torch.Tensor) -> None:
        _library.domino_gru_step(s.shape[0], self.H, self.G, self.embed.data_ptr(),
                                 tokens.data_ptr(), self.w_ih.data_ptr(), self.w_hh.data_ptr(),
                                 s.data_ptr(), scratch.data_ptr())


def _pointer_or_none(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def native_head(head: HeadParams) -> NativeHead | None:
    """The head's greedy rollout on the native kernels (NativeHead), or None where they can't
    run it: kernels unavailable, a head not in fp32, an embedding table that is not one bf16
    [V, H] tensor here holding every token the head can draft (tensor-parallel shards:
    `full_vocab`)."""
    embed = getattr(head.embed, "weight", None)
    gru, proj = head.prefix_gru, head.embed_proj
    if (not available() or head.full_vocab or embed is None or embed.dtype != torch.bfloat16
            or embed.dim() != 2 or not embed.is_contiguous() or embed.device.type != "cpu"
            or embed.shape[0] < head.vocab_size
            or gru.weight_hh_l0.dtype != torch.float32
            or proj[0].weight.dtype != torch.float32
            or (head.vocab_out_weight is not None
                and head.vocab_out_weight.dtype != torch.float32)):
        return None
    return NativeHead(head)


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
    library.domino_head_pick.argtypes = [
        size, size, size, size, size, ctypes.c_int, pointer, size, pointer, pointer, size,
        pointer, pointer, pointer, pointer, pointer, pointer, size, pointer, pointer, pointer,
        pointer, size, pointer, pointer, pointer]
    library.domino_head_pick.restype = None
    library.domino_gru_step.argtypes = [size, size, size, pointer, pointer, pointer, pointer,
                                        pointer, pointer]
    library.domino_gru_step.restype = None
    library.domino_tree_grow.argtypes = [size] * 9 + [pointer] * 11 + [size, size, pointer,
                                                                         size] + [pointer] * 4
    library.domino_tree_grow.restype = ctypes.c_int
    return library

"""A lean forward for SGLang's Llama decoder stack on the CPU engine: the same numbers, fewer steps.

SGLang 0.5.23 runs each decoder layer through its layer-boundary machinery (stage boundaries, a
residual stream on the forward batch, readouts that can fuse quantisation into a norm) and each
projection through its parallel linear layers (sequence-parallel and symmetric-memory checks),
built for multi-GPU layouts. On one CPU rank, unquantised, a boundary reduces to "add the
residual, RMS-normalise", a projection to its matmul, and at batch 1 their Python costs as much
as the small ops they wrap. This forward walks the same stack in the same order on the same
tensors, with the same operations:
  - the norms, `RadixAttention` (so the server's attention backend), the activation and the
    final norm are SGLang's own modules;
  - a projection runs the call cpu/linear.py's quant method would (the layer's pack: oneDNN's,
    or the native linear's in bf16; the module itself where it has none, or a bias);
  - the rotary embedding's cos / sin are looked up and cast once per forward instead of once
    per layer, and rotated by SGLang's own formula (`rotate`), where that is what the layers'
    shared RotaryEmbedding would compute (`_shared_rope`); else each layer's own;
  - the same auxiliary hidden states are captured (the stream entering a captured layer,
    which a DFlash / DOMINO drafter reads).
So its outputs are SGLang's bit for bit (tests/cpu/test_cpu_forward.py: served tokens and
log-probabilities, float32).

In bf16, where the native kernels run (native.py), the residual adds with their RMS norms, the
rotary embedding and the MLP's SiLU-and-mul run there instead of as SGLang's chains of small
torch ops: the same formulas per row, one pass each; the rotary's bits are SGLang's, a norm's
or an activation's can differ in an output's last bit (the order of a norm's sum of squares,
the exponential's last fp32 bit), and every row's numbers are its own
whatever else shares the forward, as with SGLang's (tests/cpu/test_cpu_native.py). The projections
of a bf16 model then run on the native linear kernel through cpu/linear.py's packs.

It takes a forward only where that holds, decided once per model (`_lean_stack`): exactly
SGLang's `LlamaModel` with its own `LlamaDecoderLayer` / `LlamaAttention` / `LlamaMLP`,
unquantised linears at one tensor-parallel rank, one pipeline stage, no fused dual GEMM; and per
call: no input embeddings, no pipeline proxy tensors. Everything else runs SGLang's own forward,
and the server log says which one a model got. Installed by the plugin under the CPU engine only
(`install`), off with DOMINO_SGLANG_NO_LEAN_FORWARD=1.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from domino_sglang.cpu import linear as cpu_linear
from domino_sglang.cpu import native
from domino_sglang.cpu.bootstrap import env_switch

logger = logging.getLogger(__name__)

DISABLE_ENV = "DOMINO_SGLANG_NO_LEAN_FORWARD"
STACK_ATTR = "_domino_lean_stack"  # per model: the layers' modules, or None (SGLang's forward)
_installed = False


class Stack(NamedTuple):
    """What the lean forward walks: each layer's (input norm, attention, post-attention norm,
    MLP), the rotary embedding they share when `rotate` computes it as SGLang's does (None:
    each layer's `forward_prepare_native`), and whether a bf16 forward runs the norms, that
    rotary and the activation on the native kernels."""

    layers: list[tuple]
    rope: object | None
    native: bool


def lean_forward(model, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                 layers: Stack, capture: list[int]):
    """The decoder stack over `input_ids` [T] at `positions` [T]: the final normed hidden
    states [T, H], or (those, the captured aux hidden states) when `capture` names layers."""
    from domino_sglang.sglang_compat import AuxHiddenStateList

    hidden = model.embed_tokens(input_ids)  # [T, H]
    residual = None
    aux = AuxHiddenStateList()
    # the norms, the rotary and the activation on the native kernels
    fused = layers.native and hidden.dtype == torch.bfloat16
    norm = native_norm if fused else module_norm
    rope = rope_tables(layers.rope, positions, hidden.dtype) if layers.rope else None
    for i, (input_norm, attn, post_norm, mlp) in enumerate(layers.layers):
        if residual is None:  # the first layer: the embeddings are the stream
            if i in capture:
                aux.capture(hidden)
            residual, hidden = hidden, norm(input_norm, hidden, None)[0]
        else:
            hidden, residual = norm(input_norm, hidden, residual)
            if i in capture:
                aux.capture(residual)
        if rope is None:
            q, k, v = attn.forward_prepare_native(positions, hidden)
        else:
            qkv = project(attn.qkv_proj, hidden)  # [T, q + 2 kv]
            q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
            if fused:
                q, k = native.rope(q, *rope, attn.head_dim), native.rope(k, *rope, attn.head_dim)
            else:
                q, k = rotate(q, rope), rotate(k, rope)
        hidden = project(attn.o_proj, attn.attn(q, k, v, forward_batch))
        hidden, residual = norm(post_norm, hidden, residual)
        gate_up = project(mlp.gate_up_proj, hidden)  # [T, 2 I]
        hidden = project(mlp.down_proj, native.silu_mul(gate_up) if fused else mlp.act_fn(gate_up))
    hidden, _ = norm(model.norm, hidden, residual)
    return (hidden, aux) if capture else hidden


def module_norm(module, hidden: torch.Tensor, residual: torch.Tensor | None) -> tuple:
    """SGLang's RMSNorm module: (normed, new residual), residual None on the first layer."""
    if residual is None:
        return module(hidden), None
    return module(hidden, residual)


def native_norm(module, hidden: torch.Tensor, residual: torch.Tensor | None) -> tuple:
    """The same norm on the native kernel (bf16; `_native_formulas` said it computes the same)."""
    return native.add_rmsnorm(hidden, residual, module.weight, module.variance_epsilon)


def project(linear, x: torch.Tensor) -> torch.Tensor:
    """linear(x)'s output at one rank: the layer's own pack (cpu/linear.py) where its quant
    method would use it, the same call, without the module's parallel bookkeeping; else
    the layer itself."""
    packed = cpu_linear.packed_for(linear, x)
    if packed is None or linear.bias is not None:
        return linear(x)[0]
    return cpu_linear.packed_linear(x, packed)


def rope_tables(rope, positions: torch.Tensor, dtype: torch.dtype) -> tuple:
    """(cos, sin) [T, D/2] in `dtype` at `positions` [T]: what SGLang's rotary embedding looks
    up and casts in every layer (RotaryEmbedding.forward_native, apply_rotary_emb), once per
    forward."""
    cos, sin = rope.cos_sin_cache.index_select(0, positions.flatten()).chunk(2, dim=-1)
    # contiguous once here: the halves of the cache rows are views, and every layer reads them
    return cos.to(dtype).contiguous(), sin.to(dtype).contiguous()


def rotate(x: torch.Tensor, tables: tuple) -> torch.Tensor:
    """Neox-style rotary embedding of x [T, heads * D] over whole heads: SGLang's own
    apply_rotary_emb on the tables already in x's dtype (its cast is then a no-op)."""
    from domino_sglang.sglang_compat import apply_rotary_emb

    cos, sin = tables
    heads = x.view(x.shape[0], -1, cos.shape[-1] * 2)  # [T, heads, D]
    return apply_rotary_emb(heads, cos, sin, True).reshape(x.shape)


def _shared_rope(attns: list):
    """The rotary embedding every layer shares (SGLang's get_rope caches one per configuration)
    when `rotate` is exactly what its forward computes on this runtime: SGLang's own
    RotaryEmbedding class, neox style over whole heads, its plain apply_rotary_emb, and no
    sgl_kernel CPU op to run instead (our stand-in is the one loaded). Else None."""
    from domino_sglang.cpu import bootstrap
    from domino_sglang.sglang_compat import RotaryEmbedding, apply_rotary_emb

    rope = attns[0].rotary_emb
    same = all(a.rotary_emb is rope for a in attns)
    if not (same and bootstrap.is_active() and type(rope) is RotaryEmbedding):
        return None
    plain = (rope.is_neox_style and rope.rotary_dim == rope.head_size
             and not hasattr(rope, "sin_cos_cache")
             and rope._apply_rotary_emb_wrapped is apply_rotary_emb)
    return rope if plain and all(a.head_dim == rope.head_size for a in attns) else None


def _lean_stack(model) -> Stack | None:
    """The (input norm, attention, post-attention norm, MLP) of each layer when this model's
    forward reduces to `lean_forward`, else None."""
    from domino_sglang.sglang_compat import (
        LlamaAttention,
        LlamaDecoderLayer,
        LlamaMLP,
        UnquantizedLinearMethod,
        tp_shard,
    )

    pp = getattr(model, "pp_group", None)
    if pp is None or pp.world_size != 1 or tp_shard() is not None:  # one stage, one TP rank
        return None
    layers = list(model.layers[model.start_layer:model.end_layer])
    if not layers:
        return None
    stack = []
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if (type(layer) is not LlamaDecoderLayer or type(attn) is not LlamaAttention
                or type(mlp) is not LlamaMLP):
            return None
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if any(type(lin.quant_method) is not UnquantizedLinearMethod for lin in linears):
            return None
        if mlp.dual_gemm.mode is not None or mlp.activation_quant.enabled:
            return None
        stack.append((layer.input_layernorm, attn, layer.post_attention_layernorm, mlp))
    rope = _shared_rope([attn for _, attn, _, _ in stack])
    fused = rope is not None and native.available() and _native_formulas(
        [n for layer in stack for n in (layer[0], layer[2])] + [model.norm],
        [layer[3].act_fn for layer in stack])
    return Stack(stack, rope, fused)


def _native_formulas(norms: list, activations: list) -> bool:
    """Whether each norm is SGLang's plain RMSNorm and each activation its SiluAndMul, run as
    their `forward_native` here (no AMX kernel; no cast / fp32-residual / partial-variance
    option on a norm): the formulas native.add_rmsnorm and native.silu_mul compute."""
    from domino_sglang.sglang_compat import RMSNorm, SiluAndMul, rmsnorm_uses_amx

    if rmsnorm_uses_amx():
        return False
    plain_norms = all(type(n) is RMSNorm and n.has_weight and not n.cast_x_before_out_mul
                      and not n.fp32_residual and n.override_orig_dtype is None
                      and n.variance_size_override is None for n in norms)
    return plain_norms and all(type(a) is SiluAndMul for a in activations)


def install() -> bool:
    """Route SGLang's `LlamaModel.forward` through `lean_forward` where it reduces to it, under
    the CPU engine only (idempotent). True if active."""
    global _installed
    if _installed:
        return True
    if not env_switch("SGLANG_USE_CPU_ENGINE") or env_switch(DISABLE_ENV):
        return False
    from domino_sglang.sglang_compat import LlamaModel

    sglang_forward = LlamaModel.forward

    def forward(self, input_ids, positions, forward_batch, input_embeds=None,
                pp_proxy_tensors=None):
        if STACK_ATTR not in self.__dict__:
            self.__dict__[STACK_ATTR] = _lean_stack(self)
            stack = self.__dict__[STACK_ATTR]
            logger.info("%s forward: %s", type(self).__name__,
                        "SGLang's own" if stack is None else
                        "lean (the boundaries' bookkeeping skipped; rotary tables "
                        + ("once per forward" if stack.rope else "in every layer")
                        + ("; bf16 norms, rotary and activation on the native kernels)"
                           if stack.native
                           else ")"))
        layers = self.__dict__[STACK_ATTR]
        if layers is None or input_embeds is not None or pp_proxy_tensors is not None:
            return sglang_forward(self, input_ids, positions, forward_batch, input_embeds,
                                  pp_proxy_tensors)
        return lean_forward(self, input_ids, positions, forward_batch, layers,
                            self.layers_to_capture)

    LlamaModel.forward = forward
    _installed = True
    return True

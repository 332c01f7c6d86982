"""A lean forward for SGLang's Llama decoder stack on the CPU engine: the same modules, fewer steps.

SGLang 0.5.23 runs each decoder layer through its layer-boundary machinery (stage boundaries, a
residual stream on the forward batch, readouts that can fuse quantisation into a norm), built
for multi-GPU layouts. On one CPU rank, unquantised, every boundary reduces to "add the
residual, RMS-normalise", and its Python costs as much as the norm: at batch 1 a forward of
SmolLM2-135M spent about a quarter of its time outside the layers' own modules. This forward
walks the same stack, calling the same modules SGLang's would (the norms with the residual,
`qkv_proj`, the rotary embedding, `RadixAttention` and so the server's attention backend,
`o_proj`, `gate_up_proj`, the activation, `down_proj`, the final norm) in the same order on the
same tensors, and captures the same auxiliary hidden states (the stream entering a captured
layer, which a DFlash / DOMINO drafter reads); only the boundaries' bookkeeping is gone, so its
outputs are SGLang's bit for bit (tests/test_cpu_forward.py checks it, float32 and bfloat16).

It takes a forward only where that reduction holds, decided once per model (`_lean_stack`):
exactly SGLang's `LlamaModel` with its own `LlamaDecoderLayer` / `LlamaAttention` / `LlamaMLP`,
unquantised linears, one tensor- and pipeline-parallel rank, no fused dual GEMM; and per call:
no input embeddings, no pipeline proxy tensors. Everything else runs SGLang's own forward.
Installed by the plugin under the CPU engine only (`install`), off with
DOMINO_SGLANG_NO_LEAN_FORWARD=1.
"""

from __future__ import annotations

import logging

import torch

from domino_sglang.cpu.bootstrap import env_switch

logger = logging.getLogger(__name__)

DISABLE_ENV = "DOMINO_SGLANG_NO_LEAN_FORWARD"
STACK_ATTR = "_domino_lean_stack"  # per model: the layers' modules, or None (SGLang's forward)
_installed = False


def lean_forward(model, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                 layers: list, capture: frozenset[int]):
    """The decoder stack over `input_ids` [T] at `positions` [T]: the final normed hidden
    states [T, H], or (those, the captured aux hidden states) when `capture` names layers."""
    from domino_sglang.sglang_compat import AuxHiddenStateList

    hidden = model.embed_tokens(input_ids)  # [T, H]
    residual = None
    aux = AuxHiddenStateList()
    for i, (input_norm, attn, post_norm, mlp) in enumerate(layers):
        if residual is None:  # the first layer: the embeddings are the stream
            if i in capture:
                aux.capture(hidden)
            residual, hidden = hidden, input_norm(hidden)
        else:
            hidden, residual = input_norm(hidden, residual)
            if i in capture:
                aux.capture(residual)
        q, k, v = attn.forward_prepare_native(positions, hidden)
        hidden, _ = attn.o_proj(attn.attn(q, k, v, forward_batch))
        hidden, residual = post_norm(hidden, residual)
        gate_up, _ = mlp.gate_up_proj(hidden)
        hidden, _ = mlp.down_proj(mlp.act_fn(gate_up))
    hidden, _ = model.norm(hidden, residual)
    return (hidden, aux) if capture else hidden


def _lean_stack(model) -> list | None:
    """The (input norm, attention, post-attention norm, MLP) of each layer when this model's
    forward reduces to `lean_forward`, else None."""
    from domino_sglang.sglang_compat import (
        LlamaAttention,
        LlamaDecoderLayer,
        LlamaMLP,
        UnquantizedLinearMethod,
    )

    pp = getattr(model, "pp_group", None)
    if pp is None or pp.world_size != 1:
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
        if any(type(lin.quant_method) is not UnquantizedLinearMethod
               or getattr(lin, "tp_size", 1) != 1 for lin in linears):
            return None
        if mlp.dual_gemm.mode is not None or mlp.activation_quant.enabled:
            return None
        stack.append((layer.input_layernorm, attn, layer.post_attention_layernorm, mlp))
    return stack


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
            logger.info("%s forward: %s", type(self).__name__,
                        "lean (the boundaries' bookkeeping skipped)"
                        if self.__dict__[STACK_ATTR] else "SGLang's own")
        layers = self.__dict__[STACK_ATTR]
        if layers is None or input_embeds is not None or pp_proxy_tensors is not None:
            return sglang_forward(self, input_ids, positions, forward_batch, input_embeds,
                                  pp_proxy_tensors)
        return lean_forward(self, input_ids, positions, forward_batch, layers,
                            frozenset(self.layers_to_capture))

    LlamaModel.forward = forward
    _installed = True
    return True

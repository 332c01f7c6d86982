"""The Domino drafter checkpoint (upstream layout): parse, validate, name the bad field.

Upstream layout (SpecForge / SGLang `DFlashDraftModel`, as released for Qwen3-4B/8B):

    config.json   architectures ["DFlashDraftModel"], block_size, Qwen3-style decoder fields
                  (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
                  head_dim, intermediate_size, rms_norm_eps, rope_theta, vocab_size), and
                  dflash_config {target_layer_ids, mask_token_id, projector_type: "domino",
                  shift_label: true, pure_draft_prefix_len: 1, gru_hidden_dim, emb_dim; ours,
                  optional: candidate_pool, short_draft, draft_temperature_scale, copy_gate}
    *.safetensors fc.weight [H, K*H], hidden_norm.weight [H], layers.N.* (Qwen3 decoder layers,
                  q_norm/k_norm), norm.weight [H], prefix_gru.weight_ih_l0 [3G, H],
                  prefix_gru.weight_hh_l0 [3G, G], embed_proj.0.weight [E, H+G],
                  embed_proj.2.weight [V, E]; ours, with copy_gate: copy_gate.weight
                  [1, H + 13], copy_gate.bias [1] (pointer.py)

Target-layer capture: `target_layer_ids[k] = i` means the OUTPUT of target decoder layer i
(transformers' `hidden_states[i + 1]`), as SGLang's `set_dflash_layers_to_capture` does.

Resolution rules follow SGLang 0.5.23's own DFLASH/Domino loader (`srt/speculative/dflash_utils.py
parse_dflash_draft_config`, `srt/models/dflash.py DFlashDraftModel.load_weights`,
`dflash_worker_v2.py _resolve_mask_token_id`), pinned by tests/model/test_upstream_equivalence.py:
  - `auto_map` / `trust_remote_code` (top level or inside dflash_config) are metadata: accepted,
    never executed (nothing here imports code from a checkpoint);
  - block_size, target_layer_ids, mask_token_id, mask_token, projector_type, shift_label,
    pure_draft_prefix_len, gru_hidden_dim, num_target_layers: dflash_config first, then the top
    level; emb_dim: either, and both must agree; target_layer_ids absent: spread over
    num_target_layers as upstream's `build_target_layer_ids`;
  - mask_token_id absent: the target tokenizer's id of `mask_token` (default "<|MASK|>"): its
    mask token, else its vocabulary, else the next free id (upstream adds the token), which must
    lie inside vocab_size;
  - weight names: optional `model.` prefix, `encoder.fc.weight` / `encoder.output_norm_enc.weight`
    aliases, and SGLang's fused `qkv_proj` / `gate_up_proj` (split back); unknown names ignored.
Only safetensors are read: a pickle file beside them (`*.bin`, `*.pt`, ...) is refused, naming it,
and so is `mask_embedding.pt` (upstream merges it with torch.load: a pickle).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARCHITECTURE = "DFlashDraftModel"
# The head scores only the block-shared top-K of the base logits (upstream's default, 2048): a
# draft-side approximation, verification stays exact. Each head step's cost grows with the
# columns it scores, so the pool costs a fraction of the full vocabulary's (docs/benchmarks.md,
# "Draft rollout cost").
DEFAULT_CANDIDATE_POOL = 2048
MIN_BLOCK, MAX_BLOCK = 2, 64
# A pointer-generator drafter (pointer.py) one-hot encodes match lengths 0..12 for its copy gate.
COPY_MAX_MATCH = 12
# upstream's DEFAULT_DFLASH_MASK_TOKEN (dflash_utils.py): the token named when no id is given
DEFAULT_MASK_TOKEN = "<|MASK|>"
# metadata that would ask a transformers loader for remote code: accepted, never executed
REMOTE_CODE_FIELDS = ("auto_map", "trust_remote_code")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few kB; refuse a huge or endless file
# upstream `load_weights` aliases (the native export's "encoder." names)
WEIGHT_ALIASES = {"encoder.fc.weight": "fc.weight",
                  "encoder.output_norm_enc.weight": "hidden_norm.weight"}


class DrafterConfigError(ValueError):
    """A drafter that cannot be served; the message names the file and the field."""


@dataclass(frozen=True)
class DraftConfig:
    path: Path
    block_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    max_position_embeddings: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    gru_hidden_dim: int
    emb_dim: int
    shift_label: bool = True
    pure_draft_prefix_len: int = 1
    candidate_pool: int = DEFAULT_CANDIDATE_POOL  # head over the top-K base candidates; 0 = all
    # trained on short blocks (train `short_blocks`): a round verifying L < B tokens drafts
    # [x_t, MASK x (L-1)] only, not the whole block (proposers/domino.py `propose`)
    short_draft: bool = False
    # sampled requests (T > 0) draw drafts at temperature T * scale (sampling.py): < 1 sharpens
    # a drafter whose distributions are flatter than the target's (benchmarks/draft_temperature.py)
    draft_temperature_scale: float = 1.0
    # a pointer-generator drafter (pointer.py): a copy gate mixes the history's copy candidate
    # into every position's distribution; weights copy_gate.{weight,bias}
    copy_gate: bool = False
    # the remote-code metadata found and ignored (e.g. ("auto_map", "dflash_config.auto_map"))
    ignored_metadata: tuple[str, ...] = ()
    # where mask_token_id came from: "config" or "tokenizer" (resolved from mask_token)
    mask_token_source: str = "config"
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_context_features(self) -> int:
        return len(self.target_layer_ids)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the drafter needs, with its shape."""
        h, g, e = self.hidden_size, self.gru_hidden_dim, self.emb_dim
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shapes = {
            "fc.weight": (h, self.num_context_features * h),
            "hidden_norm.weight": (h,),
            "norm.weight": (h,),
            "prefix_gru.weight_ih_l0": (3 * g, h),
            "prefix_gru.weight_hh_l0": (3 * g, g),
            "embed_proj.0.weight": (e, h + g),
            "embed_proj.2.weight": (self.vocab_size, e),
        }
        if self.copy_gate:
            shapes["copy_gate.weight"] = (1, h + COPY_MAX_MATCH + 1)
            shapes["copy_gate.bias"] = (1,)
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (self.head_dim,),
                p + "self_attn.k_norm.weight": (self.head_dim,),
                p + "mlp.gate_proj.weight": (self.intermediate_size, h),
                p + "mlp.up_proj.weight": (self.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, self.intermediate_size),
            })
        return shapes


def _field(cfg: dict, name: str, kind: type, where: str, default: Any = None) -> Any:
    value = cfg.get(name, default)
    if value is None:
        raise DrafterConfigError(f"{where}: missing field '{name}'")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise DrafterConfigError(f"{where}: field '{name}' must be an integer, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise DrafterConfigError(f"{where}: field '{name}' must be a number, got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise DrafterConfigError(f"{where}: field '{name}' must be true/false, got {value!r}")
    if kind in (int, float) and value <= 0 and name not in ("mask_token_id",):
        raise DrafterConfigError(f"{where}: field '{name}' must be positive, got {value!r}")
    return value


def _pool_field(dcfg: dict, where: str) -> int:
    value = dcfg.get("candidate_pool", DEFAULT_CANDIDATE_POOL)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DrafterConfigError(f"{where}: field 'candidate_pool' must be an integer >= 0 "
                                 f"(0 = full vocabulary), got {value!r}")
    return value


def load_draft_config(path: str | Path, block_size: int | None = None,
                      tokenizer_path: str | Path | None = None) -> DraftConfig:
    """Read and validate `path/config.json` (shape-level checks of the config alone).
    `tokenizer_path`: the target's tokenizer, read only when the config names no mask_token_id
    (default: the served model's, inside an SGLang process)."""
    path = Path(path)
    file = path / "config.json"
    where = str(file)
    if not file.exists():
        raise DrafterConfigError(f"{where}: not found (is {path} a drafter folder?)")
    if not file.is_file():
        raise DrafterConfigError(f"{where}: not a regular file")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise DrafterConfigError(f"{where}: {file.stat().st_size} bytes, too large for a config "
                                 f"(at most {MAX_CONFIG_BYTES})")
    try:
        cfg = json.loads(file.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DrafterConfigError(f"{where}: not UTF-8 text (a binary file?): {exc.reason} at "
                                 f"byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise DrafterConfigError(f"{where}: invalid JSON ({exc})") from exc
    except OSError as exc:
        raise DrafterConfigError(f"{where}: unreadable ({exc.strerror or exc})") from exc
    return parse_draft_config(cfg, path, block_size, tokenizer_path)


def resolve_mask_token_id(mask_token: str, vocab_size: int, tokenizer_path: str | Path | None,
                          where: str) -> int:
    """upstream `_resolve_mask_token_id` without an id: the tokenizer's mask token if it is
    `mask_token`, else `mask_token`'s id in its vocabulary, else the id adding it would give
    (len(tokenizer)); the id must lie inside the model's vocab_size."""
    if tokenizer_path is None:
        raise DrafterConfigError(f"{where}: no mask_token_id, and no target tokenizer to resolve "
                                 f"mask_token {mask_token!r} with")
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tokenizer_path))
    except Exception as exc:
        raise DrafterConfigError(f"{where}: no mask_token_id, and the tokenizer at "
                                 f"{tokenizer_path} could not be read ({exc})") from exc
    token_id = None
    if getattr(tok, "mask_token", None) == mask_token:
        token_id = getattr(tok, "mask_token_id", None)
    if token_id is None:
        token_id = tok.get_vocab().get(mask_token)
    if token_id is None:
        token_id = len(tok)  # upstream adds the token: it takes the next free id
    if not 0 <= int(token_id) < vocab_size:
        raise DrafterConfigError(
            f"{where}: no mask_token_id, and mask_token {mask_token!r} resolves to id {token_id} "
            f"in {tokenizer_path}, outside the vocabulary (vocab_size {vocab_size}); give "
            "dflash_config.mask_token_id")
    return int(token_id)


def _remote_code_metadata(cfg: dict, dcfg: dict) -> tuple[str, ...]:
    """Names of the remote-code metadata present (recorded, never acted on)."""
    found = [k for k in REMOTE_CODE_FIELDS if k in cfg]
    found += [f"dflash_config.{k}" for k in REMOTE_CODE_FIELDS if k in dcfg]
    return tuple(found)


# Variants upstream's DFlashDraftModel also builds but this drafter does not compute: refused,
# naming the field, rather than served with different math. (field, where, allowed values)
_UNSUPPORTED = (
    ("attention_bias", "top", (None, False)),
    ("use_gemma_norm", "top", (None, False)),
    ("is_causal", "top", (None, False)),
    ("rope_scaling", "top", (None, {})),
    ("partial_rotary_factor", "top", (None, 1, 1.0)),
    ("rope_is_neox_style", "top", (None, True)),
    ("is_neox_style", "top", (None, True)),
    ("hidden_act", "top", (None, "silu")),
    ("conv_kernel_size", "dflash", (None, 0)),
    ("attention_sink_bias", "dflash", (None, False)),
    ("attention_value_scale", "dflash", (None,)),
)


def _refuse_unsupported(cfg: dict, dcfg: dict, where: str) -> None:
    for name, level, allowed in _UNSUPPORTED:
        value = (cfg if level == "top" else dcfg).get(name)
        if not any(value == a and type(value) is type(a) for a in allowed if a is not None) \
                and value is not None:
            field_name = name if level == "top" else f"dflash_config.{name}"
            raise DrafterConfigError(f"{where}: field '{field_name}' = {value!r} is not "
                                     "supported by this drafter (the released Domino drafters "
                                     "do not use it)")
    rope_type = (cfg.get("rope_parameters") or {}).get("rope_type", "default")
    if rope_type != "default":
        raise DrafterConfigError(f"{where}: field 'rope_parameters.rope_type' = {rope_type!r} is "
                                 "not supported (plain RoPE only)")
    kinds = cfg.get("layer_types")
    if kinds is not None and (not isinstance(kinds, list)
                              or any(k != "full_attention" for k in kinds)):
        raise DrafterConfigError(f"{where}: field 'layer_types' must list only "
                                 f"\"full_attention\" layers, got {kinds!r}")


def parse_draft_config(cfg: dict, path: str | Path, block_size: int | None = None,
                       tokenizer_path: str | Path | None = None) -> DraftConfig:
    """Validate a drafter config dict (the contents of `path/config.json`)."""
    path = Path(path)
    where = str(path / "config.json")
    if not isinstance(cfg, dict):
        raise DrafterConfigError(f"{where}: must be a JSON object, got a JSON "
                                 f"{type(cfg).__name__}")
    if cfg.get("architectures") != [ARCHITECTURE]:
        raise DrafterConfigError(
            f"{where}: field 'architectures' must be [\"{ARCHITECTURE}\"], got "
            f"{cfg.get('architectures')!r}; this is not a Domino drafter")
    dcfg = cfg.get("dflash_config")
    if dcfg is None:
        dcfg = {}  # upstream reads every Domino field from the top level too
    if not isinstance(dcfg, dict):
        raise DrafterConfigError(f"{where}: field 'dflash_config' must be an object, got "
                                 f"{dcfg!r}")
    dwhere = f"{where}: dflash_config"
    # upstream's fallback: dflash_config first, then the top level
    both = {**cfg, **dcfg}
    if both.get("projector_type") != "domino":
        raise DrafterConfigError(
            f"{dwhere}.projector_type must be \"domino\", got {both.get('projector_type')!r}; "
            "this is not a Domino drafter")
    num_layers = _field(cfg, "num_hidden_layers", int, where)
    layer_ids = both.get("target_layer_ids")
    if layer_ids is None and both.get("num_target_layers") is not None:
        layer_ids = spread_layer_ids(_field(both, "num_target_layers", int, dwhere), num_layers)
    if (not isinstance(layer_ids, list) or not layer_ids
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                       for x in layer_ids)):
        raise DrafterConfigError(f"{dwhere}.target_layer_ids must be a non-empty list of ints "
                                 f">= 0 (or give num_target_layers), got {layer_ids!r}")
    block = block_size if block_size is not None else _field(both, "block_size", int, dwhere, 16)
    if not MIN_BLOCK <= block <= MAX_BLOCK:
        raise DrafterConfigError(
            f"block size must be in [{MIN_BLOCK}, {MAX_BLOCK}], got {block} "
            f"({'--speculative-num-draft-tokens' if block_size is not None else where})")
    emb_top, emb_nested = cfg.get("emb_dim"), dcfg.get("emb_dim")
    if emb_top is not None and emb_nested is not None and emb_top != emb_nested:
        raise DrafterConfigError(f"{where}: field 'emb_dim' is {emb_top} but "
                                 f"dflash_config.emb_dim is {emb_nested}; they must agree")
    rope = cfg.get("rope_parameters") or {}
    rope_theta = cfg.get("rope_theta", rope.get("rope_theta", 1_000_000.0))
    num_heads = _field(cfg, "num_attention_heads", int, where)
    hidden = _field(cfg, "hidden_size", int, where)
    vocab = _field(cfg, "vocab_size", int, where)
    mask_token = both.get("mask_token", DEFAULT_MASK_TOKEN)
    if not isinstance(mask_token, str) or not mask_token:
        raise DrafterConfigError(f"{dwhere}.mask_token must be a non-empty string, got "
                                 f"{mask_token!r}")
    mask_source = "config"
    if both.get("mask_token_id") is None:
        mask_id = resolve_mask_token_id(mask_token, vocab, tokenizer_path, dwhere)
        mask_source = "tokenizer"
    else:
        mask_id = _field(both, "mask_token_id", int, dwhere)
    conf = DraftConfig(
        path=path,
        block_size=block,
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=_field(cfg, "num_key_value_heads", int, where, num_heads),
        head_dim=_field(cfg, "head_dim", int, where, hidden // num_heads),
        intermediate_size=_field(cfg, "intermediate_size", int, where),
        rms_norm_eps=_field(cfg, "rms_norm_eps", float, where, 1e-6),
        rope_theta=_field({"rope_theta": rope_theta}, "rope_theta", float, where),
        vocab_size=vocab,
        max_position_embeddings=_field(cfg, "max_position_embeddings", int, where, 32768),
        target_layer_ids=tuple(layer_ids),
        mask_token_id=mask_id,
        gru_hidden_dim=_field(both, "gru_hidden_dim", int, dwhere),
        emb_dim=_field(both, "emb_dim", int, dwhere),
        shift_label=_field(both, "shift_label", bool, dwhere, True),
        pure_draft_prefix_len=_field(both, "pure_draft_prefix_len", int, dwhere, 1),
        candidate_pool=_pool_field(dcfg, dwhere),
        short_draft=_field(dcfg, "short_draft", bool, dwhere, False),
        draft_temperature_scale=_field(dcfg, "draft_temperature_scale", float, dwhere, 1.0),
        copy_gate=_field(dcfg, "copy_gate", bool, dwhere, False),
        ignored_metadata=_remote_code_metadata(cfg, dcfg),
        mask_token_source=mask_source,
        raw=cfg,
    )
    _refuse_unsupported(cfg, dcfg, where)
    if conf.num_heads % conf.num_kv_heads:
        raise DrafterConfigError(f"{where}: field 'num_key_value_heads' ({conf.num_kv_heads}) "
                                 f"must divide num_attention_heads ({conf.num_heads})")
    if not conf.shift_label or conf.pure_draft_prefix_len != 1:
        raise DrafterConfigError(f"{dwhere}: only shift_label=true and pure_draft_prefix_len=1 "
                                 "are supported (the released Domino drafters use these)")
    if not 0 <= conf.mask_token_id < conf.vocab_size:
        raise DrafterConfigError(f"{dwhere}.mask_token_id {conf.mask_token_id} is outside the "
                                 f"vocabulary (vocab_size {conf.vocab_size})")
    return conf


def check_against_target(conf: DraftConfig, target_hidden: int, target_vocab: int,
                         target_layers: int) -> None:
    """The drafter must share the target's hidden size and vocabulary, and read real layers."""
    where = str(conf.path / "config.json")
    if conf.hidden_size != target_hidden:
        raise DrafterConfigError(f"{where}: field 'hidden_size' is {conf.hidden_size} but the "
                                 f"target's is {target_hidden}")
    if conf.vocab_size != target_vocab:
        raise DrafterConfigError(f"{where}: field 'vocab_size' is {conf.vocab_size} but the "
                                 f"target's is {target_vocab}")
    bad = [i for i in conf.target_layer_ids if not 0 <= i < target_layers]
    if bad:
        raise DrafterConfigError(f"{where}: dflash_config.target_layer_ids {bad} out of range "
                                 f"for a target with {target_layers} layers")


def canonical_weights(conf: DraftConfig, items: Iterable[tuple[str, Any]]) -> dict:
    """Checkpoint (name, tensor) pairs under our names, by upstream `load_weights`' rules:
    a `model.` prefix dropped, the `encoder.` aliases mapped, SGLang's fused `qkv_proj` [q; k; v]
    and `gate_up_proj` [gate; up] split back. Names of neither layout pass through (ignored
    later, as upstream ignores them)."""
    q, kv = conf.num_heads * conf.head_dim, conf.num_kv_heads * conf.head_dim
    inter = conf.intermediate_size
    out: dict = {}
    for name, tensor in items:
        name = WEIGHT_ALIASES.get(name, name).removeprefix("model.")
        name = WEIGHT_ALIASES.get(name, name)
        if name.endswith("self_attn.qkv_proj.weight") and tensor.shape[0] == q + 2 * kv:
            stem = name.removesuffix("qkv_proj.weight")
            out[stem + "q_proj.weight"], out[stem + "k_proj.weight"], \
                out[stem + "v_proj.weight"] = tensor.split([q, kv, kv], dim=0)
        elif name.endswith("mlp.gate_up_proj.weight") and tensor.shape[0] == 2 * inter:
            stem = name.removesuffix("gate_up_proj.weight")
            out[stem + "gate_proj.weight"], out[stem + "up_proj.weight"] = tensor.split(
                [inter, inter], dim=0)
        else:
            out[name] = tensor
    return out


def refuse_pickles(folder: Path) -> None:
    """No pickle file may sit in a drafter folder: it is never loaded, and a folder that holds
    one is refused rather than half-trusted (mask_embedding.pt included: upstream merges it with
    torch.load, a pickle)."""
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if "mask_embedding.pt" in pickles:
        raise DrafterConfigError(
            f"{folder / 'mask_embedding.pt'}: a trained mask embedding in a pickle; refused "
            "(pickle files are never loaded; this drafter needs its mask row merged into the "
            "target's embedding, which this server does not do)")
    if pickles:
        raise DrafterConfigError(f"{folder}: pickle weights are refused ({', '.join(pickles)}); "
                                 "keep only *.safetensors in the drafter folder")


def load_draft_weights(conf: DraftConfig, device: str = "cpu") -> dict:
    """Load the safetensors weights and check names, shapes and finiteness."""
    import torch
    from safetensors import safe_open

    files = sorted(conf.path.glob("*.safetensors"))
    refuse_pickles(conf.path)
    if not files:
        raise DrafterConfigError(f"{conf.path}: no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device=device) as handle:
                weights.update(canonical_weights(
                    conf, ((k, handle.get_tensor(k)) for k in handle.keys())))
        except DrafterConfigError:
            raise
        except Exception as exc:
            raise DrafterConfigError(f"{f}: unreadable safetensors ({exc})") from exc
    for name, shape in conf.expected_shapes().items():
        if name not in weights:
            raise DrafterConfigError(f"{conf.path}: missing weight '{name}'")
        if tuple(weights[name].shape) != shape:
            raise DrafterConfigError(f"{conf.path}: weight '{name}' has shape "
                                     f"{tuple(weights[name].shape)}, expected {shape}")
        if not torch.isfinite(weights[name]).all():
            raise DrafterConfigError(f"{conf.path}: weight '{name}' has NaN/inf values")
    return weights


def spread_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """`count` target layers spread evenly from layer 1 to L-3 (the middle one if count is 1)."""
    if count == 1:
        return [num_target_layers // 2]
    lo, hi = 1, max(1, num_target_layers - 3)
    return sorted({round(lo + (hi - lo) * k / (count - 1)) for k in range(count)})


def make_draft_config(target_cfg: dict, num_layers: int = 2, block_size: int = 16,
                      num_features: int | None = None, gru_hidden_dim: int = 256,
                      emb_dim: int = 64, mask_token_id: int | None = None) -> dict:
    """A fresh drafter config.json (upstream layout) sized for a target's config.json."""
    hidden = target_cfg["hidden_size"]
    heads = target_cfg["num_attention_heads"]
    vocab = target_cfg["vocab_size"]
    count = num_features or max(3, num_layers)
    layer_ids = spread_layer_ids(target_cfg["num_hidden_layers"], count)
    rope = target_cfg.get("rope_parameters") or {}
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "block_size": block_size,
        "hidden_size": hidden,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": target_cfg.get("num_key_value_heads", heads),
        "head_dim": target_cfg.get("head_dim", hidden // heads),
        "intermediate_size": target_cfg["intermediate_size"],
        "rms_norm_eps": float(target_cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(target_cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
        "max_position_embeddings": target_cfg.get("max_position_embeddings", 8192),
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "dflash_config": {
            "target_layer_ids": layer_ids,
            # A token the chat never produces; SmolLM2's <|endoftext|> (0) by default.
            "mask_token_id": 0 if mask_token_id is None else mask_token_id,
            "projector_type": "domino",
            "shift_label": True,
            "pure_draft_prefix_len": 1,
            "gru_hidden_dim": gru_hidden_dim,
            "emb_dim": emb_dim,
        },
    }

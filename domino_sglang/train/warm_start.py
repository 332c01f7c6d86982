"""The drafter a run starts from: its config, and its weights warm-started or grown.

A fresh drafter copies the target's last decoder layers and final norm (`warm_start_weights`);
an `init` drafter is copied, or grown function-preservingly (more layers: `grow_drafter`, a
wider head: `grow_head`, a new copy gate: `add_copy_gate`). `write_start_drafter` writes the
result to out/init, which the run then loads. Depends on config.py and domino_sglang.model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from domino_sglang.model.config import load_draft_config, make_draft_config
from domino_sglang.model.drafter import init_drafter_weights, save_drafter
from domino_sglang.train.config import TrainConfig


def drafter_config(conf: TrainConfig, target: Path) -> dict:
    """The trained drafter's config.json: init's (grown by add_layers), or a new one. A drafter
    trained on short blocks says so (`short_draft`: the server then drafts only the L tokens a
    round verifies); one trained from such a drafter without them keeps init's flag."""
    if conf.init:
        cfg = json.loads((Path(conf.init) / "config.json").read_text())
        cfg["num_hidden_layers"] = cfg.get("num_hidden_layers", 0) + conf.add_layers
        head = cfg["dflash_config"]
        head["gru_hidden_dim"] = head.get("gru_hidden_dim", 0) + conf.grow_gru
        head["emb_dim"] = head.get("emb_dim", 0) + conf.grow_emb
    else:
        cfg = make_draft_config(json.loads((target / "config.json").read_text()),
                                num_layers=conf.num_layers, block_size=conf.block_size,
                                num_features=conf.num_features,
                                gru_hidden_dim=conf.gru_hidden_dim, emb_dim=conf.emb_dim)
    if conf.short_blocks > 0:
        cfg["dflash_config"]["short_draft"] = True
    if conf.copy_gate:
        cfg["dflash_config"]["copy_gate"] = True
    return cfg


def add_copy_gate(weights: dict, hidden: int, bias: float = -2.0) -> dict:
    """A new copy gate for a drafter without one (pointer.py): w = 0, b = `bias`, so it starts
    as g = sigmoid(b) everywhere (0.12) and learns from there."""
    from domino_sglang.model.config import COPY_MAX_MATCH

    return {**weights, "copy_gate.weight": torch.zeros(1, hidden + COPY_MAX_MATCH + 1),
            "copy_gate.bias": torch.full((1,), bias)}


def warm_start_weights(target: Path, dconf, first: int = 0, count: int = -1) -> dict:
    """Start the backbone from the target's LAST decoder layers and final norm (same widths).

    Drafter layer i takes target layer n_target - first + i (first = 0: num_layers), for the
    first `count` drafter layers (-1: all).

    z feeds the target's lm_head, which expects states shaped like the target's final-normed
    ones; copying the final norm and top layers starts the base logits near the target's own
    next-token distribution instead of at a random start's far higher cross-entropy
    (docs/training.md). q_norm/k_norm (absent in Llama targets) stay at 1.
    """
    from safetensors import safe_open

    files = sorted(target.glob("*.safetensors"))
    tensors = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            for name in sf.keys():
                tensors[name] = sf.get_tensor(name)
    n_target = 1 + max(int(k.split(".")[2]) for k in tensors if k.startswith("model.layers."))
    out = {}
    if tensors.get("model.norm.weight") is not None:
        out["norm.weight"] = tensors["model.norm.weight"].float()
    shapes = dconf.expected_shapes()
    first = first or dconf.num_layers
    for i in range(dconf.num_layers if count < 0 else count):
        src = f"model.layers.{n_target - first + i}."
        for name in shapes:
            if name.startswith(f"layers.{i}.") and not name.endswith(("q_norm.weight",
                                                                      "k_norm.weight")):
                t = tensors.get(src + name[len(f"layers.{i}."):])
                if t is not None and tuple(t.shape) == shapes[name]:
                    out[name] = t.float()
    return out


def grow_drafter(src: Path, target: Path, add: int) -> dict:
    """The weights of drafter `src` with `add` more decoder layers inserted BELOW its own.

    Net2Net-style growth (Chen et al., 2016): each new layer is a pre-norm residual block
    x + o_proj(attn(.)) + down_proj(mlp(.)), so with o_proj and down_proj at ZERO it is the
    identity and the grown drafter computes exactly what `src` did; training then starts from
    src's loss instead of a fresh drafter's. The other weights come from the target's layers
    just below the ones src was warm-started from (same widths), so once the output projections
    move the new layers start from features the target itself computes there.
    """
    from safetensors.torch import load_file

    n_old = load_draft_config(src).num_layers
    grown = {}
    for name, t in load_file(str(src / "model.safetensors")).items():  # src's layers move up
        if name.startswith("layers."):
            i, rest = name[len("layers."):].split(".", 1)
            name = f"layers.{int(i) + add}.{rest}"
        grown[name] = t.float()
    if not add:
        return grown
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = n_old + add
    big = _load_conf_from_dict(cfg, src / ".grow-config")
    # target layers n_target - n_old - add .. n_target - n_old - 1 become drafter layers 0..add-1
    warm = warm_start_weights(target, big, first=add + n_old, count=add)
    fresh = init_drafter_weights(big, seed=0)
    for name in big.expected_shapes():
        if name.startswith("layers.") and int(name.split(".")[1]) < add:
            grown[name] = warm.get(name, fresh[name])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                grown[name] = torch.zeros_like(grown[name])
    return grown


def grow_head(weights: dict, add_gru: int, add_emb: int, seed: int = 0, std: float = 0.02
              ) -> dict:
    """Drafter `weights` with the causal head widened: `add_gru` more GRU units, `add_emb` more
    ranks in the low-rank correction W2 silu(W1 [z; s]).

    Function-preserving like grow_drafter: the new weights are random (std) except where they
    would reach the old outputs, which are zero: the old GRU units read no new unit (W_h* new
    columns), W1's old rows read no new unit, and W2's new columns are zero, so the grown head
    corrects exactly as before. Gradients reach every new weight (the new states are non-zero
    and W2's new columns are the first to move, as with LoRA's zero B).
    """
    if not add_gru and not add_emb:
        return weights
    gen = torch.Generator().manual_seed(seed)
    ih, hh = weights["prefix_gru.weight_ih_l0"].float(), weights["prefix_gru.weight_hh_l0"].float()
    w1, w2 = weights["embed_proj.0.weight"].float(), weights["embed_proj.2.weight"].float()
    g, e = hh.shape[1], w1.shape[0]  # old widths; ih [3g, H], hh [3g, g], w1 [e, H+g], w2 [V, e]
    h, big_g, big_e = ih.shape[1], g + add_gru, e + add_emb

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    new_ih = torch.cat((ih.view(3, g, h), rand(3, add_gru, h)), dim=1)  # [3, G, H]: r, z, n gates
    new_hh = rand(3, big_g, big_g)  # [3, G, G]
    new_hh[:, :g, :g] = hh.view(3, g, g)
    new_hh[:, :g, g:] = 0  # old units never read new ones
    new_w1 = rand(big_e, h + big_g)  # [E, H+G]
    new_w1[:e, : h + g] = w1
    new_w1[:e, h + g:] = 0  # the old ranks never read the new units
    new_w2 = torch.cat((w2, torch.zeros(w2.shape[0], add_emb)), dim=1)  # [V, E]: new ranks silent
    return {**weights, "prefix_gru.weight_ih_l0": new_ih.reshape(3 * big_g, h),
            "prefix_gru.weight_hh_l0": new_hh.reshape(3 * big_g, big_g),
            "embed_proj.0.weight": new_w1, "embed_proj.2.weight": new_w2}


def write_start_drafter(out: Path, conf: TrainConfig, target: Path, dcfg: dict) -> None:
    """Write the drafter a run starts from to out/init, in upstream layout (saving it validates
    `dcfg`, its config.json from drafter_config): `init` as is, `init` grown (add_layers,
    grow_gru, grow_emb, a copy gate it lacks), or a fresh drafter warm-started from `target`."""
    seed_dir = out / "init"
    init_gate = conf.init and json.loads((Path(conf.init) / "config.json").read_text())[
        "dflash_config"].get("copy_gate", False)
    if conf.init and (conf.add_layers or conf.grow_gru or conf.grow_emb
                      or (conf.copy_gate and not init_gate)):
        weights = grow_drafter(Path(conf.init), target, conf.add_layers)
        weights = grow_head(weights, conf.grow_gru, conf.grow_emb, seed=conf.seed)
        if conf.copy_gate and not init_gate:
            weights = add_copy_gate(weights, dcfg["hidden_size"])
        save_drafter(seed_dir, dcfg, weights, dtype=torch.float32)
    elif conf.init:
        import shutil

        shutil.copytree(conf.init, seed_dir)
    else:
        dconf0 = _load_conf_from_dict(dcfg, out / ".init-config")
        weights = init_drafter_weights(dconf0, seed=conf.seed)
        if conf.warm_start:
            weights.update(warm_start_weights(target, dconf0))
        save_drafter(seed_dir, dcfg, weights, dtype=torch.float32)


def _load_conf_from_dict(cfg: dict, scratch: Path):
    """Validate a drafter config dict through the same parser the server uses."""
    from domino_sglang.model.config import parse_draft_config

    return parse_draft_config(cfg, scratch)

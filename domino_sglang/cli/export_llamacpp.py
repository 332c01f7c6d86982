"""`domino-sglang export-llamacpp`: a drafter's backbone as llama.cpp's converter reads a DSpark
draft model, so llama.cpp's `--spec-type draft-dspark` can run it.

llama.cpp's block drafters (its `draft-dflash` and `draft-dspark` speculative types) run the
same backbone as ours: the target layers' features through `fc` and `hidden_norm` as the
context's keys and values, the block [x_t, MASK x (B - 1)] attended without a causal mask, the
target's embeddings and lm head. They differ in which slots become drafts: `draft-dflash` reads
slots 1 .. n, a drafter whose slot k predicts the token at k; ours predicts x_{t+k+1} at slot k
(`shift_label`), the convention of `draft-dspark` with `sample_from_anchor` (its converter's
default for a DFlash-lineage config), which reads slots 0 .. n - 1. So the export is the
checkpoint with `architectures: ["DSparkDraftModel"]`, the same `dflash_config` (target layer
ids, mask token id, block size), and:
  - the backbone's weights under their own names; the head (prefix GRU, low-rank correction)
    and the copy gate left out: llama.cpp has no place for them, so its drafts are the bare
    backbone's (this server's `--speculative-domino-debug-head off --speculative-domino-debug-
    copy off`);
  - a draft vocabulary (draft_vocab.json) as DSpark's: `lm_head.weight` the target's lm-head
    rows of its tokens [Vd, H] and `d2t` [Vd] int64 their offsets (id - index), which the
    converter turns back into absolute ids.
Then, with llama.cpp's source:

    python convert_hf_to_gguf.py OUT --target-model-dir TARGET --outtype bf16 --outfile d.gguf
    llama-server -m target.gguf -md d.gguf --spec-type draft-dspark --spec-draft-n-max 15

Written into a temporary folder beside OUT and renamed at the end: OUT appears whole or not at
all. Reads safetensors only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from domino_sglang import paths
from domino_sglang.cli.common import fail

ARCHITECTURE = "DSparkDraftModel"  # llama.cpp's converter: DFlash + anchor-slot drafts
LEFT_OUT = ("prefix_gru.", "embed_proj.", "copy_gate.")  # the head and the copy gate


def target_lm_head(target: Path):
    """The target's lm-head weight [V, H] from its safetensors (its embeddings when tied)."""
    import torch
    from safetensors import safe_open

    cfg = json.loads((target / "config.json").read_text())
    cfg = {**cfg, **cfg.get("text_config", {})}
    names = (["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings")
             else ["lm_head.weight", "model.embed_tokens.weight"])
    for name in names:
        for part in sorted(target.glob("*.safetensors")):
            with safe_open(str(part), framework="pt") as f:
                if name in f.keys():
                    return f.get_tensor(name).to(torch.bfloat16)
    raise ValueError(f"{target}: no {' or '.join(names)} in its safetensors")


def export_llamacpp(drafter: Path, out: Path, target: Path) -> tuple[list[str], int]:
    """Write the export (module docstring) to `out`; returns (the tensors' names, the block
    size)."""
    import torch
    from safetensors.torch import save_file

    from domino_sglang.model.config import load_draft_config, load_draft_weights
    from domino_sglang.model.vocab import load_draft_vocab

    conf = load_draft_config(drafter)
    if not conf.shift_label:
        raise ValueError(f"{drafter}: dflash_config.shift_label is false; llama.cpp's DSpark "
                         "reads anchor-slot drafts (shift_label true) only")
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in load_draft_weights(conf).items()
               if not k.startswith(LEFT_OUT)}
    config = dict(conf.raw)
    config["architectures"] = [ARCHITECTURE]
    config["dflash_config"] = {**config.get("dflash_config", {}),
                               "target_layer_ids": list(conf.target_layer_ids),
                               "mask_token_id": conf.mask_token_id,
                               "block_size": conf.block_size}
    ids = load_draft_vocab(drafter, conf.vocab_size)  # [Vd] ascending token ids, or None
    if ids is not None:
        head = target_lm_head(target)
        if tuple(head.shape) != (conf.vocab_size, conf.hidden_size):
            raise ValueError(f"{target}: lm head {tuple(head.shape)}, the drafter needs "
                             f"({conf.vocab_size}, {conf.hidden_size})")
        weights["lm_head.weight"] = head[ids].contiguous()  # [Vd, H]
        weights["d2t"] = ids.long() - torch.arange(len(ids))  # [Vd] offsets
        config["draft_vocab_size"] = len(ids)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(weights), conf.block_size


def cmd_export_llamacpp(args: argparse.Namespace) -> int:
    from domino_sglang.model.config import DrafterConfigError

    target = Path(args.target or paths.target_dir())
    if args.out.exists():
        fail(f"export-llamacpp: --out {args.out} exists (it is written whole or not at all)")
    if not (target / "config.json").is_file():
        fail(f"export-llamacpp: --target {target} is not a checkpoint folder (no config.json)")
    try:
        names, block = export_llamacpp(args.drafter, args.out, target)
    except (DrafterConfigError, ValueError, OSError) as exc:
        fail(f"export-llamacpp: {exc}")
    print(f"{args.out}: {len(names)} tensors; next, with llama.cpp's source: python "
          f"convert_hf_to_gguf.py {args.out} --target-model-dir {target} --outtype bf16, then "
          "llama-server -md <that gguf> --spec-type draft-dspark --spec-draft-n-max "
          f"{block - 1}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `export-llamacpp` subcommand and its flags."""
    e = sub.add_parser("export-llamacpp",
                       help="write a drafter's backbone for llama.cpp's converter (draft-dspark)")
    e.add_argument("drafter", type=Path, help="drafter folder")
    e.add_argument("--out", type=Path, required=True, help="the folder to write (must not exist)")
    e.add_argument("--target", default=None,
                   help="the target's folder, whose lm head gives a draft vocabulary's rows "
                        "(default: the prepared demo target)")

"""Served tau against an offline replay of the same tokens: does the worker draft as trained?

Per prompt, the DOMINO server (full block every round, greedy) generates `--max-tokens` tokens;
then the same drafter runs in plain PyTorch (the trainer's `TargetFeatures` + `DrafterTrainModule`:
transformers target features in the serving dtype) over prompt + those tokens, round by round as
the worker does:

    a = first generated position; repeat:  draft the block [x_a, MASK x (B-1)] from the target
    features of positions < a; k = longest prefix of drafts equal to x_{a+1..}; a += k + 1

Rounds are counted until every generated token is committed, so served and replayed tau share one
definition (generated tokens / verify rounds; the prefill's first token is in the numerator, as
in benchmarks/acceptance.py). Equal taus (up to bf16 argmax ties: SGLang's CPU kernels vs
transformers) mean serving reproduces the drafter's math, so any gap to the training-time
evaluation is the data, not the worker; a real gap localises a serving bug. Also reported: the
replay with the head off, and `rollout_tau` (random anchors, as `domino-sglang train` evaluates).

    python benchmarks/studies/replay.py --sets mtbench gsm8k --limit 3 --max-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import requests
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
import provenance  # noqa: E402

from domino_sglang import paths  # noqa: E402
from domino_sglang.cli.local_server import start_server  # noqa: E402
from domino_sglang.train import prompt_sets

RESULTS = Path(__file__).resolve().parents[1] / "results"


def serve_records(drafter: Path, prompts: dict[str, list[list[int]]], max_tokens: int,
                  head: bool) -> dict[str, list[dict]]:
    """Greedy generations of the DOMINO server (fixed block): ids, start, served verify rounds."""
    options = ["--speculative-domino-adaptive", "off",
               "--speculative-domino-debug-head", "on" if head else "off"]
    out: dict[str, list[dict]] = {}
    with start_server("replay", ["--drafter", str(drafter)], options) as srv:
        for name, items in prompts.items():
            out[name] = []
            for i, ids in enumerate(items):
                body = {"input_ids": ids, "sampling_params": {
                    "max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
                r = requests.post(f"{srv.url}/generate", json=body, timeout=1200)
                r.raise_for_status()
                res = r.json()
                gen = list(res["output_ids"])
                out[name].append({"id": i, "ids": ids + gen, "start": len(ids),
                                  "rounds": int(res["meta_info"]["spec_verify_ct"])})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", nargs="+", default=["mtbench", "humaneval", "gsm8k"])
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--drafter", type=Path, default=paths.shipped_drafter_dir())
    ap.add_argument("--out", default="replay")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from transformers import AutoTokenizer

    from domino_sglang.model.config import load_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.model.vocab import load_draft_vocab
    from domino_sglang.train.config import TrainConfig
    from domino_sglang.train.evaluate import replay_rounds, rollout_tau
    from domino_sglang.train.features import TargetFeatures
    from domino_sglang.train.module import DrafterTrainModule
    from domino_sglang.train.regenerate import chat_prompt_ids

    tok = AutoTokenizer.from_pretrained(str(paths.target_dir()))
    prompts = {s: [chat_prompt_ids(tok, p) for p in prompt_sets.load(s, args.limit)]
               for s in args.sets}
    served = {h: serve_records(args.drafter, prompts, args.max_tokens, h) for h in (True, False)}

    dconf = load_draft_config(args.drafter)
    feats = TargetFeatures(paths.target_dir(), list(dconf.target_layer_ids), torch.bfloat16)
    drafter = DominoDrafter.from_pretrained(dconf, dtype=torch.float32).eval()
    module = DrafterTrainModule(drafter, feats.embed_weight, feats.lm_head_weight,
                                load_draft_vocab(dconf.path, dconf.vocab_size))  # as served
    evconf = TrainConfig(anchors=8)
    rows, results = [], {}
    for s in args.sets:
        r: dict = {}
        for h, label in ((True, "head"), (False, "backbone")):
            recs = served[h][s]
            gen = sum(len(x["ids"]) - x["start"] for x in recs)
            if any(x["ids"] != y["ids"] for x, y in zip(recs, served[True][s])):
                print(f"warning: {s}: head-off generation differs from head-on (not lossless?)")
            r[f"served_{label}"] = round(gen / sum(x["rounds"] for x in recs), 3)
            r[f"replay_{label}"] = round(
                gen / sum(replay_rounds(module, feats, x, h) for x in recs), 3)
        recs = [{**x, "id": 1_000 * i + x["id"]} for i, x in enumerate(served[True][s])]
        r.update({k: round(v, 3) for k, v in rollout_tau(module, feats, recs, evconf).items()})
        results[s] = r
        rows.append(f"| {s} | {r['served_head']} | {r['replay_head']} | {r['served_backbone']} | "
                    f"{r['replay_backbone']} | {r['tau_rollout_final']} | "
                    f"{r['tau_rollout_base']} |")
        print(rows[-1], flush=True)

    meta = provenance.collect()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"meta": meta, "args": {k: str(v) for k, v in vars(args).items()},
         "results": results}, indent=1))
    md = [f"# Served vs replayed tau ({args.limit} prompts per set, {args.max_tokens} tokens)", "",
          provenance.markdown_header(meta), f"- drafter: `{args.drafter}`", "",
          "| dataset | served DOMINO | replay DOMINO | served head off | replay head off | "
          "rollout_tau head | rollout_tau head off |", "|---|---|---|---|---|---|---|", *rows]
    (RESULTS / f"{args.out}.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()

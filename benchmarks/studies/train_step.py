"""What a training step costs, full vocabulary vs a draft vocabulary (TrainConfig draft_vocab).

Runs the real trainer (`train`) for a few steps per variant on a recipe's data, init drafter and
cached target features (the run folder's features/, linked, so no target forward is timed), and
reports the median wall time of a step (forward, backward, optimiser) after a warm-up. The
variants see the same records and anchors (the data order is a function of seed and step).

    python benchmarks/studies/train_step.py --recipe domino_sglang/train/recipes/smollm2-135m.toml \
        --phase stage9
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # provenance, ..
import provenance  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs


def recipe_phase(recipe: Path, phase: str | None, overrides: dict | None = None):
    """The TrainConfig of one phase of `recipe` (default: its last; a recipe without phases is
    its own), with `overrides` on top."""
    from domino_sglang.train.recipe import load_recipe

    phases, _ = load_recipe(recipe, overrides)
    if phase is None:
        return phases[-1].conf
    for p in phases:
        if p.name == phase:
            return p.conf
    raise SystemExit(f"train_step: {recipe} has no phase {phase!r} "
                     f"(phases: {', '.join(p.name for p in phases)})")


def time_steps(recipe: Path, phase: str | None, features: Path, draft_vocab: int, steps: int,
               warmup: int, scratch: Path) -> list[float]:
    """Seconds per step (after `warmup` steps) of `steps` trainer steps."""
    from dataclasses import replace

    from domino_sglang.train.loop import train

    out = scratch / f"vocab-{draft_vocab}"
    out.mkdir(parents=True)
    (out / "features").symlink_to(features.resolve(), target_is_directory=True)
    conf = recipe_phase(recipe, phase, {"steps": steps, "draft_vocab": draft_vocab,
                                        "eval_records": 0, "save_every": steps,
                                        "log_every": steps})
    conf = replace(conf, out=str(out))
    stamps: list[float] = []
    train(conf, progress=False, on_step=lambda step, _: stamps.append(time.perf_counter()))
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return gaps[warmup:-1]  # the last step also saves the checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", type=Path, required=True, help="TOML recipe (data, init, sizes)")
    ap.add_argument("--phase", default=None,
                    help="the recipe's phase to time (default: its last)")
    ap.add_argument("--features", type=Path, default=None,
                    help="target feature cache to reuse (default: the recipe's out/features)")
    ap.add_argument("--variants", nargs="+", type=int, default=[0, 8192],
                    help="draft_vocab values (0: the full vocabulary)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="train_step")
    args = ap.parse_args()
    if args.steps < args.warmup + 3:
        ap.error("--steps must exceed --warmup by at least 3")
    if any(v < 0 for v in args.variants):
        ap.error("--variants must be >= 0")
    recipe = recipe_phase(args.recipe, args.phase)
    features = args.features or Path(recipe.out) / "features"
    if not features.is_dir():
        ap.error(f"--features {features} is not a folder (train the recipe once, or pass one)")
    torch.set_num_threads(args.threads)

    prov = provenance.collect()
    rows = []
    with tempfile.TemporaryDirectory(prefix="train-step-") as tmp:
        for v in args.variants:
            gaps = time_steps(args.recipe, args.phase, features, v, args.steps, args.warmup,
                              Path(tmp))
            rows.append({"draft_vocab": v or "full", "median_s_per_step":
                         round(statistics.median(gaps), 3), "steps_timed": len(gaps)})
            print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["median_s_per_step"]
    for row in rows:
        row["vs_first"] = round(row["median_s_per_step"] / base, 3)
    doc = {"provenance": prov, "recipe": str(args.recipe), "threads": args.threads,
           "steps": args.steps, "warmup": args.warmup, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"## Training step time by draft vocabulary ({args.recipe.name}, {args.threads} "
             f"threads)", "", provenance.markdown_header(prov),
             f"- {args.steps} steps per variant, the first {args.warmup} and the last (checkpoint) "
             "not timed; target features from the cache", "",
             "| draft vocabulary | median s/step | vs first | steps timed |", "|---|---|---|---|"]
    lines += [f"| {r['draft_vocab']} | {r['median_s_per_step']} | {r['vs_first']}x | "
              f"{r['steps_timed']} |" for r in rows]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

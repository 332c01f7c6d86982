"""The greedy head rollout on the CPU, the native fused positions (cpu/native.py NativeHead)
against the torch loop they replace: the shipped drafter's head in fp32 as a bf16 server runs
it (draft vocabulary, the default candidate pool, packed base logits, the pointer copy over a
host index), random backbone
states z, histories of 200 random tokens (indexed in the warm-up rounds, as a request's first
round does); milliseconds per rollout (base logits, copy index and positions), median of the
repeats, the two interleaved; and how many drafts the two agree on.

    OMP_NUM_THREADS=1 python benchmarks/studies/native_head.py --repeats 100
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # provenance
import provenance  # noqa: E402

from domino_sglang.cpu import argmax as cpu_argmax  # noqa: E402
from domino_sglang.cpu import linear as cpu_linear  # noqa: E402
from domino_sglang.cpu import native  # noqa: E402
from domino_sglang.model.config import DEFAULT_CANDIDATE_POOL, load_draft_config  # noqa: E402
from domino_sglang.model.drafter import DominoDrafter  # noqa: E402
from domino_sglang.model.vocab import load_draft_vocab  # noqa: E402
from domino_sglang.paths import shipped_drafter_dir, target_dir  # noqa: E402
from domino_sglang.spec import primitives  # noqa: E402
from domino_sglang.spec.history import HistoryIndexes  # noqa: E402
from domino_sglang.spec.pointer import CopyPaths  # noqa: E402
from domino_sglang.spec.rollout import HeadParams, greedy_rollout  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs
CASES = [(1, 2), (1, 5), (1, 16), (4, 5), (8, 5), (4, 16)]  # (requests, verified length L)


class Req:
    """What the copy index reads of an SGLang request."""

    def __init__(self, rid: str, ids: list[int]):
        self.rid, self.origin_input_ids, self.output_ids = rid, ids, []


def served_head():
    """The shipped drafter's head as a bf16 CPU server builds it (worker.py), and its gate."""
    from safetensors.torch import load_file

    conf = load_draft_config(shipped_drafter_dir())
    drafter = DominoDrafter.from_pretrained(conf, dtype=torch.bfloat16).eval()
    weights = {}
    for f in sorted(target_dir().glob("*.safetensors")):
        weights.update(load_file(f))
    table = weights["model.embed_tokens.weight"].to(torch.bfloat16)
    lm_head = weights.get("lm_head.weight", table).to(torch.bfloat16)
    head = HeadParams.of(drafter, torch.nn.Embedding.from_pretrained(table), lm_head,
                         torch.float32)
    head = head.with_vocab(load_draft_vocab(conf.path, conf.vocab_size))
    head.base_linear = functools.partial(cpu_linear.packed_linear,
                                         packed=cpu_linear.pack(head.vocab_lm_head))
    primitives.install(argmax=cpu_argmax.argmax)
    return head, drafter.copy_gate.to(torch.float32), native.native_head(head)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--out", default="native_head")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not native.available():
        sys.exit(f"native_head: no native kernels here: {native.unavailable_reason()}")
    head, gate, fused = served_head()
    rng = random.Random(0)
    rows = []
    for bs, length in CASES:
        reqs = [Req(f"{bs}-{length}-{b}", [rng.randrange(400) for _ in range(200)])
                for b in range(bs)]
        bonus = torch.tensor([r.origin_input_ids[-1] for r in reqs])
        z = (torch.randn(bs, length, head.lm_head_weight.shape[1]) * 2).bfloat16()
        times: dict[str, list[float]] = {"native": [], "torch": []}
        chains = {}
        # each variant's copy indexes, built in the warm-up rounds (a request's first round)
        paths = {name: CopyPaths(gate, "cpu", on_device=False,
                                 histories=HistoryIndexes(length - 1)) for name in times}
        for _ in range(args.repeats + 5):
            for name in ("native", "torch"):
                head.native = fused if name == "native" else None
                with torch.no_grad():
                    start = time.perf_counter()
                    copy = paths[name].for_round(reqs, bonus, length - 1)
                    chains[name] = greedy_rollout(z, bonus, head, DEFAULT_CANDIDATE_POOL,
                                                  copy=copy)
                    times[name].append((time.perf_counter() - start) * 1e3)
        med = {k: statistics.median(v[5:]) for k, v in times.items()}
        same = int((chains["native"] == chains["torch"]).sum())
        rows.append({"bs": bs, "L": length, "native_ms": round(med["native"], 3),
                     "torch_ms": round(med["torch"], 3), "same_drafts": same,
                     "drafts": chains["torch"].numel()})
    prov = provenance.collect()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"provenance": prov, "repeats": args.repeats, "rows": rows}, indent=2) + "\n")
    lines = ["## The greedy head rollout, native fused positions vs the torch loop (ms, median)",
             "", provenance.markdown_header(prov), "",
             "| requests | L | native | torch | torch / native | same drafts |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['bs']} | {r['L']} | {r['native_ms']} | {r['torch_ms']} | "
                     f"{r['torch_ms'] / r['native_ms']:.2f}x | {r['same_drafts']} / "
                     f"{r['drafts']} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

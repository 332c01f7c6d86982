"""bf16 greedy decoding on the CPU with and without the native kernels (cpu/native.c): how far
it follows fp32 greedy decoding, and whether DOMINO's output equals plain decoding's token for
token and whatever the batch (one request at a time, four in flight).

Serves the demo target plain in fp32, then plain and DOMINO (served default) in bf16 with the
native kernels and with DOMINO_SGLANG_NO_NATIVE_KERNELS=1, one server at a time; the benchmark
prompts of the test suite, greedy, ignore_eos.

    python benchmarks/studies/bf16_agreement.py --tokens 64
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # provenance
sys.path.insert(0, str(ROOT))  # tests.conftest: the prompts
import provenance  # noqa: E402

from domino_sglang.cli.local_server import start_server  # noqa: E402
from domino_sglang.paths import target_dir  # noqa: E402
from tests.conftest import PROMPTS  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs
OFF = {"DOMINO_SGLANG_NO_NATIVE_KERNELS": "1"}


def generate(url: str, ids: list[int], tokens: int) -> list[int]:
    r = requests.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": {
        "temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}}, timeout=600)
    r.raise_for_status()
    return r.json()["output_ids"]


def serve_and_generate(name: str, args: list[str], env: dict, prompts: list, tokens: int,
                       batched: bool) -> dict[str, list]:
    with start_server(name, args, env=env) as server:
        out = {"c1": [generate(server.url, ids, tokens) for ids in prompts]}
        if batched:
            with ThreadPoolExecutor(4) as pool:
                out["c4"] = list(pool.map(lambda ids: generate(server.url, ids, tokens),
                                          prompts))
    return out


def prefix_agreement(got: list, want: list) -> int:
    total = 0
    for g, w in zip(got, want):
        n = 0
        while n < min(len(g), len(w)) and g[n] == w[n]:
            n += 1
        total += n
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default="bf16_agreement")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir())
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                       add_generation_prompt=True, return_dict=False)
               for p in PROMPTS]
    plain = ["--no-speculation"]
    fp32 = serve_and_generate("agree-fp32", plain + ["--dtype", "float32"], {}, prompts,
                              args.tokens, batched=False)["c1"]
    rows = []
    for kernels, env in (("native", {}), ("torch / oneDNN", OFF)):
        bf16 = ["--dtype", "bfloat16"]
        ar = serve_and_generate("agree-ar", plain + bf16, env, prompts, args.tokens, True)
        domino = serve_and_generate("agree-domino", bf16, env, prompts, args.tokens, True)
        reference = ar["c1"]
        rows.append({
            "kernels": kernels,
            "fp32_prefix_tokens": prefix_agreement(reference, fp32),
            "fp32_identical": sum(a == b for a, b in zip(reference, fp32)),
            **{f"{name}_identical": sum(a == b for a, b in zip(outs, reference))
               for name, outs in (("ar_c4", ar["c4"]), ("domino_c1", domino["c1"]),
                                  ("domino_c4", domino["c4"]))},
        })
    total, n = sum(map(len, fp32)), len(prompts)
    prov = provenance.collect()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"provenance": prov, "tokens": args.tokens, "prompts": n, "rows": rows}, indent=2) + "\n")
    lines = [f"## bf16 greedy decoding, native kernels or not ({n} prompts x {args.tokens} "
             "tokens)", "", provenance.markdown_header(prov), "",
             "Sequences identical to plain bf16 decoding one request at a time (c = 1), and how "
             "far plain bf16 follows fp32 greedy decoding.", "",
             "| kernels | plain bf16 vs fp32: prefix tokens | identical | plain c = 4 | "
             "DOMINO c = 1 | DOMINO c = 4 |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kernels']} | {r['fp32_prefix_tokens']} / {total} | "
                     f"{r['fp32_identical']} / {n} | {r['ar_c4_identical']} / {n} | "
                     f"{r['domino_c1_identical']} / {n} | {r['domino_c4_identical']} / {n} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

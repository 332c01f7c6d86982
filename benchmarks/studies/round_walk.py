"""Walk served decode rounds: which domino_sglang modules a round enters, and from where.

A DOMINO server (the served default, the shipped drafter) runs with benchmarks/studies/walk_site
on its PYTHONPATH: its sitecustomize.py profiles each decode round in the scheduler process and logs
every call that crosses from one domino_sglang module into another (through SGLang or not).
Requests: four greedy ones (one whose answer repeats, for prompt-lookup rounds), then the same
four sampled at T = 0.7, two at a time.
Per kind of round (plain / draft / copy / mixed, greedy or sampled) the table gives, for each
module the round enters:
  - entry points: the distinct functions of the module called from another module (the static
    call graph that kind of round exercises, over every round of the kind recorded);
  - from: the modules those calls come from;
  - calls / round: the dynamic count of such calls, the most in one round;
  - climbs: calls into a module that imports the caller (a call back up the import order).

    python benchmarks/studies/round_walk.py                      # this checkout
    python benchmarks/studies/round_walk.py --base-tree /tmp/base --out round_walk_base
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
import provenance  # noqa: E402
from serving import RESULTS, one_request  # noqa: E402

from domino_sglang.cli.local_server import start_server  # noqa: E402

SITE = Path(__file__).resolve().parent / "walk_site"
REPEATS = "Write the word 'alpha beta gamma delta' ten times, separated by commas."
PROMPTS = ["Explain how a hash table handles collisions.", REPEATS,
           "List the first twenty prime numbers.", "What is the capital of France? Explain."]


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the domino_sglang modules it imports (anywhere in its source)."""
    graph: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        name = str(path.relative_to(package.parent).with_suffix("")).replace(os.sep, ".")
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("domino_"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("domino_"))
        graph[name] = found
    return graph


def walk_table(rounds: list[dict], imports: dict[str, set[str]]) -> dict[str, dict]:
    """Per round kind: module -> entry points, from-modules, max calls per round, climbs."""
    kinds: dict[str, dict] = {}
    for r in rounds:
        kind = f"{r['kind'].split('+')[0]} {'sampled' if r['sampled'] else 'greedy'}"
        table = kinds.setdefault(kind, {"rounds": 0, "modules": defaultdict(
            lambda: {"entries": set(), "from": set(), "calls": 0, "climbs": set()})})
        table["rounds"] += 1
        per_round: dict[str, int] = defaultdict(int)
        for src, src_fn, dst, dst_fn, _direct, n in r["edges"]:
            row = table["modules"][dst]
            row["entries"].add(dst_fn)
            row["from"].add(src)
            per_round[dst] += n
            if src in imports.get(dst, ()):  # dst imports src: a call back up
                row["climbs"].add(f"{src}.{src_fn} -> {dst_fn}")
        for dst, n in per_round.items():
            row = table["modules"][dst]
            row["calls"] = max(row["calls"], n)
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-tree", type=Path, default=None,
                    help="serve that checkout's domino_sglang instead (a before/after walk)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default="round_walk")
    args = ap.parse_args()
    prov = provenance.collect()
    tree = (args.base_tree or provenance.ROOT).resolve()
    log = Path(tempfile.mkdtemp()) / "walk.jsonl"
    env = {"DOMINO_WALK_OUT": str(log), "PYTHONPATH": os.pathsep.join(
        [str(SITE)] + ([str(tree)] if args.base_tree else []))}
    if args.base_tree:
        env["PYTHONSAFEPATH"] = "1"  # the base tree's package, not this checkout's
    server = start_server("round-walk", ["--dtype", args.dtype], env=env)
    try:
        for temperature in (0.0, 0.7):
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda p, t=temperature: one_request(
                    server.url, p, args.max_tokens, t), PROMPTS))
    finally:
        server.stop()
    rounds = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = walk_table(rounds, import_graph(tree / "domino_sglang"))
    RESULTS.mkdir(exist_ok=True)
    served = tree.name if args.base_tree else "this checkout"
    lines = [f"# Module walk of served decode rounds ({served})", "",
             provenance.markdown_header(prov),
             f"- served tree: {provenance.git_revision(tree)}; {len(rounds)} rounds recorded", "",
             "Entry points: distinct functions of the module called from another domino_sglang "
             "module in rounds of that kind; calls / round: the most such calls in one round; "
             "climbs: calls into a module that imports the caller.", ""]
    summary = {}
    for kind, table in sorted(kinds.items()):
        mods = table["modules"]
        lines += [f"## {kind} ({table['rounds']} rounds)", "",
                  "| module | entry points | from | calls / round | climbs |",
                  "|---|---|---|---|---|"]
        for name, row in sorted(mods.items(), key=lambda kv: -len(kv[1]["entries"])):
            lines.append(f"| {name} | {len(row['entries'])}: {', '.join(sorted(row['entries']))} "
                         f"| {', '.join(sorted(row['from']))} | {row['calls']} "
                         f"| {len(row['climbs'])} |")
        summary[kind] = {"rounds": table["rounds"], "modules": {
            n: {"entries": sorted(r["entries"]), "from": sorted(r["from"]), "calls": r["calls"],
                "climbs": sorted(r["climbs"])} for n, r in mods.items()}}
        lines.append("")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"provenance": prov, "kinds": summary}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""The adaptive policy (spec/policy.py) against simulated drafters: how much of the best
achievable rate it gets when it must learn the drafter's acceptance from its own rounds.

A simulated drafter keeps the draft at position i with probability alpha_i given the ones before
it were kept (alpha_1, and one rate for i >= 2), independently per request and round; a
scenario is a cycle of stretches (hard requests, then easy ones) or one stationary drafter.
Rounds cost cost(bs, L) plain steps of a profile (policy.COSTS) scaled by k. The policy sees
only its rounds' accept lengths (calibration off: the costs are exact here). Reported per
scenario and batch size: committed tokens per plain step's time of the policy and of an oracle
that knows each stretch's drafter and runs its best fixed L (>= 1: plain decoding), and their
ratio, mean and min over seeds.

    python benchmarks/policy_sim.py --out policy_sim
    PYTHONPATH=<a checkout of an older revision> python benchmarks/policy_sim.py --out X

(the second line measures another revision's policy on the same scenarios.)

`--recorded TABLE` (a benchmarks/round_cost.py result, e.g. round_cost_short_bf16_v2.json)
serves the policy as the server does instead: it starts from the revision's own cost prior
(`policy.cost_model` for a bf16 CPU target drafting short blocks), learns costs from round
times (calibration on), and the rounds cost what the table recorded in AR decode steps (its
plain round included: DOMINO's L = 1 was 1.03-1.07 AR steps there), interpolated in L and bs,
each time multiplied by machine noise (lognormal, --noise sd; a --spike share of rounds 3x
slow, a GC pause). Reported: committed tokens per AR step's time (AR: 1; the floor the policy
must hold) and the oracle's (best fixed L under the recorded costs).

    python benchmarks/policy_sim.py --recorded round_cost_short_bf16_v2.json --batch-sizes 1 2 4 \
        --out policy_sim_recorded"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from simulated import serve  # noqa: E402

import domino_sglang.spec.policy  # noqa: E402
from domino_sglang.spec.policy import COSTS, CostModel, SpeculationPolicy, cost_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# name -> stretches (alpha_1, alpha_i for i >= 2, rounds), cycled; rounds None: the whole run.
# Geometric drafters, drafters right in runs (a pointer drafter's copies: a kept draft makes
# the next likelier), and hard / easy stretches (a workload's prompts differ)
SCENARIOS: dict[str, list[tuple[float, float, int | None]]] = {
    "geometric 0.2": [(0.2, 0.2, None)],
    "geometric 0.35": [(0.35, 0.35, None)],
    "geometric 0.43": [(0.43, 0.43, None)],
    "geometric 0.5": [(0.5, 0.5, None)],
    "runs 0.3 / 0.7": [(0.3, 0.7, None)],
    "runs 0.35 / 0.7": [(0.35, 0.7, None)],
    "stretches 0.25 x 200, 0.5 x 200": [(0.25, 0.25, 200), (0.5, 0.5, 200)],
    "stretches 0.2 x 60, 0.43 x 300": [(0.2, 0.2, 60), (0.43, 0.43, 300)],
    "stretches 0.1 x 30, 0.45 x 200": [(0.1, 0.1, 30), (0.45, 0.45, 200)],
}


def best_round(alphas: list[float], bs: int, block: int, cost: CostModel) -> tuple[float, float]:
    """(E(L), cost(bs, L)) of the L maximising E(L) / cost(bs, L), E(L) = 1 + a_1 + a_1 a_2 +
    ... (L = 1: plain decoding, (1, 1))."""
    best, expected, reach = (1.0, 1.0), 1.0, 1.0
    for n in range(2, block + 1):
        reach *= alphas[n - 2]
        expected += reach
        if expected / cost(bs, n) > best[0] / best[1]:
            best = (expected, cost(bs, n))
    return best


def simulate(stretches: list[tuple[float, float, int | None]], bs: int, rounds: int,
             block: int, cost: CostModel, seed: int) -> tuple[float, float]:
    """(policy, oracle) committed tokens per plain step's time over `rounds` rounds."""
    policy = SpeculationPolicy(block, cost=cost, calibrate=False)
    rng = random.Random(seed)
    tokens = seconds = oracle_tokens = oracle_seconds = 0.0
    done = 0
    while done < rounds:
        for first, rest, n in stretches:
            n = min(rounds - done if n is None else n, rounds - done)
            if n <= 0:
                break

            def truth(i, first=first, rest=rest):
                return first if i == 1 else rest

            t, s = serve(policy, truth, bs, n, cost, rng)
            e, c = best_round([truth(i) for i in range(1, block)], bs, block, cost)
            tokens, seconds = tokens + t, seconds + s
            oracle_tokens, oracle_seconds = oracle_tokens + n * e, oracle_seconds + n * c
            done += n
    return tokens / seconds, oracle_tokens / oracle_seconds


def recorded_costs(path: Path, short_draft: bool = True) -> Callable[[int, int], float]:
    """cost(bs, L) in AR decode steps from a round_cost.py table (`cost_vs_ar_step`: its L = 1
    row is DOMINO's plain round): linear in L between the recorded L (extrapolated past the
    last with the last two's slope), and in bs between the recorded concurrencies (clamped)."""
    table = json.loads(path.read_text())["cost_vs_ar_step"]
    rows: dict[int, dict[int, float]] = {}
    for key, by_bs in table.items():
        name = key.removesuffix(" short draft")
        if not name.startswith("L=") or (key.endswith("short draft") != short_draft
                                         and name != "L=1"):
            continue
        for bs, value in by_bs.items():
            rows.setdefault(int(bs), {})[int(name[2:])] = float(value)
    if not rows or any(1 not in r or len(r) < 3 for r in rows.values()):
        raise ValueError(f"{path}: needs an L=1 row and two speculative ones per concurrency")

    def in_len(r: dict[int, float], n: int) -> float:
        lens = sorted(r)
        for a, b in zip(lens, lens[1:]):
            if n <= b:
                return r[a] + (r[b] - r[a]) * (n - a) / (b - a)
        a, b = lens[-2], lens[-1]
        return r[b] + (r[b] - r[a]) * (n - b) / (b - a)

    sizes = sorted(rows)

    def cost(bs: int, n: int) -> float:
        if bs <= sizes[0] or bs >= sizes[-1]:
            return in_len(rows[sizes[0] if bs <= sizes[0] else sizes[-1]], n)
        lo = max(s for s in sizes if s <= bs)
        hi = min(s for s in sizes if s >= bs)
        if lo == hi:
            return in_len(rows[lo], n)
        w = (bs - lo) / (hi - lo)
        return (1 - w) * in_len(rows[lo], n) + w * in_len(rows[hi], n)

    return cost


def served(stretches: list[tuple[float, float, int | None]], bs: int, rounds: int, block: int,
           truth_cost: Callable[[int, int], float], noise: float, spike: float,
           seed: int) -> tuple[float, float]:
    """(policy, oracle) committed tokens per AR step's time, the policy learning its costs from
    noisy round times as the server does."""
    _, prior = cost_model("cpu", "torch.bfloat16", short_draft=True)
    policy = SpeculationPolicy(block, cost=prior)
    rng = random.Random(seed)
    tokens = seconds = oracle_tokens = oracle_seconds = 0.0
    done = 0
    while done < rounds:
        for first, rest, n in stretches:
            n = min(rounds - done if n is None else n, rounds - done)
            if n <= 0:
                break
            alphas = [first] + [rest] * (block - 2)
            for _ in range(n):
                draft_len = policy.draft_len(bs)
                accept_lens = []
                for _ in range(bs):
                    a = 0
                    while a < draft_len - 1 and rng.random() < alphas[a]:
                        a += 1
                    accept_lens.append(a + 1)
                policy.observe(accept_lens, draft_len)
                cost = truth_cost(bs, draft_len)
                slow = rng.lognormvariate(0.0, noise) * (3.0 if rng.random() < spike else 1.0)
                policy.observe_time(bs, draft_len, 0.03 * cost * slow)
                tokens += sum(accept_lens) / bs
                seconds += cost
            best = max((1.0, 1.0), *((1.0 + sum(math.prod(alphas[:i]) for i in range(1, m)),
                                      truth_cost(bs, m)) for m in range(2, block + 1)),
                       key=lambda ec: ec[0] / ec[1])
            if best == (1.0, 1.0):
                best = (1.0, truth_cost(bs, 1))  # plain decoding: DOMINO's plain round
            oracle_tokens += n * best[0]
            oracle_seconds += n * best[1]
            done += n
    return tokens / seconds, oracle_tokens / oracle_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-bf16", choices=sorted(COSTS))
    ap.add_argument("--k", type=float, default=0.85, help="scale of the profile's overhead")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--rounds", type=int, default=1500)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--out", default="policy_sim")
    ap.add_argument("--recorded", default=None,
                    help="a round_cost.py table under benchmarks/results: serve as the server does")
    ap.add_argument("--noise", type=float, default=0.08, help="round-time noise (lognormal sd)")
    ap.add_argument("--spike", type=float, default=0.01, help="share of rounds 3x slow")
    args = ap.parse_args()
    if min(args.batch_sizes) < 1 or args.rounds < 1 or args.seeds < 1 or args.block < 2 \
            or args.k <= 0:
        ap.error("--batch-sizes, --rounds, --seeds must be >= 1, --block >= 2, --k > 0")
    cost = COSTS[args.profile].scaled(args.k)
    truth = None
    if args.recorded is not None:
        table = RESULTS / args.recorded
        if not table.is_file():
            ap.error(f"--recorded: no {table}")
        try:
            truth = recorded_costs(table)
        except (ValueError, KeyError) as exc:
            ap.error(f"--recorded: {exc}")
    rows = []
    for bs in args.batch_sizes:
        for name, stretches in SCENARIOS.items():
            if truth is not None:
                runs = [served(stretches, bs, args.rounds, args.block, truth, args.noise,
                               args.spike, seed) for seed in range(args.seeds)]
            else:
                runs = [simulate(stretches, bs, args.rounds, args.block, cost, seed)
                        for seed in range(args.seeds)]
            rows.append({"bs": bs, "scenario": name,
                         "policy": round(statistics.fmean(r for r, _ in runs), 3),
                         "policy_min": round(min(r for r, _ in runs), 3),
                         "oracle": round(statistics.fmean(o for _, o in runs), 3),
                         "share_mean": round(statistics.fmean(r / o for r, o in runs), 3),
                         "share_min": round(min(r / o for r, o in runs), 3)})
            print(json.dumps(rows[-1]), flush=True)
    prov = provenance.collect()
    # PYTHONPATH may pick another tree
    tree = Path(domino_sglang.spec.policy.__file__).resolve().parents[2]
    prov["policy_tree"] = f"{tree} at {provenance.git_revision(tree)}"
    RESULTS.mkdir(exist_ok=True)
    out = {"provenance": prov, "args": vars(args), "rows": rows}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    setting = (f"{args.profile} x k {args.k}" if truth is None else
               f"recorded {args.recorded}, learned online; tokens per AR step's time, noise "
               f"{args.noise}, spikes {args.spike}")
    lines = [f"## The adaptive policy on simulated drafters ({setting}, "
             f"{args.rounds} rounds, {args.seeds} seeds)", "", provenance.markdown_header(prov),
             f"- policy: `domino_sglang/spec/policy.py` of {prov['policy_tree']}", "",
             "| bs | drafter (alpha_1 / alpha_i for i >= 2, x rounds) | policy: mean | min "
             "| oracle | policy / oracle: mean | min |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['bs']} | {r['scenario']} | {r['policy']} | {r['policy_min']} | "
              f"{r['oracle']} | {r['share_mean']} | {r['share_min']} |" for r in rows]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

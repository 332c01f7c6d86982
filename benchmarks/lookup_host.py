"""Host time per round of the prompt-lookup proposer, before and after its per-request index.

Before (`old_offer` / `old_may_cover`, the proposer's code before its index, kept here): every
round rebuilt each request's prompt + output list, scanned it (`has_recurring_suffix`), turned
the histories with a recurring suffix into tensors and ran the batched `lookup_batch` (12
compares over [n, T]). After (`PromptLookup`): each request's `HistoryIndex` indexes only the
tokens committed since the last round and answers in O(MAX_MATCH) dict lookups.

The batch: `--requests` requests with a prompt of T tokens each (every `--contexts` T), drafting
blocks of `--block` tokens. The token streams are text-like: ids drawn from a Zipf vocabulary
(`--vocab` ranks, exponent `--zipf`, ranks mapped to random ids below 151,936) in runs of 4-32
tokens, and with probability `--copy` a run is instead a copy of 8-64 tokens from earlier in the
same stream (restated prompt, repeated code). Each round every request commits 1-4 tokens of its
stream (as a round of speculative decoding does), then both paths run on the same batch (their
order alternating) and their offers must be equal. Reported: the median over `--rounds` rounds
of the host ms of `offer` and of `may_cover` per path (torch on `--threads` threads), the first
round of the index (every prompt indexed) apart; the one-time cost of indexing one new prompt of
the longest T; the index's memory per token (tracemalloc) and the share of rows with a draft.

    OMP_NUM_THREADS=1 python benchmarks/lookup_host.py --out lookup_host
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests/harness
sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

from domino_sglang.spec.history import MIN_MATCH, HistoryIndex  # noqa: E402
from domino_sglang.spec.proposers.lookup import PromptLookup  # noqa: E402
from tests.harness.lookup_reference import lookup_batch  # noqa: E402  (the rule, whole histories)

RESULTS = Path(__file__).resolve().parent / "results"
TOKEN_IDS = 151_936  # a Qwen-sized id space: most ids are not Python's cached small ints


def has_recurring_suffix(history: list[int], min_match: int = MIN_MATCH) -> bool:
    """The old pre-check (verbatim): whether the last min_match tokens occur earlier."""
    end = len(history) - min_match  # an earlier occurrence starts in [0, end)
    if end < 1:
        return False
    suffix, start = history[end:], 0
    while True:
        try:
            start = history.index(suffix[0], start, end)
        except ValueError:
            return False
        if history[start:start + min_match] == suffix:
            return True
        start += 1


def old_may_cover(batch) -> bool:
    """PromptLookup.may_cover before the index (no capped rows)."""
    return all(has_recurring_suffix(r.origin_input_ids + r.output_ids) for r in batch.reqs)


def old_offer(batch, bonus: torch.Tensor, block: int, mask: int, device: str):
    """PromptLookup.offer before the index (no capped rows): (found_host, found, drafts,
    longest) or None."""
    n = block - 1
    rows, histories = [], []
    for i, req in enumerate(batch.reqs):
        history = req.origin_input_ids + req.output_ids
        if has_recurring_suffix(history):
            rows.append(i)
            histories.append(torch.tensor(history, dtype=torch.int64))
    if not rows:
        return None
    drafts, lens = lookup_batch(histories, n)
    if not bool((lens > 0).any()):
        return None
    packed = torch.full((len(batch.reqs), n + 2), mask, dtype=torch.int64)
    index = torch.tensor(rows)
    packed[index, :n] = torch.where(drafts >= 0, drafts, mask)
    packed[:, n] = 0
    packed[index, n] = (lens > 0).long()
    packed[index, n + 1] = torch.stack([h[-1] for h in histories])
    found_host = (packed[:, n] > 0).tolist()
    dev = packed.to(device)
    found = (dev[:, n] > 0) & (dev[:, n + 1] == bonus)
    return found_host, found, dev[:, :n], int(lens.max())


def text_like(rng: random.Random, length: int, ids: list[int], cum: list[float],
              copy: float) -> list[int]:
    """A token stream of `length` tokens: Zipf runs and copies of earlier stretches."""
    out: list[int] = []
    while len(out) < length:
        if out and rng.random() < copy:
            start = rng.randrange(len(out))
            out.extend(out[start:start + rng.randint(8, 64)])
        else:
            out.extend(rng.choices(ids, cum_weights=cum, k=rng.randint(4, 32)))
    return out[:length]


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def same(old, new) -> bool:
    if old is None or new is None:
        return old is None and new is None
    return (old[0] == new.found_host and old[1].tolist() == new.found.tolist()
            and old[2].tolist() == new.drafts.tolist() and old[3] == new.longest)


def run_context(args, T: int, rng: random.Random, ids: list[int], cum: list[float]) -> dict:
    """Both paths over `args.rounds` rounds at prompts of T tokens."""
    streams = [text_like(rng, T + 1 + 4 * (args.rounds + 1), ids, cum, args.copy)
               for _ in range(args.requests)]
    reqs = [SimpleNamespace(rid=f"r{i}", origin_input_ids=s[:T], output_ids=[s[T]])
            for i, s in enumerate(streams)]
    done = [T + 1] * len(reqs)
    # one proposer asked `offer` every round, one `may_cover` (each brings its indexes up to
    # date itself: what a round asks first pays for the new tokens)
    lookup = PromptLookup(args.block, args.mask, "cpu", TOKEN_IDS)
    cover = PromptLookup(args.block, args.mask, "cpu", TOKEN_IDS)
    batch = SimpleNamespace(reqs=reqs)
    bonus = torch.tensor([r.output_ids[-1] for r in reqs])
    first_ms, _ = timed(lambda: lookup.offer(batch, bonus, None))  # every prompt indexed
    cover.offer(batch, bonus, None)
    times: dict[str, list[float]] = {"before": [], "after": [], "before_cover": [],
                                     "after_cover": []}
    drafted = 0
    for k in range(args.rounds):
        for i, r in enumerate(reqs):  # this round's commits, appended in place
            m = rng.randint(1, 4)
            r.output_ids.extend(streams[i][done[i]:done[i] + m])
            done[i] += m
        bonus = torch.tensor([r.output_ids[-1] for r in reqs])
        paths = [("before", lambda b=bonus: old_offer(batch, b, args.block, args.mask, "cpu")),
                 ("after", lambda b=bonus: lookup.offer(batch, b, None))]
        covers = [("before_cover", lambda: old_may_cover(batch)),
                  ("after_cover", lambda: cover.may_cover(batch, None))]
        got = {}
        for name, fn in (paths + covers if k % 2 == 0 else paths[::-1] + covers[::-1]):
            gc.collect()
            ms, got[name] = timed(fn)
            times[name].append(ms)
        assert same(got["before"], got["after"]), f"the offers differ at T={T}, round {k}"
        assert got["before_cover"] == got["after_cover"]
        drafted += sum(got["after"].found_host) if got["after"] is not None else 0
    med = {name: statistics.median(v) for name, v in times.items()}
    return {"context": T, "requests": args.requests, "rounds": args.rounds,
            "before_ms": round(med["before"], 3), "after_ms": round(med["after"], 3),
            "before_over_after": round(med["before"] / med["after"], 1),
            "before_cover_ms": round(med["before_cover"], 3),
            "after_cover_ms": round(med["after_cover"], 3),
            "after_first_round_ms": round(first_ms, 1),
            "rows_with_a_draft": round(drafted / (args.rounds * args.requests), 3)}


def index_cost(args, T: int, rng: random.Random, ids: list[int], cum: list[float]) -> dict:
    """The one-time cost of indexing a new prompt of T tokens (median of 5), and the index's
    memory per token (tracemalloc, one prompt)."""
    prompts = [text_like(rng, T, ids, cum, args.copy) for _ in range(5)]
    ms = []
    for p in prompts:
        gc.collect()
        ms.append(timed(lambda p=p: HistoryIndex(args.block - 1).sync(p, [p[0]]))[0])
    tracemalloc.start()
    index = HistoryIndex(args.block - 1)
    index.sync(prompts[0], [prompts[0][0]])
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    entries = sum(len(level) for level in index.grams)
    return {"context": T, "index_ms": round(statistics.median(ms), 1),
            "bytes_per_token": round(size / (T + 1)),
            "entries_per_token": round(entries / (T + 1), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", nargs="+", type=int, default=[4096, 8192])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=16, help="B: drafts of up to B-1 tokens")
    ap.add_argument("--mask", type=int, default=0, help="the mask token id")
    ap.add_argument("--vocab", type=int, default=32_000, help="Zipf ranks in use")
    ap.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent")
    ap.add_argument("--copy", type=float, default=0.1, help="share of runs copied from earlier")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="lookup_host")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    ids = rng.sample(range(TOKEN_IDS), args.vocab)
    cum = list(itertools.accumulate(1 / (r + 1) ** args.zipf for r in range(args.vocab)))
    rows = []
    for T in args.contexts:
        rows.append(run_context(args, T, rng, ids, cum))
        print(json.dumps(rows[-1]), flush=True)
    index = index_cost(args, max(args.contexts), rng, ids, cum)
    print(json.dumps(index), flush=True)
    prov = provenance.collect()
    prov["torch_threads"] = torch.get_num_threads()
    RESULTS.mkdir(exist_ok=True)
    out = {"provenance": prov, "args": vars(args), "rows": rows, "index": index}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"# Prompt lookup: host ms per round, before / after the per-request index "
             f"({args.requests} requests, B = {args.block}, median of {args.rounds} rounds)", "",
             provenance.markdown_header(prov), f"- torch threads: {prov['torch_threads']}",
             f"- streams: Zipf ranks {args.vocab} (exponent {args.zipf}) in runs of 4-32, a "
             f"share {args.copy} of runs copied (8-64 tokens) from earlier; 1-4 tokens "
             "committed per request per round", "",
             "| prompt tokens | offer before | offer after | before / after | may_cover before "
             "| may_cover after | first round after (indexing) | rows with a draft |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['context']} | {r['before_ms']:.2f} ms | {r['after_ms']:.2f} ms | "
                     f"{r['before_over_after']}x | {r['before_cover_ms']:.2f} ms | "
                     f"{r['after_cover_ms']:.3f} ms | {r['after_first_round_ms']:.0f} ms | "
                     f"{r['rows_with_a_draft']:.0%} |")
    lines += ["", f"Indexing one new prompt of {index['context']} tokens: {index['index_ms']} ms "
              f"(median of 5); the index holds {index['entries_per_token']} entries and "
              f"{index['bytes_per_token']} bytes per token (tracemalloc)."]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Compare drafters offline on target answers none of them trained on.

For each drafter folder: `tau_rollout` (the served greedy rollout over 16 random anchors per
record, head on / backbone only; `train.evaluate.rollout_tau`) and the exact served-equivalent
replay of each whole answer with a fixed block (`train.evaluate.replay_rounds`: generated tokens
/ verify rounds, what a DOMINO server would report for that answer).

Records are either regenerated ShareGPT answers in an id range (no server):

    python benchmarks/compare_drafters.py --min-id 1391 --max-id 1426 \
        /tmp/drafter_stage2 domino_sglang/drafters/SmolLM2-135M-Instruct-domino

(pick the range from the stages' recipes: `max_id`, held-out = the last `eval_records`), or the
target's greedy answers to evaluation-set prompts (never training data), generated once through
a plain server (`--url`, or one started here) and cached next to the training data; the answers
to the first 20 prompts of each set (128 tokens) are kept in git (benchmarks/data), so every
machine replays the same ones:

    python benchmarks/compare_drafters.py --eval-set mtbench humaneval gsm8k --limit 20 \
        --max-tokens 128 /tmp/new_drafter domino_sglang/drafters/SmolLM2-135M-Instruct-domino
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from domino_sglang.cli.local_server import start_server
from domino_sglang.cpu.dtype import default_cpu_dtype
from domino_sglang.model.config import DraftConfig, load_draft_config
from domino_sglang.model.drafter import DominoDrafter
from domino_sglang.model.vocab import load_draft_vocab
from domino_sglang.paths import target_dir
from domino_sglang.train import evalset
from domino_sglang.train.config import TrainConfig
from domino_sglang.train.evaluate import replay_rounds, rollout_tau
from domino_sglang.train.features import TargetFeatures
from domino_sglang.train.module import DrafterTrainModule
from domino_sglang.train.records import load_records

DEFAULT_DATA = Path("~/.cache/domino_sglang/data/sharegpt-greedy256.jsonl").expanduser()
# --eval-set answers kept in git: `domino-sglang data-snapshot save --data
# ~/.cache/domino_sglang/data/eval-mtbench-greedy128.jsonl --snapshot
# benchmarks/data/eval-mtbench-greedy128.jsonl.gz` (and the same per set)
EVAL_SNAPSHOTS = Path(__file__).resolve().parent / "data"


def add_eval_args(ap: argparse.ArgumentParser) -> None:
    """The offline studies' common flags: --drafter, --eval-set, --limit, --max-tokens."""
    ap.add_argument("--drafter", type=Path, default=None, help="default: the shipped drafter")
    ap.add_argument("--eval-set", nargs="+", default=["mtbench", "humaneval", "gsm8k"])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)


def offline_drafter(folder: Path, feats: TargetFeatures | None = None,
                    feature_dtype: str | None = None, topk: int = 0, served_vocab: bool = True
                    ) -> tuple[DraftConfig, TargetFeatures, DrafterTrainModule]:
    """A drafter folder loaded for offline measurement: (its config, the target's features, the
    drafter in fp32 as the trainer's module). The features are the target's in `feature_dtype`
    (default: the serving dtype; `topk` > 0 keeps its top-k logits too), or `feats` reused;
    served_vocab: over the folder's draft vocabulary, as the server drafts (else all V)."""
    dconf = load_draft_config(folder)
    if feats is None:
        feats = TargetFeatures(target_dir(), list(dconf.target_layer_ids),
                               getattr(torch, feature_dtype or default_cpu_dtype()), topk=topk)
    drafter = DominoDrafter.from_pretrained(dconf, dtype=torch.float32).eval()
    vocab = load_draft_vocab(folder, dconf.vocab_size) if served_vocab else None
    return dconf, feats, DrafterTrainModule(drafter, feats.embed_weight, feats.lm_head_weight,
                                            vocab)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafters", nargs="+", type=Path)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--min-id", type=int, default=0)
    ap.add_argument("--max-id", type=int, default=None, help="required without --eval-set")
    ap.add_argument("--eval-set", nargs="+", default=[], metavar="SET",
                    help="evaluation prompt sets (mtbench, humaneval, gsm8k) instead of --data")
    ap.add_argument("--limit", type=int, default=20, help="--eval-set: first N prompts per set")
    ap.add_argument("--max-tokens", type=int, default=128, help="--eval-set: answer length")
    ap.add_argument("--url", default=None, help="--eval-set: a running plain server")
    ap.add_argument("--feature-dtype", default=None,
                    help="target features (default: float32 for --data, the serving dtype "
                         "for --eval-set)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context-vocab", action="store_true",
                    help="also replay with each round's draft vocabulary widened by the tokens "
                         "of the context so far (prompt + committed answer): an experiment, "
                         "the server does not do it")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    conf = TrainConfig(data=str(args.data), out="-")  # anchors / max_seq_len as in training
    if args.eval_set:
        sets = {s: eval_records(s, args.limit, args.max_tokens, args.url, conf.max_seq_len)
                for s in args.eval_set}
        dtype = args.feature_dtype or default_cpu_dtype()
    else:
        if args.max_id is None:
            raise SystemExit("compare_drafters: --max-id is required without --eval-set")
        records = [r for r in load_records(args.data, conf.max_seq_len, args.max_id)
                   if r["id"] >= args.min_id]
        if not records:
            raise SystemExit(f"compare_drafters: no records with ids {args.min_id}.."
                             f"{args.max_id} in {args.data}")
        print(f"{len(records)} records: ids {[r['id'] for r in records]}")
        sets = {"sharegpt": records}
        dtype = args.feature_dtype or "float32"
    feats = None
    all_rounds: dict[Path, list[int]] = {}  # folder -> verify rounds per answer, sets in order
    for folder in args.drafters:
        _, feats, module = offline_drafter(folder, feats, dtype)
        for name, records in sets.items():
            taus = rollout_tau(module, feats, records, conf)
            rounds = [replay_rounds(module, feats, r) for r in records]
            all_rounds.setdefault(folder, []).extend(rounds)
            generated = sum(len(r["ids"]) - r["start"] for r in records)
            print(folder, name, json.dumps({**{k: round(v, 3) for k, v in taus.items()},
                                            "tau_replay": round(generated / sum(rounds), 3),
                                            "rounds": rounds}), flush=True)
            if args.context_vocab:
                wide = [replay_context_vocab(module, feats, r) for r in records]
                print(folder, name, json.dumps({
                    "tau_replay_context_vocab": round(generated / sum(wide), 3),
                    "fewer": sum(w < r for w, r in zip(wide, rounds)),
                    "more": sum(w > r for w, r in zip(wide, rounds))}), flush=True)
    print_round_changes(all_rounds)


@torch.no_grad()
def replay_context_vocab(module: DrafterTrainModule, feats: TargetFeatures, rec: dict) -> int:
    """evaluate.replay_rounds (fixed block, head on), each round drafting over the draft
    vocabulary AND every token of the context so far, ids[:a + 1]."""
    from domino_sglang.model.config import DEFAULT_CANDIDATE_POOL
    from domino_sglang.spec.rollout import greedy_rollout
    from domino_sglang.train.evaluate import head_params

    ids, f = torch.tensor(rec["ids"]), feats(rec)  # [T], [T, K*H]
    full, vocab = head_params(module).with_vocab(None), module.draft_vocab
    T, B = len(ids), module.drafter.conf.block_size
    a, rounds = rec["start"], 0
    while a < T - 1:
        rounds += 1
        wide = ids[: a + 1] if vocab is None else torch.cat((vocab, ids[: a + 1]))
        head = full.with_vocab(torch.unique(wide)) if vocab is not None else full
        z, _, labels = module._blocks(ids, f, [a], B)  # [1, B-1, H], [1, B-1]
        z = torch.cat((z, z[:, -1:]), dim=1)  # [1, B, H]
        chain = greedy_rollout(z, ids[a:a + 1], head, DEFAULT_CANDIDATE_POOL)  # [1, B-1]
        a += 1 + int((chain == labels).int().cumprod(dim=1).sum())
    return rounds


def print_round_changes(all_rounds: dict[Path, list[int]]) -> None:
    """Each later drafter against the first, answer by answer: total verify rounds and on how
    many answers it needs fewer / equally many / more rounds (fewer rounds = faster)."""
    (first, base), *others = all_rounds.items()
    for folder, rounds in others:
        fewer = sum(r < b for r, b in zip(rounds, base))
        equal = sum(r == b for r, b in zip(rounds, base))
        print(f"{folder} vs {first}: rounds {sum(base)} -> {sum(rounds)} over {len(base)} "
              f"answers (fewer on {fewer}, {equal} equal, {len(base) - fewer - equal} more)")


def eval_records(name: str, limit: int, max_tokens: int, url: str | None, max_seq_len: int
                 ) -> list[dict]:
    """evalset.eval_records with this checkout's answers in git (EVAL_SNAPSHOTS) and the
    training data's cache folder; a stale cached answer ends the run naming the file."""
    try:
        return evalset.eval_records(name, limit, max_tokens, url, max_seq_len,
                                    DEFAULT_DATA.parent, EVAL_SNAPSHOTS, start_server)
    except ValueError as exc:
        raise SystemExit(f"compare_drafters: {exc}") from exc


if __name__ == "__main__":
    main()

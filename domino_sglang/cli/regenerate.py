"""`domino-sglang regenerate`: answer prompts with the target, the drafter's training data.

Without `--url` it starts a plain server of the target through local_server.py.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from domino_sglang.cli.common import fail


def cmd_regenerate(args: argparse.Namespace) -> int:
    from domino_sglang.model.target import TargetError, prepare_target
    from domino_sglang.train.regenerate import (
        RegenConfig,
        append_records,
        chat_tokenizer,
        dataset_answers,
        regenerate,
        sharegpt_items,
        source_items,
    )

    for name in ("limit", "max_new_tokens", "concurrency", "max_prompt_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            fail(f"regenerate: --{name.replace('_', '-')} must be >= 1, got {value}")
    if args.first_id < 0:
        fail(f"regenerate: --first-id must be >= 0, got {args.first_id}")
    if args.turn < 1:
        fail(f"regenerate: --turn must be >= 1, got {args.turn}")
    if args.source != "sharegpt" and args.turn != 1:
        fail("regenerate: --turn applies to --source sharegpt only")
    if args.temperature < 0:
        fail(f"regenerate: --temperature must be >= 0, got {args.temperature}")
    try:
        target = Path(args.model_path) if args.model_path else prepare_target()
    except TargetError as exc:
        fail(f"regenerate: {exc}")
    conf = RegenConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       concurrency=args.concurrency, max_prompt_tokens=args.max_prompt_tokens)
    thinking = None if args.thinking is None else args.thinking == "on"
    try:
        tokenizer = chat_tokenizer(target, args.chat_template, thinking)
    except ValueError as exc:
        fail(f"regenerate: {exc}")
    if args.data is not None:  # the user's own conversations
        from domino_sglang.train.conversations import (
            ConversationError,
            prompt_items,
            read_conversations,
        )

        try:
            items = prompt_items(read_conversations(args.data), tokenizer,
                                 conf.max_prompt_tokens)
        except ConversationError as exc:
            fail(f"regenerate: --data {exc}")
        items = items[: args.limit] if args.limit is not None else items
        if not items:
            fail(f"regenerate: --data {args.data} has no user turn within "
                  f"--max-prompt-tokens {conf.max_prompt_tokens}")
    elif args.source == "sharegpt-answers":  # the dataset's own answers: no server to run
        records = dataset_answers(tokenizer, args.limit, conf.max_prompt_tokens,
                                  conf.max_new_tokens, args.first_id)
        print(f"{args.out}: {append_records(args.out, records)} new records")
        return 0
    elif args.source != "sharegpt":
        items = source_items(args.source, tokenizer, args.limit, conf.max_prompt_tokens,
                             args.first_id)
    else:
        items = sharegpt_items(tokenizer, args.limit, conf.max_prompt_tokens, args.first_id,
                               args.turn)
    if args.url:
        n = regenerate(args.url.rstrip("/"), items, args.out, conf)
    else:
        from domino_sglang.cli.local_server import start_server
        serve = ["--no-speculation", "--model-path", str(target)]
        sglang = ["--max-running-requests", str(conf.concurrency)]
        with start_server("regenerate", serve, sglang, threads=args.threads) as server:
            n = regenerate(server.url, items, args.out, conf)
    print(f"{args.out}: {n} new responses")
    return 0



def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `regenerate` subcommand and its flags."""
    r = sub.add_parser("regenerate", help="answer ShareGPT prompts with the target (training data)")
    r.add_argument("--out", type=Path, required=True, help="JSONL cache (resumed if present)")
    r.add_argument("--source", choices=("sharegpt", "python", "math", "chat", "sharegpt-answers"),
                   default="sharegpt",
                   help="prompts: ShareGPT turns (default), code-completion requests for the "
                        "Python standard library's documented functions (ids 1000000 + index) "
                        "or templated grade-school word problems (ids 2000000 + index) or "
                        "templated general-chat requests (ids 3000000 + index), or ShareGPT's "
                        "own first answers, not the target's (ids 4000000 + index; no server; "
                        "train on them with distill = 1 only)")
    r.add_argument("--limit", type=int, default=None, help="number of prompts (default: all)")
    r.add_argument("--first-id", type=int, default=0,
                   help="start at this ShareGPT conversation index / stdlib function index / "
                        "word problem / chat request index (default 0)")
    r.add_argument("--turn", type=int, default=1,
                   help="answer each conversation's N-th user turn, the dataset's turns before it "
                        "as context (default 1; ids of turn N: (N-1) * 100000 + index)")
    r.add_argument("--url", "--server", dest="url", default=None,
                   help="a running SGLang server of the target, e.g. http://127.0.0.1:30000 "
                        "(default: start one)")
    r.add_argument("--data", type=Path, default=None,
                   help="your prompts instead of --source: conversations (ShareGPT JSON/JSONL or "
                        "OpenAI chat JSONL), each answered after its last user turn")
    r.add_argument("--model-path", type=Path, default=None)
    r.add_argument("--max-new-tokens", type=int, default=256)
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    r.add_argument("--concurrency", type=int, default=32)
    r.add_argument("--max-prompt-tokens", type=int, default=512)
    r.add_argument("--chat-template", type=Path, default=None,
                   help="a Jinja chat template file to format the prompts with, as the server "
                        "you will serve with uses (default: the target's own)")
    r.add_argument("--thinking", choices=("on", "off"), default=None,
                   help="targets with a thinking switch (Qwen3's enable_thinking): answer with "
                        "reasoning (on) or directly (off); default: the template's default")
    r.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))

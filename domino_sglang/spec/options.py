"""DOMINO's serving options: one typed, frozen `DominoConfig`, built once at start-up from flags.

Not the drafter's checkpoint config (config.py, `DraftConfig`): these are how a server runs a
drafter. Each field is resolved, in this order, from
  1. the drafter's config (config.json / dflash_config: `candidate_pool`, `short_draft`,
     `draft_temperature_scale`) or the built-in default;
  2. SGLang's own speculative flags: `--speculative-domino-candidate-pool-size` (when other than
     its default 2048), `--speculative-adaptive` (DOMINO's policy is adaptive anyway),
     `--speculative-token-map` (a draft_vocab.json replacing the drafter's);
  3. the plugin's `--speculative-domino-*` flags (`FLAGS`), added to SGLang's parser by
     server_flags.py. The `--speculative-domino-debug-*` ones are ablation / measurement
     switches (benchmarks, tests), not serving knobs.

How the values reach the scheduler process (where DominoWorker runs): the `from_cli_args` hook
(server_flags.py) keeps the parsed flags as `_domino_flags` on the ServerArgs record, a
bookkeeping attribute SGLang's `ServerArgs.__reduce__` carries to every child process
(tests/spec/test_options.py pickles one to check). The launcher also keeps them in this module
(`remember_flags`), since its resolution step reads the record through a view. The launcher
resolves and logs the config once (algorithm.resolve_server_args: bad values stop the server
before it forks); the worker resolves the same sources again in its own process.

Nothing here is read from the environment: environment variables carry only what is not a
serving option (DOMINO_SGLANG_HOME: paths.py; the CPU runtime's kill switches:
cpu/bootstrap.py). The API keys are flags or files (http/flags.py KEY_FILE_FLAGS).
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

logger = logging.getLogger(__name__)

TRUE, FALSE = ("on", "true", "1"), ("off", "false", "0")

# SGLang's own candidate-pool flag and its default (srt/arg_groups/fields/spec.py)
POOL_FLAG, POOL_FLAG_DEFAULT = "--speculative-domino-candidate-pool-size", 2048


NAME = "DOMINO"  # the speculative algorithm, as --speculative-algorithm names it


class DominoOptionError(ValueError):
    """A bad DOMINO serving option (one line, names the flag)."""


def parse_bool(text: str | bool, flag: str) -> bool:
    """The one boolean rule of every DOMINO flag: on/off, true/false, 1/0 (any case)."""
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise DominoOptionError(f"{flag} must be on/off (or true/false, 1/0), got {text!r}")


def _scale(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise DominoOptionError(f"{flag} must be a finite number > 0, got {text!r}")
    return value


def _pattern(text: str, flag: str) -> tuple[int, ...]:
    lens = [n.strip() for n in str(text).split(",")]
    if not all(n.isdigit() and int(n) >= 1 for n in lens):
        raise DominoOptionError(f"{flag} must be an integer L >= 1 or a comma-separated list of "
                                f"them, got {text!r}")
    return tuple(int(n) for n in lens)


def _cost(text: str, flag: str) -> tuple[float, float, float]:
    try:
        values = [float(v) for v in str(text).split(",")]
    except ValueError:
        values = []
    if len(values) != 3 or not all(math.isfinite(v) and v >= 0 for v in values):
        raise DominoOptionError(f"{flag} must be three non-negative numbers DRAFT,SLOPE_0,"
                                f"SLOPE_PER_REQ (benchmarks/fit_cost.py prints them), got {text!r}")
    return values[0], values[1], values[2]


def _copy_index(text: str, flag: str) -> str:
    if text not in ("device", "host"):
        raise DominoOptionError(f"{flag} must be 'device' or 'host', got {text!r}")
    return text


def _width(text: str, flag: str) -> int:
    value = str(text).strip()
    if not value.isdigit():
        raise DominoOptionError(f"{flag} must be an integer K >= 0 (0 = chains), got {text!r}")
    return int(value)


def _text(text: str, flag: str) -> str:
    if not str(text).strip():
        raise DominoOptionError(f"{flag} must not be empty")
    return str(text)


@dataclass(frozen=True)
class Flag:
    """One `--speculative-domino-*` flag: the config field it sets, its parser and help."""

    field: str
    parse: Callable[[str, str], Any]
    metavar: str
    help: str
    debug: bool = False

    @property
    def name(self) -> str:
        infix = "debug-" if self.debug else ""
        return "--speculative-domino-" + infix + self.field.replace("_", "-")

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


ONOFF = "on|off"
FLAGS: tuple[Flag, ...] = (
    Flag("adaptive", parse_bool, ONOFF,
         "adaptive draft length (policy.py): each round verifies the L that maximises expected "
         "tokens per cost; off = the full block every round. Default on."),
    Flag("lookup", parse_bool, ONOFF,
         "prompt-lookup drafts where the history recurs (lookup.py); off = the drafter's drafts "
         "only. Default on."),
    Flag("draft_temperature_scale", _scale, "S",
         "sampled requests draft at temperature T * S (sampling.py). Default: the drafter's "
         "config (draft_temperature_scale), else 1."),
    Flag("tree_width", _width, "K",
         "let the adaptive policy verify a draft tree instead of the chain where it pays "
         "(tree.py, policy.tree_len): the head's K likeliest tokens per node, best-first by the "
         "path's draft probability, beside the drafted chain and prompt lookup's draft; exact "
         "at any temperature. 0 = chains. Default 0."),
    Flag("draft_vocab", parse_bool, ONOFF,
         "draft over the drafter's reduced vocabulary (draft_vocab.json, or "
         "--speculative-token-map); off = the full vocabulary. Default on."),
    Flag("head", parse_bool, ONOFF,
         "refine drafts with the Domino head; off = the backbone alone (the DFlash baseline of "
         "the same checkpoint). Default on.", debug=True),
    Flag("copy", parse_bool, ONOFF,
         "a pointer drafter's copy path; off = its p alone. Default on.", debug=True),
    Flag("sampled_drafts", parse_bool, ONOFF,
         "sampled requests draft from q at their temperature; off = greedy drafts verified as "
         "one-hot proposals, as SGLang's DFLASH does at T > 0 (benchmarks). Default on.",
         debug=True),
    Flag("copy_index", _copy_index, "device|host",
         "where copy indexes live. Default: device on CUDA, host on the CPU.", debug=True),
    Flag("short_draft", parse_bool, ONOFF,
         "rounds verifying L < B tokens draft only those L. Default: the drafter's config "
         "(short_draft).", debug=True),
    Flag("draft_len", _pattern, "L[,L...]",
         "verify L tokens every round (1..block size), or cycle a pattern by the committed "
         "length; overrides the policy (benchmarks/round_cost.py, tests).", debug=True),
    Flag("cost", _cost, "DRAFT,SLOPE_0,SLOPE_PER_REQ",
         "the policy's cost constants instead of the measured profile (benchmarks/fit_cost.py "
         "prints them).", debug=True),
    Flag("calibrate", parse_bool, ONOFF,
         "calibrate the cost profile from round times; off = the profile as it is. Default on.",
         debug=True),
    Flag("plain_decode", parse_bool, ONOFF,
         "plain rounds (L = 1) run the target's DECODE forward; off = a one-token verify "
         "(benchmarks/round_cost.py --plain-verify). Default on.", debug=True),
    Flag("gpu_shape", parse_bool, ONOFF,
         "take every decision the CUDA-graph path takes where no CUDA graphs run, e.g. on the "
         "CPU (tests): batch buckets from SGLang's capture list, the head rollout over static "
         "buffers built at start-up, the device copy index, verify and draft widths from the "
         "captured set; only the capture itself is left out. Default: exactly where CUDA "
         "graphs run.", debug=True),
    Flag("sync_log", _text, "PATH",
         "count host synchronisations of every decode round, one JSON line per round to PATH "
         "(tests/server/test_sync_budget.py). Default: not counted.", debug=True),
)
BY_FIELD = {f.field: f for f in FLAGS}


@dataclass(frozen=True)
class DominoConfig:
    """Every DOMINO serving option, resolved (module docstring). `block_size`: B."""

    block_size: int
    candidate_pool: int  # head over the top-K base candidates; 0 = the full vocabulary
    draft_temperature_scale: float
    short_draft: bool
    adaptive: bool = True
    lookup: bool = True
    tree_width: int = 0  # K children per tree node; 0: rounds verify chains
    draft_vocab: bool = True
    token_map: str | None = None  # a draft_vocab.json replacing the drafter's
    # -- debug (ablation / measurement) --
    head: bool = True
    copy: bool = True
    sampled_drafts: bool = True
    copy_index: str | None = None  # None: by device
    draft_len: tuple[int, ...] | None = None
    cost: tuple[float, float, float] | None = None
    calibrate: bool = True
    plain_decode: bool = True
    gpu_shape: bool | None = None  # None: where CUDA graphs run
    sync_log: str | None = None

    def line(self) -> str:
        """The config as one log line."""
        def show(value) -> str:
            if isinstance(value, bool):
                return "on" if value else "off"
            if isinstance(value, tuple):
                return ",".join(map(str, value))
            return "default" if value is None else str(value)

        return "DOMINO config: " + " ".join(f"{f.name}={show(getattr(self, f.name))}"
                                            for f in fields(self))


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add the `--speculative-domino-*` flags to SGLang's parser (idempotent). Each parses with
    the config's own rule; a bad value stops the parser with a line naming the flag."""
    if any(FLAGS[0].name in a.option_strings for a in parser._actions):
        return
    for debug, title in ((False, "DOMINO speculative decoding (domino_sglang)"),
                         (True, "DOMINO debug: ablation and measurement switches "
                                "(domino_sglang; not for serving)")):
        group = parser.add_argument_group(title)
        for flag in (f for f in FLAGS if f.debug == debug):
            group.add_argument(flag.name, dest=flag.dest, type=_argparse_type(flag),
                               default=None, metavar=flag.metavar, help=flag.help)


def _argparse_type(flag: Flag) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return flag.parse(text, flag.name)
        except DominoOptionError as exc:  # argparse prefixes "argument --flag:"
            raise argparse.ArgumentTypeError(str(exc).removeprefix(flag.name + " ")) from exc

    parse.__name__ = flag.field
    return parse


def flags_from_namespace(namespace: argparse.Namespace) -> dict[str, Any]:
    """The DOMINO flags given on a parsed command line ({field: value}), with SGLang's
    `--speculative-adaptive` / `--speculative-adaptive-config` as given (SGLang's resolution
    turns the former off for algorithms other than EAGLE, so it is kept from the input)."""
    given = {f.field: getattr(namespace, f.dest) for f in FLAGS
             if getattr(namespace, f.dest, None) is not None}
    for name in ("speculative_adaptive", "speculative_adaptive_config"):
        if getattr(namespace, name, None):
            given[name] = getattr(namespace, name)
    return given


_launcher_flags: dict[str, Any] | None = None


def remember_flags(server_args: Any, flags: dict[str, Any]) -> None:
    """Keep the parsed flags on the ServerArgs record (pickled to the scheduler) and here."""
    global _launcher_flags
    _launcher_flags = dict(flags)
    try:
        server_args._domino_flags = dict(flags)  # bookkeeping: not a field, not sealed
    except AttributeError:
        logger.warning("domino_sglang: could not keep the DOMINO flags on the server arguments")


def given_flags(server_args: Any) -> dict[str, Any]:
    """The DOMINO flags of this server: from the record (scheduler), else from this process's
    parse (launcher), else none (an Engine built in Python: defaults)."""
    try:
        flags = getattr(server_args, "_domino_flags", None)
    except Exception:  # a resolving view that knows only fields
        flags = None
    if flags is None:
        flags = _launcher_flags
    return dict(flags or {})


def resolve(drafter, block_size: int, flags: dict[str, Any] | None = None,
            pool_flag: int | None = None, token_map: str | None = None) -> DominoConfig:
    """The config from the drafter's (`drafter`: config.DraftConfig), SGLang's candidate-pool
    flag (`pool_flag`, counted when other than its default) and token map, and `flags` (raw
    strings or parsed values, {field: value}). Raises DominoOptionError naming the flag."""
    flags = dict(flags or {})
    adaptive_file = flags.pop("speculative_adaptive_config", None)
    if adaptive_file:
        raise DominoOptionError(
            f"--speculative-adaptive-config {adaptive_file}: DOMINO's adaptive policy takes no "
            f"config file (it is EAGLE's); use {BY_FIELD['adaptive'].name} and "
            f"{BY_FIELD['cost'].name}")
    flags.pop("speculative_adaptive", None)  # on is DOMINO's default: nothing to change
    unknown = set(flags) - set(BY_FIELD)
    if unknown:
        raise DominoOptionError(f"unknown DOMINO option(s): {', '.join(sorted(unknown))}")
    values = {name: (BY_FIELD[name].parse(value, BY_FIELD[name].name)
                     if isinstance(value, str) else value) for name, value in flags.items()}
    pool = drafter.candidate_pool
    if pool_flag is not None and int(pool_flag) != POOL_FLAG_DEFAULT:
        if int(pool_flag) < 0:
            raise DominoOptionError(f"{POOL_FLAG} must be an integer >= 0 (0 = full vocabulary),"
                                    f" got {pool_flag}")
        pool = int(pool_flag)
    pattern = values.get("draft_len")
    if pattern is not None and not all(1 <= n <= block_size for n in pattern):
        raise DominoOptionError(f"{BY_FIELD['draft_len'].name} must be integers in 1.."
                                f"{block_size} (the block size), got "
                                f"{','.join(map(str, pattern))}")
    defaults = {"short_draft": bool(drafter.short_draft),
                "draft_temperature_scale": float(drafter.draft_temperature_scale)}
    return DominoConfig(block_size=int(block_size), candidate_pool=pool,
                        token_map=token_map or None, **{**defaults, **values})


def for_server(server_args: Any, drafter, block_size: int) -> DominoConfig:
    """The config of a server (its ServerArgs, or a resolving view of them)."""
    return resolve(drafter, block_size, given_flags(server_args),
                   pool_flag=getattr(server_args, "speculative_domino_candidate_pool_size", None),
                   token_map=getattr(server_args, "speculative_token_map", None))

"""The HTTP guards' own server flags and key files: what guards.py and access.py allow, read
once from SGLang's parsed command line in the process that serves HTTP (`current()`).

`--domino-guards`, `--domino-allowed-origins`, `--domino-allowed-hosts`,
`--domino-max-request-bytes`, `--domino-request-guards`, and the key files
(`--domino-api-key-file`, `--domino-admin-api-key-file`: SGLang's `--api-key` / `--admin-api-key`
read from a file, a mounted Secret, so the key is in no command line). integration/server_flags.py
adds them to SGLang's parser beside DOMINO's own options. Nothing here is read from the environment.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from domino_sglang.spec.options import NAME

# A request body larger than this is refused with a 413 before anything parses it. 4 MiB holds
# a 128k-token text prompt with room to spare; a body far over it grows the API process by many
# times its size while tokenising, before SGLang's context-length check (docs/reliability.md).
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class HttpOptions:
    """What the HTTP guards (guards.py) and access rules (access.py) allow."""

    allowed_origins: tuple[str, ...] = ()  # CORS and cross-origin requests; "*" = any
    allowed_hosts: tuple[str, ...] = ()  # Host header values beyond the bind's own names
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    request_guards: bool = True  # guards.py's request checks (413 / 400 instead of SGLang 500s)
    guards: bool | None = None  # --domino-guards: on / off; None: on for DOMINO servers only


GUARDS_FLAG = "--domino-guards"
# each key-file flag and the SGLang flag whose value it holds
KEY_FILE_FLAGS = {"--domino-api-key-file": "--api-key",
                  "--domino-admin-api-key-file": "--admin-api-key"}


def read_key_file(path: str, flag: str) -> str:
    """The key held in the file at `path` (surrounding whitespace, a trailing newline, dropped);
    a missing, unreadable or empty file raises options.DominoOptionError naming `flag`."""
    from domino_sglang.spec.options import DominoOptionError

    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise DominoOptionError(f"{flag} {path}: cannot read it ({reason})") from None
    if not key:
        raise DominoOptionError(f"{flag} {path}: the file is empty")
    return key


def apply_key_files(namespace: argparse.Namespace) -> None:
    """Set SGLang's api_key / admin_api_key on a parsed namespace from the key-file flags given;
    a key given both ways raises options.DominoOptionError."""
    from domino_sglang.spec.options import DominoOptionError

    for file_flag, key_flag in KEY_FILE_FLAGS.items():
        path = getattr(namespace, _dest(file_flag), None)
        if not path:
            continue
        key_dest = _dest(key_flag)
        if getattr(namespace, key_dest, None):
            raise DominoOptionError(f"{key_flag} and {file_flag} are both given: give one")
        setattr(namespace, key_dest, read_key_file(path, file_flag))


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def guards_apply(server_args, options: HttpOptions | None = None) -> bool:
    """Whether this server gets the plugin's HTTP guards, access rules and log redaction: a
    server that runs DOMINO (or was started by `domino-sglang serve`, which passes
    `--domino-guards on`), or one started with `--domino-guards on`. Every other SGLang server
    in the environment behaves as stock SGLang."""
    options = current() if options is None else options
    if options.guards is not None:
        return options.guards

    return str(getattr(server_args, "speculative_algorithm", None) or "").upper() == NAME


def guards_wanted(argv: list[str]) -> bool:
    """guards_apply read from a command line, for what must be decided before SGLang parses it
    (the log redaction, installed as each process loads the plugin)."""

    flag = flag_value(argv, GUARDS_FLAG)
    if flag is not None:
        try:
            return _on_off(flag)
        except argparse.ArgumentTypeError:
            return True  # SGLang's parser refuses it by name; redact meanwhile
    return str(flag_value(argv, "--speculative-algorithm") or "").upper() == NAME


_options = HttpOptions()


def current() -> HttpOptions:
    """The options parsed in this process (defaults where nothing was parsed)."""
    return _options



def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in argv (`--flag v` or `--flag=v`), the last one if repeated."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        elif arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def _positive_bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes, got {text!r}") from exc
    if value < 1024:
        raise argparse.ArgumentTypeError(f"must be at least 1024 bytes, got {value}")
    return value


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("must name at least one value (comma-separated)")
    return names


def _on_off(text: str) -> bool:
    from domino_sglang.spec.options import DominoOptionError, parse_bool

    try:
        return parse_bool(text, "")
    except DominoOptionError as exc:
        raise argparse.ArgumentTypeError(str(exc).strip()) from exc


def add_http_flags(parser: argparse.ArgumentParser) -> None:
    """Add the HTTP guards' and key files' flags to a parser (idempotent)."""
    if any("--domino-allowed-origins" in a.option_strings for a in parser._actions):
        return
    group = parser.add_argument_group("domino_sglang HTTP guards")
    group.add_argument(
        GUARDS_FLAG, type=_on_off, default=None, metavar="on|off",
        help="the guards below, the access rules and the API-key log redaction on this server. "
             "Default: on for a server that runs --speculative-algorithm DOMINO or was started "
             "by `domino-sglang serve`, off (stock SGLang behaviour) for any other.")
    group.add_argument(
        "--domino-allowed-origins", type=_names, default=(), metavar="ORIGIN[,ORIGIN...]",
        help="browser origins allowed to call the API (CORS), e.g. https://app.example.com; "
             "'*' allows any. Default: none (SGLang alone allows every origin with "
             "credentials); requests carrying another Origin are refused with 403.")
    group.add_argument(
        "--domino-allowed-hosts", type=_names, default=(), metavar="HOST[,HOST...]",
        help="Host header values accepted besides the bind's own (a server bound to loopback "
             "answers only Host 127.0.0.1 / localhost / [::1]: DNS-rebinding protection); "
             "'*' accepts any.")
    group.add_argument(
        "--domino-max-request-bytes", type=_positive_bytes, default=DEFAULT_MAX_REQUEST_BYTES,
        metavar="BYTES",
        help=f"largest request body accepted, else 413 (default {DEFAULT_MAX_REQUEST_BYTES}).")
    group.add_argument(
        "--domino-request-guards", type=_on_off, default=True, metavar="on|off",
        help="the request checks of guards.py on a guarded server (--domino-guards): a 413 / 400 "
             "naming the problem for bodies, token ids and logprob counts that stock SGLang "
             "answers with a 500 or dies on. Default on; the access rules above and the API-key "
             "log redaction stay on either way.")
    keys = parser.add_argument_group("domino_sglang key files")
    for file_flag, key_flag in KEY_FILE_FLAGS.items():
        keys.add_argument(
            file_flag, default=None, metavar="PATH",
            help=f"read {key_flag} from this file (e.g. a mounted Kubernetes Secret): the key "
                 f"is then in no command line or process list. Not with {key_flag}.")


def read_flags(namespace: argparse.Namespace) -> HttpOptions:
    """Keep the plugin's flags from a parsed namespace as this process's options."""
    global _options
    _options = HttpOptions(
        allowed_origins=tuple(getattr(namespace, "domino_allowed_origins", ()) or ()),
        allowed_hosts=tuple(getattr(namespace, "domino_allowed_hosts", ()) or ()),
        max_request_bytes=int(getattr(namespace, "domino_max_request_bytes",
                                      DEFAULT_MAX_REQUEST_BYTES)),
        request_guards=bool(getattr(namespace, "domino_request_guards", True)),
        guards=getattr(namespace, "domino_guards", None))
    return _options

"""The plugin's own SGLang server flags: added to SGLang's parser, read back once at launch.

Two groups: the HTTP guards' `--domino-*` flags and key files (http/flags.py, kept in its
`current()`), and DOMINO's `--speculative-domino-*` serving options (options.py, kept on the
ServerArgs record for the scheduler process).

SGLang loads plugins before it parses the command line, so the plugin adds its flags to
`ServerArgs.add_cli_args` (they show in `python -m sglang.launch_server --help`) and reads their
values from the parsed namespace in `ServerArgs.from_cli_args`, which keeps only ServerArgs'
own fields. The values live in `current()` of the process that parsed them (the launcher, which
serves HTTP); nothing here is read from the environment.

Private SGLang internals: `ServerArgs.add_cli_args(parser)` and `ServerArgs.from_cli_args(cls,
args)`, hooked through the plugin `HookRegistry` (register(); the targets are sglang_compat.HOOKS).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from domino_sglang.http.flags import KEY_FILE_FLAGS, add_http_flags, apply_key_files, read_flags


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add the plugin's flags to SGLang's server parser (idempotent)."""
    from domino_sglang.spec import options

    options.add_flags(parser)
    add_http_flags(parser)


class _RaisingParser(argparse.ArgumentParser):
    """A parser whose errors raise (one line) instead of printing usage and exiting."""

    def error(self, message: str):
        from domino_sglang.spec.options import DominoOptionError

        # argparse's "argument --flag: must be ..." -> "--flag must be ..." (options.py's wording)
        raise DominoOptionError(re.sub(r"^argument (\S+): ", r"\1 ", message))


def check_flags(argv: list[str]) -> dict[str, Any]:
    """Parse the plugin's flags out of an SGLang command line (`argv`: what `domino-sglang serve`
    passes after `--`) by the rules SGLang's parser applies at start-up, everything else left
    to SGLang. Returns the DOMINO flags given ({field: parsed value}); a bad value raises
    options.DominoOptionError, one line naming the flag. Exact flag names only: an abbreviation
    is SGLang's to resolve."""
    from domino_sglang.spec import options

    parser = _RaisingParser(add_help=False, allow_abbrev=False)
    add_flags(parser)
    for key_flag in KEY_FILE_FLAGS.values():  # SGLang's own, to check the key files against
        parser.add_argument(key_flag, default=None)
    namespace, _sglang_own = parser.parse_known_args(list(argv))
    apply_key_files(namespace)
    return options.flags_from_namespace(namespace)


def _after_add_cli_args(_result, parser: argparse.ArgumentParser) -> None:
    add_flags(parser)


def _before_from_cli_args(cls, namespace: argparse.Namespace) -> None:
    read_flags(namespace)
    apply_key_files(namespace)


def _after_from_cli_args(server_args, cls, namespace: argparse.Namespace) -> None:
    from domino_sglang.spec import options

    options.remember_flags(server_args, options.flags_from_namespace(namespace))


def register() -> None:
    """Hook the flags into SGLang's parser (SGLang applies hooks after plugins load)."""
    from domino_sglang import sglang_compat

    sglang_compat.register_hooks({"add_server_flags": _after_add_cli_args,
                                  "read_http_flags": _before_from_cli_args,
                                  "remember_domino_flags": _after_from_cli_args})

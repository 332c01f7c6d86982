"""Guards the stock SGLang 0.5.23 server lacks, installed by the plugin in every SGLang process.

- Out-of-vocabulary prompt token ids (`/generate` `input_ids`, a token-id `prompt` on
  `/v1/completions`) reach the target's embedding unchecked and raise IndexError in the
  scheduler, which kills the whole server: one request is a denial of service. They are refused
  in the tokenizer manager instead, as a 400 naming the id (SGLang turns the ValueError into
  its usual error response, like its own context-length check).
- SGLang logs its resolved server arguments at start-up, `api_key` included. The values of
  `--api-key` / `--admin-api-key` on this process's command line (multiprocessing children
  inherit it) are replaced by `<redacted>` in every log record.

Private SGLang internals: `TokenizerManager._validate_one_request(obj, input_ids)` and its
`model_config.vocab_size`, hooked through SGLang's plugin `HookRegistry`.
This module imports nothing heavy at import time (the CLI uses the redaction helpers).
"""

from __future__ import annotations

import logging
import sys

SECRET_FLAGS = ("--api-key", "--admin-api-key")
REDACTED = "<redacted>"


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in argv (`--flag v` or `--flag=v`), the last one if repeated."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        elif arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def redact_command(cmd: list[str]) -> list[str]:
    """`cmd` with the values of SECRET_FLAGS replaced, for printing."""
    out, hide = [], False
    for arg in cmd:
        flag, sep, _ = arg.partition("=")
        if hide:
            out.append(REDACTED)
        elif sep and flag in SECRET_FLAGS:
            out.append(f"{flag}={REDACTED}")
        else:
            out.append(arg)
        hide = arg in SECRET_FLAGS
    return out


def install_log_redaction(argv: list[str] | None = None) -> list[str]:
    """Redact this process's secret flag values from every log record; returns the secrets."""
    argv = sys.argv if argv is None else argv
    secrets = [v for v in (flag_value(argv, f) for f in SECRET_FLAGS) if v]
    if not secrets:
        return []
    make_record = logging.getLogRecordFactory()

    def redacting_factory(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is logging's problem, not ours
            return record
        if any(s in message for s in secrets):
            for s in secrets:
                message = message.replace(s, REDACTED)
            record.msg, record.args = message, None
        return record

    logging.setLogRecordFactory(redacting_factory)
    return secrets


def check_input_ids(tokenizer_manager, obj, input_ids) -> None:
    """BEFORE hook of `TokenizerManager._validate_one_request`: every prompt id in the vocab."""
    if not input_ids or not isinstance(input_ids, list) or isinstance(input_ids[0], list):
        return
    vocab = tokenizer_manager.model_config.vocab_size
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(f"input_ids contains the out-of-vocabulary token id {bad}; valid "
                         f"range is [0, {vocab})")


def register_guards() -> None:
    """Hook the checks into SGLang (SGLang applies hooks after every plugin has loaded)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    install_log_redaction()
    HookRegistry.register(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        check_input_ids, HookType.BEFORE)

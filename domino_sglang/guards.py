"""Guards the stock SGLang 0.5.23 server lacks, installed by the plugin in every SGLang process.

- Out-of-vocabulary prompt token ids (`/generate` `input_ids`, a token-id `prompt` on
  `/v1/completions`) reach the target's embedding unchecked and raise IndexError in the
  scheduler, which kills the whole server: one request is a denial of service. They are refused
  in the tokenizer manager instead, as a 400 naming the id (SGLang turns the ValueError into
  its usual error response, like its own context-length check).
- SGLang logs its resolved server arguments at start-up, `api_key` included. The values of
  `--api-key` / `--admin-api-key` on this process's command line (multiprocessing children
  inherit it) are replaced by `<redacted>` in every log record.

- A POST body on an OpenAI route (`/v1/...`) that is JSON but not an object (`[1, 2, 3]`), or
  whose `response_format` is neither an object nor null (`true`, `"json"`), reaches SGLang
  0.5.23's pydantic `mode="before"` validators, which call `.get()` on it: AttributeError, a bare
  500. `BodyShapeGuard` (ASGI middleware on SGLang's FastAPI app) answers them with a 400 in
  SGLang's own OpenAI error shape instead; every other body passes through untouched.

Private SGLang internals: `TokenizerManager._validate_one_request(obj, input_ids)` and its
`model_config.vocab_size`, hooked through SGLang's plugin `HookRegistry`; the module-level
FastAPI `app` of `sglang.srt.entrypoints.http_server`.
This module imports nothing heavy at import time (the CLI uses the redaction helpers).
"""

from __future__ import annotations

import json
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


def body_shape_problem(body: bytes) -> str | None:
    """What is wrong with an OpenAI request body's shape, or None (also for non-JSON bodies:
    SGLang reports those itself, with a 400)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return f"the request body must be a JSON object, not a JSON {type(payload).__name__}"
    fmt = payload.get("response_format")
    if fmt is not None and not isinstance(fmt, dict):
        return ("response_format must be an object such as {\"type\": \"json_object\"}, "
                f"not a JSON {type(fmt).__name__}")
    return None


class BodyShapeGuard:
    """ASGI middleware: 400 for OpenAI request bodies SGLang would answer with a 500."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope["method"] != "POST"
                or not scope["path"].startswith("/v1/")
                or any(k == b"content-encoding" for k, _ in scope["headers"])):
            return await self.app(scope, receive, send)
        chunks, message = [], {"more_body": True}
        while message.get("more_body"):
            message = await receive()
            if message["type"] != "http.request":  # client gone: let SGLang see it
                return await self.app(scope, _replay(b"".join(chunks), receive, message), send)
            chunks.append(message.get("body", b""))
        body = b"".join(chunks)
        problem = body_shape_problem(body)
        if problem is None:
            return await self.app(scope, _replay(body, receive), send)
        from fastapi.responses import JSONResponse

        error = {"object": "error", "message": problem, "type": "BadRequestError",
                 "param": None, "code": 400}
        await JSONResponse(error, status_code=400)(scope, receive, send)


def _replay(body: bytes, receive, last: dict | None = None):
    """A `receive` that hands the already-read body back once, then defers to the real one."""
    pending = [{"type": "http.request", "body": body, "more_body": last is not None}]
    if last is not None:
        pending.append(last)

    async def replay():
        return pending.pop(0) if pending else await receive()

    return replay


def install_body_guard() -> bool:
    """Add BodyShapeGuard to SGLang's HTTP app, in the process that serves it (the one that
    has imported http_server before plugins load); False elsewhere or if it already started."""
    http = sys.modules.get("sglang.srt.entrypoints.http_server")
    if http is None or getattr(http.app, "_domino_body_guard", False):
        return False
    try:
        http.app.add_middleware(BodyShapeGuard)
    except RuntimeError:  # Starlette refuses once the app has started
        logging.getLogger(__name__).warning("domino_sglang: HTTP app already started; the "
                                            "request body guard is not installed")
        return False
    http.app._domino_body_guard = True
    return True


def _before_launch(*args, **kwargs) -> None:
    install_body_guard()


def register_guards() -> None:
    """Hook the checks into SGLang (SGLang applies hooks after every plugin has loaded)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    install_log_redaction()
    import multiprocessing

    if multiprocessing.current_process().name == "MainProcess":
        # The HTTP app lives in the launching process, which loads plugins before it imports
        # http_server: install the body guard as launch_server starts (before uvicorn runs).
        HookRegistry.register("sglang.srt.entrypoints.http_server.launch_server",
                              _before_launch, HookType.BEFORE)
    HookRegistry.register(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        check_input_ids, HookType.BEFORE)

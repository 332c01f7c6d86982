"""Guards the stock SGLang 0.5.23 server lacks, for the servers that asked for them.

They apply to a server that runs DOMINO, was started by `domino-sglang serve`, or was given
`--domino-guards on` (flags.guards_apply); any other SGLang server in the environment
behaves as stock SGLang. `--domino-request-guards off` turns off the request checks below
(bodies, token ids, logprob counts) of a guarded server; its log redaction and access rules
(access.py: origins, hosts, admin routes) stay on.

- Out-of-vocabulary prompt token ids (`/generate` `input_ids`, a token-id `prompt` on
  `/v1/completions`) reach the target's embedding unchecked and raise IndexError in the
  scheduler, which kills the whole server: one request is a denial of service. They are refused
  in the tokenizer manager instead, as a 400 naming the id (SGLang turns the ValueError into
  its usual error response, like its own context-length check).
- SGLang logs its resolved server arguments at start-up, `api_key` included. The values of
  `--api-key` / `--admin-api-key` on this process's command line (multiprocessing children
  inherit it) are replaced by `<redacted>` in every log record.

- Request bodies (`RequestGuard`, ASGI middleware on SGLang's FastAPI app, every POST route):
  over `--domino-max-request-bytes` a 413 before anything parses them (tokenising a huge chat
  body grew the API process until the OOM killer took the scheduler); nested deeper
  than MAX_JSON_DEPTH a 400. On OpenAI routes (`/v1/...`), a 400 in SGLang's own OpenAI error
  shape for bodies SGLang 0.5.23 answers with a 500 or dies on: JSON that is not an object
  (`[1, 2, 3]`) or a `response_format` that is neither an object nor null (AttributeError in
  its pydantic `mode="before"` validators); a `json_schema` whose `$ref` chain refers back to
  itself (its grammar accepts no token); `top_logprobs` (chat) or `logprobs` (completions)
  outside OpenAI's [0, 20]; `n` (and `/generate`'s `sampling_params.n`) above OpenAI's 128 (2**31
  made the API process allocate until it died); on `/generate`, a `sampling_params` list
  shorter than the batch (SGLang answers 500). Every other body passes through byte for byte.
- `top_logprobs_num` above the vocabulary and out-of-vocabulary `token_ids_logprob` on the
  native `/generate` route kill the scheduler too; refused with the prompt ids above.

Private SGLang internals (sglang_compat.py: HOOKS, TOUCHPOINTS):
`TokenizerManager._validate_one_request(obj, input_ids)` and its `model_config.vocab_size`,
hooked through SGLang's plugin `HookRegistry`; the module-level FastAPI `app` of SGLang's
`http_server` (sglang_compat.loaded_http_server).
This module imports nothing heavy at import time (the CLI uses the redaction helpers).
"""

from __future__ import annotations

import json
import logging
import sys

from domino_sglang.http import flags
from domino_sglang.http.flags import DEFAULT_MAX_REQUEST_BYTES, flag_value

SECRET_FLAGS = ("--api-key", "--admin-api-key")
REDACTED = "<redacted>"


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
    """Redact this process's secret flag values, and the keys in its key files
    (flags.KEY_FILE_FLAGS), from every log record; returns the secrets."""
    from domino_sglang.http.flags import KEY_FILE_FLAGS, read_key_file
    from domino_sglang.spec.options import DominoOptionError

    argv = sys.argv if argv is None else argv
    secrets = [v for v in (flag_value(argv, f) for f in SECRET_FLAGS) if v]
    for flag in KEY_FILE_FLAGS:
        path = flag_value(argv, flag)
        try:
            secrets += [read_key_file(path, flag)] if path else []
        except DominoOptionError:
            pass  # SGLang's parse stops the server on it (flags.apply_key_files)
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
    """BEFORE hook of `TokenizerManager._validate_one_request`: every prompt id, every id asked
    for in `token_ids_logprob`, and `top_logprobs_num` within the vocabulary (each out of range
    killed the scheduler: IndexError in the embedding, `torch.topk` out of range). Only on a
    guarded server (flags.guards_apply), off with --domino-request-guards off."""

    options = flags.current()
    if not options.request_guards or not flags.guards_apply(
            getattr(tokenizer_manager, "server_args", None), options):
        return
    vocab = tokenizer_manager.model_config.vocab_size
    if input_ids and isinstance(input_ids, list) and not isinstance(input_ids[0], list):
        _check_ids(input_ids, vocab, "input_ids")
    top = getattr(obj, "top_logprobs_num", None)
    if isinstance(top, int) and not 0 <= top <= vocab:
        raise ValueError(f"top_logprobs_num must be between 0 and the vocabulary size {vocab}, "
                         f"got {top}")
    wanted = getattr(obj, "token_ids_logprob", None)
    if isinstance(wanted, list) and wanted and all(isinstance(i, int) for i in wanted):
        _check_ids(wanted, vocab, "token_ids_logprob")


def _check_ids(ids: list[int], vocab: int, field: str) -> None:
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(f"{field} contains the out-of-vocabulary token id {bad}; valid "
                         f"range is [0, {vocab})")


# OpenAI caps top_logprobs at 20; SGLang 0.5.23 passes any value to the scheduler, where
# `torch.topk` beyond the vocabulary kills the whole server ("selected index k out of range").
OPENAI_MAX_TOP_LOGPROBS = 20
# Parallel samples per request: OpenAI's cap. SGLang 0.5.23 has none; `n` = 2**31 on /generate
# made the API process allocate until it died (found by the fuzzer, test_crash_survival.py).
MAX_PARALLEL_SAMPLES = 128
# Deeper JSON is refused before it is parsed (the guard's own json.loads recursed at ~1,000 levels
# and answered 500); no OpenAI request or JSON schema a model can follow nests this deep.
MAX_JSON_DEPTH = 64


def json_depth(body: bytes) -> int:
    """Deepest nesting of `[` / `{` in a JSON text, strings skipped (no parsing, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def ref_cycle(schema) -> str | None:
    """The JSON pointer of a `$ref` chain in `schema` that leads back to itself through
    nothing but references (it matches no JSON value; SGLang 0.5.23's grammar then accepts no
    token and answers 500), or None."""
    def resolve(pointer: str):
        node = schema
        for part in pointer.lstrip("#").strip("/").split("/") if pointer != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref, seen = node.get("$ref"), []
            while isinstance(ref, str) and ref.startswith("#") and ref not in seen:
                seen.append(ref)
                target = resolve(ref)
                ref = target.get("$ref") if isinstance(target, dict) else None
            if isinstance(ref, str) and ref in seen:
                return ref
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def body_problem(path: str, body: bytes) -> str | None:
    """What is wrong with a JSON request body, or None (also for non-JSON bodies: SGLang
    reports those itself, with a 400). Depth on every route; the rest on OpenAI routes."""
    if json_depth(body) > MAX_JSON_DEPTH:
        return f"the request body nests deeper than {MAX_JSON_DEPTH} levels"
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if path.rstrip("/") == "/generate" and isinstance(payload, dict):
        params = payload.get("sampling_params")
        for one in params if isinstance(params, list) else [params]:
            if isinstance(one, dict) and "n" in one and (
                    one["n"] is None or _too_many_samples(one["n"])):  # null: a 500 there
                return f"sampling_params.n must be between 1 and {MAX_PARALLEL_SAMPLES}"
        batch = _batch_size(payload)
        if isinstance(params, list) and batch is not None:
            # SGLang reads entry i for prompt i, over the list repeated n times (parallel
            # sampling): a shorter list fails there with a 500
            first = params[0] if params and isinstance(params[0], dict) else {}
            n = first.get("n", 1) if isinstance(first.get("n", 1), int) else 1
            if len(params) * max(n, 1) < batch:
                return (f"sampling_params is a list of {len(params)} but the batch has {batch} "
                        "prompts: give one per prompt, or one object for all")
    if not path.startswith("/v1/"):
        return None
    if not isinstance(payload, dict):
        return f"the request body must be a JSON object, not a JSON {type(payload).__name__}"
    fmt = payload.get("response_format")
    if fmt is not None and not isinstance(fmt, dict):
        return ("response_format must be an object such as {\"type\": \"json_object\"}, "
                f"not a JSON {type(fmt).__name__}")
    if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
        cycle = ref_cycle(fmt["json_schema"].get("schema"))
        if cycle is not None:
            return (f"response_format json_schema: the $ref {cycle!r} refers back to itself "
                    "and matches no JSON value")
    if _too_many_samples(payload.get("n")):
        return f"n must be between 1 and {MAX_PARALLEL_SAMPLES}"
    top = payload.get("top_logprobs")
    if path.startswith("/v1/completions"):  # the legacy API's count is `logprobs`
        top = payload.get("logprobs")
    if isinstance(top, int) and not isinstance(top, bool) and not (
            0 <= top <= OPENAI_MAX_TOP_LOGPROBS):
        name = "logprobs" if path.startswith("/v1/completions") else "top_logprobs"
        return f"{name} must be between 0 and {OPENAI_MAX_TOP_LOGPROBS}, got {top}"
    return None


def _batch_size(payload: dict) -> int | None:
    """The number of prompts of a batched `/generate` body (`text` a list, or `input_ids` a
    list of lists), None for a single prompt."""
    text, ids = payload.get("text"), payload.get("input_ids")
    if text is not None:  # SGLang reads `text` first, whatever `input_ids` holds
        return len(text) if isinstance(text, list) else None
    if isinstance(ids, list) and ids and all(isinstance(i, list) for i in ids):
        return len(ids)
    return None


# Routes whose handler kills the scheduler on a server without the feature they drive: the
# route -> (what the server needs, whether this server has it). Found by calling every admin
# route with bad arguments (tests/reliability/test_crash_survival.py).
def _has_expert_recorder(server_args) -> bool:
    return bool(getattr(server_args, "expert_distribution_recorder_mode", None))


def _on_cuda(server_args) -> bool:  # the handlers synchronise CUDA unconditionally
    return str(getattr(server_args, "device", None) or "cuda") == "cuda"


ROUTE_NEEDS = {
    "/start_expert_distribution_record": ("--expert-distribution-recorder-mode",
                                          _has_expert_recorder),
    "/stop_expert_distribution_record": ("--expert-distribution-recorder-mode",
                                         _has_expert_recorder),
    "/dump_expert_distribution_record": ("--expert-distribution-recorder-mode",
                                         _has_expert_recorder),
    "/release_memory_occupation": ("a CUDA device", _on_cuda),
    "/resume_memory_occupation": ("a CUDA device", _on_cuda),
}


def route_problem(path: str, server_args) -> str | None:
    """Why this route cannot be served by this server at all, or None."""
    need = ROUTE_NEEDS.get(path.rstrip("/"))
    if need is not None and server_args is not None and not need[1](server_args):
        return f"{path} needs a server started with {need[0]}"
    return None


def _too_many_samples(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > MAX_PARALLEL_SAMPLES


def _error(status: int, message: str, kind: str):
    from fastapi.responses import JSONResponse

    return JSONResponse({"object": "error", "message": message, "type": kind, "param": None,
                         "code": status}, status_code=status)


class RequestGuard:
    """ASGI middleware: 413 for bodies over `max_bytes`, 400 for bodies SGLang would answer
    with a 500 or die on (body_problem), 400 for routes this server cannot serve at all
    (route_problem); every other request passes through byte for byte."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES, server_args=None):
        self.app = app
        self.max_bytes = max_bytes
        self.server_args = server_args

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        unserved = route_problem(scope["path"], self.server_args)
        if unserved is not None:
            return await _error(400, unserved, "BadRequestError")(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        too_large = _error(413, f"the request body is larger than {self.max_bytes} bytes "
                                "(--domino-max-request-bytes)", "RequestEntityTooLarge")
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            return await too_large(scope, receive, send)
        chunks, size, message = [], 0, {"more_body": True}
        while message.get("more_body"):
            message = await receive()
            if message["type"] != "http.request":  # client gone: let SGLang see it
                return await self.app(scope, _replay(b"".join(chunks), receive, message), send)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await too_large(scope, receive, send)
        body = b"".join(chunks)
        encoded = any(k.lower() == b"content-encoding" for k, _ in scope["headers"])
        problem = None if encoded else body_problem(scope["path"], body)
        if problem is None:
            return await self.app(scope, _replay(body, receive), send)
        await _error(400, problem, "BadRequestError")(scope, receive, send)


def _replay(body: bytes, receive, last: dict | None = None):
    """A `receive` that hands the already-read body back once, then defers to the real one."""
    pending = [{"type": "http.request", "body": body, "more_body": last is not None}]
    if last is not None:
        pending.append(last)

    async def replay():
        return pending.pop(0) if pending else await receive()

    return replay


def install_http_guards(server_args) -> bool:
    """Add RequestGuard and the access rules (access.py) to SGLang's HTTP app of a guarded
    server (flags.guards_apply), in the process that serves it (the one that has
    imported http_server before plugins load); False elsewhere, for any other server, or if the
    app already started."""
    from domino_sglang import sglang_compat
    from domino_sglang.http import access

    http = sglang_compat.loaded_http_server()
    options = flags.current()
    if (http is None or getattr(http.app, "_domino_guards", False)
            or not flags.guards_apply(server_args, options)):
        return False
    try:
        if options.request_guards:  # --domino-request-guards off: SGLang's own handling
            http.app.add_middleware(RequestGuard, max_bytes=options.max_request_bytes,
                                   server_args=server_args)
        access.install(http.app, server_args, options)
    except RuntimeError:  # Starlette refuses once the app has started
        logging.getLogger(__name__).warning("domino_sglang: HTTP app already started; the "
                                            "request guards are not installed")
        return False
    http.app._domino_guards = True
    return True


def _before_launch(*args, **kwargs) -> None:
    install_http_guards(args[0] if args else kwargs["server_args"])


def register_guards() -> None:
    """Hook the checks into SGLang (SGLang applies hooks after every plugin has loaded)."""
    from domino_sglang import sglang_compat

    if flags.guards_wanted(sys.argv):
        install_log_redaction()
    import multiprocessing

    hooks = {}
    if multiprocessing.current_process().name == "MainProcess":
        # The HTTP app lives in the launching process, which loads plugins before it imports
        # http_server: install the body guard as launch_server starts (before uvicorn runs).
        hooks["install_http_guards"] = _before_launch
    hooks["check_input_ids"] = check_input_ids
    sglang_compat.register_hooks(hooks)

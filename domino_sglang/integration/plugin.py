"""SGLang plugin entry point: registers our pieces with SGLang, once per process.

SGLang calls `register()` (through the `sglang.srt.plugins` entry point) in the launcher and in
every scheduler / detokenizer process it spawns, before parsing server arguments, so what it
installs cannot depend on them; each piece limits itself instead:
  - CPU: the oneDNN linears (cpu/linear.py) and the lean Llama forward (cpu/forward.py) patch
    SGLang only under its CPU engine (SGLANG_USE_CPU_ENGINE=1); the `domino_cpu` attention
    backend is only added to the registry and the choices of `--attention-backend` (used when
    named, or by DOMINO on the CPU).
  - DOMINO: the algorithm is registered so that `--speculative-algorithm DOMINO` parses; its
    hooks (algorithm.py: `clip_max_new_tokens`, `cumulate_penalties`,
    `refuse_unsupported_outputs`) return at once unless the server's speculative algorithm is
    DOMINO, and the worker and drafter model class are only built when it is.
  - Guarded servers only (a DOMINO server, one started by `domino-sglang serve`, or one given
    `--domino-guards on`): the request guards, access rules and log redaction (guards.py,
    http/access.py), which fix stock SGLang 500s and crashes; every other server in the
    environment behaves as stock SGLang. The plugin's flags (server_flags.py, options.py) are
    added to every server's parser: they change nothing unless given.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
_registered = False


def register() -> None:
    """Register the CPU attention backend, the packed oneDNN CPU linears (cpu/linear.py) and
    the lean Llama forward (cpu/forward.py), both CPU engine only, the DOMINO algorithm, the
    request / log guards (guards.py) with the access rules (http/access.py), and the plugin's
    server flags (server_flags.py). Idempotent."""
    global _registered
    if _registered:
        return
    from domino_sglang.cpu import forward, linear
    from domino_sglang.cpu.attention import register_backend
    from domino_sglang.http.guards import register_guards
    from domino_sglang.integration.algorithm import register_algorithm
    from domino_sglang.integration.server_flags import register as register_flags

    register_backend()
    linear.install()
    forward.install()
    register_algorithm()
    register_guards()
    register_flags()
    _registered = True
    logger.debug("domino_sglang registered")

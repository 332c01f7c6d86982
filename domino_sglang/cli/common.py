"""What every `domino-sglang` subcommand shares: the one way a command fails (one line, exit 2).

Imports nothing from the package, so any subcommand module (and local_server) may import it.
"""

from __future__ import annotations

import sys
from typing import NoReturn


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `domino-sglang: error: MESSAGE` to stderr and exit with `code`."""
    print(f"domino-sglang: error: {message}", file=sys.stderr)
    raise SystemExit(code)

"""domino_sglang: Domino speculative decoding as an SGLang serving extension.

Importing this package is cheap (no torch, no SGLang): SGLang's plugin loader calls `register()`
in every process it starts, through the `sglang.srt.plugins` entry point.
"""

__version__ = "0.1.0"


def register() -> None:
    """SGLang plugin entry point (idempotent); see `domino_sglang.integration.plugin`."""
    from domino_sglang.integration.plugin import register as _register

    _register()

"""`python -m domino_sglang.cli ...`: the `domino-sglang` command (torchrun and the test harness
launch it this way)."""

from domino_sglang.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

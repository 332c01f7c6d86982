"""The per-width CUDA graph captures of the worker's start-up (capture.capture_runtime), with the
device's memory and SGLang's capture stubbed: captured when there is room, with the memory they
took logged; skipped below RUNTIME_MIN_FREE free, naming --mem-fraction-static; a failed capture
is served eagerly rather than refusing to start."""

from __future__ import annotations

import pytest

from domino_sglang.integration import capture
from domino_sglang.integration.capture import RUNTIME_MIN_FREE

GB = 1 << 30


@pytest.mark.parametrize("free,fails,captured,said", [
    ([8 * GB, 7 * GB], False, True, "verify CUDA graphs at width 4 took 1024.0 MB"),
    ([RUNTIME_MIN_FREE - 1], False, False, "lower --mem-fraction-static"),
    ([8 * GB], True, False, "could not capture the verify CUDA graphs at width 4"),
])
def test_a_width_is_captured_only_with_room(monkeypatch, caplog, free, fails, captured, said):
    readings = iter(free)
    monkeypatch.setattr(capture, "free_device_memory", lambda device: next(readings))

    def fake_capture(model_runner, width):
        if fails:
            raise RuntimeError("capture failed")
        return ("backend", f"runner{width}")

    monkeypatch.setattr(capture, "verify_graph_runtime", fake_capture)
    runtimes: dict = {}
    with caplog.at_level("INFO", logger="domino_sglang.integration.worker"):
        capture.capture_runtime(runtimes, object(), 4, "verify", "cuda")
    assert (4 in runtimes) is captured and said in caplog.text

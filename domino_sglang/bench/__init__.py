"""Measurement pieces the maintained benchmarks (benchmarks/*.py) share, kept in the package so
the tests exercise them without importing benchmark scripts (as vLLM keeps vllm/benchmarks/):
load-test prompts and latency metrics, domino_ counter deltas from /metrics (loadgen.py), and
paired speed-up estimates (stats.py). Standard library only at import time: no SGLang, no torch.
"""

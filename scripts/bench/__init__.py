"""Benchmarks, not tests: python -m scripts.bench.reward, .preflight, .cpu_train."""

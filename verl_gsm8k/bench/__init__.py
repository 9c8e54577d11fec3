"""Benchmarks, not tests: python -m verl_gsm8k.bench.reward, .preflight, .cpu_train, .learning."""

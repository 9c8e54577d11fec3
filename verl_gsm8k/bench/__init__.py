"""Benchmarks, not tests: python -m verl_gsm8k.bench.cpu_train (make bench-cpu), .gpu_probe."""

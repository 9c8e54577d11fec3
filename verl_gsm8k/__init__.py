"""The project's Python code, one package per stage, each run as ``python -m verl_gsm8k.<stage>``.

    preflight     the knob checks (knobs.py) and the preflight every recipe runs before verl
    verl_plugins  modules verl imports in every process (VERL_USE_EXTERNAL_MODULES): the CPU
                  platform and the flash-attention fallback
    report        a run's metrics -> report.html, summary.json and health checks
    merge         verl's FSDP checkpoint -> a verified Hugging Face model (scripts/merge.sh)
    evaluate      EvalScope on GSM8K, baseline vs trained, in .venv-eval (scripts/eval.sh)
    bench         benchmarks, not tests: reward throughput, preflight vs verl, CPU training
    common        small shared helpers: atomic writes, the tiny test model

The bash entry points live in scripts/: setup.sh, merge.sh, eval.sh. The map of the whole
project, and why the code is one package named verl_gsm8k: docs/architecture.md.
"""

"""The project's Python code, one package per stage, each run as ``python -m verl_gsm8k.<stage>``.

    preflight     the knob checks (knobs.py) and the preflight every recipe runs before verl
    verl_plugins  modules verl imports in every process (VERL_USE_EXTERNAL_MODULES): the CPU
                  platform and the flash-attention fallback
    report        a run's metrics -> report.html, summary.json and health checks
    replay        the pages beside a run's report: replay.html (the trace), rollouts.html
    compare       several runs side by side (python -m verl_gsm8k.report RUN_A RUN_B)
    questions     which questions changed: one row per question, one column per model or step
    trace         the gsm8k_trace trainer: a per-token trace of a few samples a step
    launch        the launch record and resume guard common.sh runs before verl
    merge         verl's FSDP checkpoint -> a verified Hugging Face model (scripts/merge.sh)
    evaluate      EvalScope on GSM8K, baseline vs trained, in .venv-eval (scripts/eval.sh)
    bench         benchmarks, not tests: reward throughput, preflight vs verl, CPU training
    common        small shared helpers: atomic writes, the tiny test model

The bash entry points live in scripts/: setup.sh, merge.sh, eval.sh. The map of the whole
project, and why the code is one package named verl_gsm8k: docs/architecture.md.
"""

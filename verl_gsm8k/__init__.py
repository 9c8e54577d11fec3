"""The project's Python code, one package per stage, each run as ``python -m verl_gsm8k.<stage>``.

Bottom to top (LAYERS below; a package imports only packages of lower layers, tests/test_layout.py):

    common        small shared helpers: atomic writes, the launch record, the tiny test model
    preflight     the knob checks (knobs.py) and the preflight every recipe runs before verl
    guard         the trainer that guards a run: atomic checkpoints, the watchdog, the kept best,
                  pruning, how a launch ended
    trace         the traced trainer: a per-token trace of a few samples a step
    merge         verl's FSDP checkpoint -> a verified Hugging Face model (scripts/merge.sh)
    questions     which questions changed: one row per question, one column per model or step
    launch        the resume guard and the checkpoint verification common.sh runs before verl
    evaluate      EvalScope on GSM8K, baseline vs trained, in .venv-eval (scripts/eval.sh)
    verl_plugins  modules verl imports in every process (VERL_USE_EXTERNAL_MODULES): the CPU
                  platform, the flash-attention fallback, the recipes' trainer, checked loads
    analysis      a run read and checked: metrics in every format verl writes, health checks
    replay        the pages beside a run's report: replay.html (the trace), rollouts.html
    runreport     one run's report.html, summary.json and terminal digest
    compare       several runs side by side
    report        the entry point on top of the pages: python -m verl_gsm8k.report RUN [RUN ...]
    bench         benchmarks, not tests: reward throughput, preflight vs verl, CPU training

The bash entry points live in scripts/: setup.sh, merge.sh, eval.sh. The map of the whole
project, and why the code is one package named verl_gsm8k: docs/architecture.md.
"""

# Packages bottom to top. A package imports only from packages in lower layers (none of its own
# layer), so the pages never reach up to the entry point that chooses them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("common",),
    ("preflight", "guard"),
    ("trace", "merge", "questions"),
    ("launch", "evaluate", "verl_plugins"),
    ("analysis",),
    ("replay",),
    ("runreport",),
    ("compare",),
    ("report",),
    ("bench",),
)

"""The project's Python code, one package per stage, each run as ``python -m verl_gsm8k.<stage>``.

Bottom to top (LAYERS below; a package imports only packages of lower layers, tests/test_layout.py):

    common        small shared helpers: a run directory's layout (run_dir.py), atomic writes,
                  the launch record, a launch's variables in its processes, the tiny test model
    tools         the calculator the tool recipes give the model through verl's agent loop
    svgplot       a small SVG line-chart library (standard library only) the pages draw with
    wheelhouse    a locked environment's files in a folder, for a machine without internet: the
                  manifest and its check (standard library only: scripts/setup.sh runs it)
    guard         a long run's protections inside the trainer: the health rules (the watchdog's,
                  which the report runs too), their thresholds, verl's metric names, pruning,
                  a Slurm job's deadline
    trace         the per-token trace of a few samples a step: which samples, the lines
    merge         verl's FSDP checkpoint -> a verified Hugging Face model (scripts/merge.sh)
    reshard       a PPO checkpoint's FSDP shards rewritten for another world size (a resume on
                  another number of GPUs)
    questions     which questions changed: one row per question, one column per model or step
    ppo_trainer   the trainer every PPO launch runs: verl's sync trainer, guarded and traced
    sft_trainer   the trainer the SFT recipe runs: verl's SFT trainer, saving on a stop request
    verl_plugins  modules verl imports in every process (VERL_USE_EXTERNAL_MODULES): the CPU
                  platform, the flash-attention fallback, the PPO trainer's registration,
                  checked loads
    evaluate      EvalScope on GSM8K, baseline vs trained, in .venv-eval (scripts/eval.sh)
    preflight     the preflight every recipe runs before verl
    resume        what a launch resumes, run by the launcher before verl: the checkpoint verified,
                  the same-config check, the launch record
    launch        a recipe's launch, knobs to verl and back: the knob table, the overrides, the
                  preflight, the resume record, verl supervised, its processes reaped, how it
                  ended (python -m verl_gsm8k.launch)
    sbatch        what slurm/*.sbatch exec: a recipe in a Slurm job, one node or Ray over its
                  nodes (python -m verl_gsm8k.sbatch)
    analysis      a run read and checked: metrics in every format verl writes, health checks
    replay        the pages beside a run's report: replay.html (the trace), rollouts.html
    runpage       one run's report.html, summary.json and terminal digest
    compare       several runs side by side
    report        the entry point on top of the pages: python -m verl_gsm8k.report RUN [RUN ...]
    bench         benchmarks, not tests: a CPU training run, the GPU memory probe

The bash entry points live in scripts/: setup.sh, merge.sh, eval.sh. The map of the whole
project, and why the code is one package named verl_gsm8k: docs/architecture.md.
"""

# Packages bottom to top. A package imports only from packages in lower layers (none of its own
# layer), so the pages never reach up to the entry point that chooses them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("common", "svgplot", "tools"),
    ("guard", "wheelhouse"),
    ("trace", "merge", "reshard", "questions"),
    ("ppo_trainer", "sft_trainer"),
    ("verl_plugins", "evaluate"),
    ("preflight",),
    ("resume",),
    ("launch",),
    ("sbatch",),
    ("analysis",),
    ("replay",),
    ("runpage",),
    ("compare",),
    ("report",),
    ("bench",),
)

"""The project's Python code, one package per stage (``python -m verl_gsm8k.<stage>``).

Bottom to top (LAYERS below; a package imports only packages of lower layers):

    tools         the calculator of the tool recipes (verl's agent loop) and its config
    common        shared helpers: the run directory's layout, atomic writes, the launch record
    svgplot       a small SVG line-chart library for the pages
    wheelhouse    a locked environment's files for a machine without internet (stdlib only)
    guard         the trainer's protections: health rules, thresholds, metric names, pruning
    trace         the per-token trace of a few samples a step
    merge         verl's FSDP checkpoint -> a verified Hugging Face model
    reshard       a PPO checkpoint's FSDP shards rewritten for another world size
    questions     which questions changed, per model or step
    ppo_trainer   verl's sync PPO trainer, guarded and traced
    sft_trainer   verl's SFT trainer, saving on a stop request
    verl_plugins  modules verl imports in every process (VERL_USE_EXTERNAL_MODULES)
    evaluate      EvalScope on GSM8K, baseline vs trained (.venv-eval)
    preflight     the preflight every recipe runs before verl
    resume        what a launch resumes: the checkpoint verified, the same-config check
    launch        a recipe's launch: knobs to Hydra overrides, verl supervised, its exit
    sbatch        a recipe in a Slurm job, one node or Ray over its nodes
    analysis      a run read and checked: metrics in every format verl writes, health checks
    replay        the pages beside a run's report: replay.html, rollouts.html
    runpage       one run's report.html, summary.json and terminal digest
    compare       several runs side by side
    report        the entry point on top of the pages
    bench         benchmarks, not tests: a CPU training run, the GPU memory probe

The map of the whole project: docs/architecture.md.
"""

# Packages bottom to top; a package imports only from lower layers (tests/test_layout.py).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tools",),
    ("common", "svgplot"),
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

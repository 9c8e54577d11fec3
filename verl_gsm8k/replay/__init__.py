"""Pages that look inside a run, beside its report: the per-token replay of a PPO/GRPO iteration
(``replay.html``, from ``RUN_DIR/trace/``) and the rollout browser (``rollouts.html``, from verl's
``RUN_DIR/rollouts/`` and ``RUN_DIR/validation/`` dumps).

``load.py`` reads the trace (one line per problem: a missing trace, a truncated file, a trace of
another run), ``replay_page.py`` and ``rollouts_page.py`` write the pages, ``assets.py`` holds the
pages' shared script and style, ``checks.py`` the health checks only per-token data can make.
Standard library only; the pages are offline HTML that load their data from ``.js`` files beside
them (one per step, so a 500-step run stays usable), and open from ``file://``.
"""

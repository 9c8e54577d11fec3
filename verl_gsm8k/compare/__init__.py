"""The run comparison, ``python -m verl_gsm8k.report RUN_A RUN_B ...``: runs.py (each run as the
report reads it, its axes and table), config.py (each run's config and the config diff), page.py
(comparison.html), cli.py (summary.json, the digest)."""

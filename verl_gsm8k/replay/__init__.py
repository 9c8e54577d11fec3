"""The pages that look inside a run, beside its report: the per-token replay of one iteration
and the rollout browser (pages.py; replay.js, rollouts.js and common.js the pages' code, their
bodies in replay.html and rollouts.html), from the trace as load.py reads it, and the checks
only per-token data can make (checks.py). Standard library only."""

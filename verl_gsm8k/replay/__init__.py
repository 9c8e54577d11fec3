"""The pages that look inside a run: the per-token replay and the rollout browser."""

"""Reward functions for verl (standard library only); see rewards/gsm8k.py and docs/reward.md."""

"""The per-token trace of a PPO / GRPO step, recorded inside verl's own trainer.

The trainer every PPO launch runs (``verl_gsm8k/ppo_trainer/traced.py``, registered in verl's
trainer registry as ``gsm8k``) records it: after each step's metrics it takes a few samples of the
step (``select.py``), reads their per-token tensors from verl's TransferQueue before verl clears
them, and writes them (``record.py``) as ``<run dir>/trace/<step>.jsonl`` off the training thread
(``TRACE_SAMPLES`` > 0).

One file per step: a ``step`` line (the run's algorithm settings and the step's metrics), then one
``sample`` line per traced response. Numbers that do not exist in a run (no critic in GRPO, no KL
in the reward) are absent, never zeros; NaN and infinities are written as null.
"""

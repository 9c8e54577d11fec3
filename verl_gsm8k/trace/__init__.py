"""The per-token trace of a PPO / GRPO step, recorded inside verl's own trainer.

``verl_gsm8k.trace.trainer`` is verl's v1 ``sync`` trainer, registered in verl's trainer registry
as ``gsm8k_trace`` (``trainer.v1.trainer_mode=gsm8k_trace``, set by ``recipes/common.sh`` when
``TRACE_SAMPLES`` > 0). After each step's metrics it takes a few samples of the step
(``select.py``), reads their per-token tensors from verl's TransferQueue before verl clears them,
and writes them (``record.py``) as ``<run dir>/trace/<step>.jsonl`` off the training thread.

One file per step: a ``step`` line (the run's algorithm settings and the step's metrics), then one
``sample`` line per traced response. Numbers that do not exist in a run (no critic in GRPO, no KL
in the reward) are absent, never zeros; NaN and infinities are written as null.
"""

"""The per-token trace of a PPO / GRPO step, recorded inside verl's own trainer
(ppo_trainer/traced.py, legacy.py): a few whole prompt groups a step (select.py), their
per-token tensors read before verl clears them, written as ``RUN_DIR/trace/<step>.jsonl`` off
the training thread (record.py). What a run does not compute is absent, never zeros."""

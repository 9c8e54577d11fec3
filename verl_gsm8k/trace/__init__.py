"""The per-token trace of a PPO / GRPO step, written as RUN_DIR/trace/<step>.jsonl."""

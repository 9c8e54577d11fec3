"""Evaluation on GSM8K with EvalScope (run through scripts/eval.sh, in .venv-eval)."""

"""The run comparison: python -m verl_gsm8k.report RUN_A RUN_B ... (docs/compare.md)."""

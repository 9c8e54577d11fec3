"""The run report: python -m verl_gsm8k.report INPUT [INPUT ...] (cli.py)."""

"""The preflight every recipe runs before verl (cli.py: python -m verl_gsm8k.preflight)."""

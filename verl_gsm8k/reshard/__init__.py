"""A PPO checkpoint's FSDP shards rewritten for another world size (shards.py), by the launcher
or ``python -m verl_gsm8k.reshard``."""

"""A PPO checkpoint's FSDP shards rewritten for another world size (shards.py): the launcher does
it when a resume changes only the GPU count; ``python -m verl_gsm8k.reshard`` by hand."""

"""A PPO checkpoint moved to another number of GPUs: each role's FSDP shards rewritten from world
size W to W' (``shards.py``), beside the originals, for verl to resume at W'.

verl 0.9.1 resumes only the shards of its own world size, so a run that lost a node, or moves
from 8 GPUs to 4, would start over from a merged model without its optimizer state. The launcher
reshards the checkpoint it resumes when only the world size changed (``trainer.nnodes`` times
``trainer.n_gpus_per_node``: resume/__main__.py); ``python -m verl_gsm8k.reshard RUN_DIR
--world-size N`` does it by hand (docs/resume.md, "Another number of GPUs").
"""

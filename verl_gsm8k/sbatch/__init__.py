"""python -m verl_gsm8k.sbatch: what slurm/*.sbatch exec (cli.py)."""

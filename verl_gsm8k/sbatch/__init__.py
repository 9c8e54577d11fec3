"""What the sbatch files of slurm/ exec: a recipe in a Slurm job, on one node or on Ray over
the job's nodes (python -m verl_gsm8k.sbatch; the code: cli.py)."""

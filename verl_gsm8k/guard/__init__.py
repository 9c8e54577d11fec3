"""Protections for a long run, applied by the trainer every PPO launch runs
(``verl_gsm8k/ppo_trainer/guarded.py``): what it leaves in the run directory (files.py), the
watchdog's rules (rules.py) and their knobs (thresholds.py), pruning (prune.py), a Slurm job's
deadline (deadline.py) and how a launch ended (status.py)."""

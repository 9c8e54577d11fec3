"""Protections for a long run, applied by the trainer every PPO launch runs
(``verl_gsm8k/ppo_trainer/guarded.py``): the watchdog's rules (rules.py) and their knobs
(thresholds.py), pruning (prune.py), a Slurm job's deadline (deadline.py), how a launch ended
(status.py) and the processes of a launch (reap.py). What they leave in the run directory, and
every name in it: verl_gsm8k/common/run_dir.py."""

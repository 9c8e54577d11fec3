"""Protections for a long run, applied by the trainer every PPO launch runs
(``verl_gsm8k/ppo_trainer/guard_base.py``): the watchdog's rules (rules.py) and their knobs
(watchdog_settings.py), pruning (prune.py) and a Slurm job's deadline (deadline.py). What they
leave in the run directory, and every name in it: verl_gsm8k/common/run_dir.py. ``say`` prints
the one-line messages of the trainers (PPO's and SFT's) and of the signal plugins, each
``gsm8k_guard: ...`` in verl's console output."""


def say(line: str) -> None:
    print(f"gsm8k_guard: {line}", flush=True)

"""python -m verl_gsm8k.sbatch: the command line is verl_gsm8k/sbatch/cli.py."""

from verl_gsm8k.sbatch.cli import main

raise SystemExit(main())

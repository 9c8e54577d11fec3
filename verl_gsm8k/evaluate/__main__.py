"""python -m verl_gsm8k.evaluate, run by scripts/eval.sh: the command line is evaluate/cli.py."""

from verl_gsm8k.evaluate.cli import main

raise SystemExit(main())

"""python -m verl_gsm8k.evaluate (scripts/eval.sh): evaluate/cli.py."""

from verl_gsm8k.evaluate.cli import main

raise SystemExit(main())

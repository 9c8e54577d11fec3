"""python -m verl_gsm8k.merge, run by scripts/merge.sh: the command line is merge/cli.py."""

from verl_gsm8k.merge.cli import main

raise SystemExit(main())

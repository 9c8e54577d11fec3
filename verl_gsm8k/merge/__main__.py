"""python -m verl_gsm8k.merge, run by scripts/merge.sh: the command line is merge/checkpoint.py."""

from verl_gsm8k.merge.checkpoint import main

raise SystemExit(main())

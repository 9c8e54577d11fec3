"""python -m verl_gsm8k.reshard: the command line is reshard/cli.py."""

from verl_gsm8k.reshard.cli import main

raise SystemExit(main())

"""python -m verl_gsm8k.preflight (cli.py)."""

from verl_gsm8k.preflight.cli import main

raise SystemExit(main())

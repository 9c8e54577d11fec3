"""python -m verl_gsm8k.report: the command line is verl_gsm8k/report/cli.py."""

from verl_gsm8k.report.cli import main

raise SystemExit(main())

"""python -m verl_gsm8k.warm_start: the command line is warm_start/pick.py."""

from verl_gsm8k.warm_start.pick import main

raise SystemExit(main())

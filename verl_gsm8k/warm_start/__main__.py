"""python -m verl_gsm8k.warm_start: warm_start/pick.py."""

from verl_gsm8k.warm_start.pick import main

raise SystemExit(main())

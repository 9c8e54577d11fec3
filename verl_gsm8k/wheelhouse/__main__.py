"""python -m verl_gsm8k.wheelhouse {manifest,check} --lock LOCK --dir DIR: the wheelhouse's
manifest written from the files in DIR, or DIR checked against LOCK (wheelhouse/manifest.py)."""

from verl_gsm8k.wheelhouse.manifest import main

raise SystemExit(main())

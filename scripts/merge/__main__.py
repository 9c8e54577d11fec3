"""python -m scripts.merge, run by scripts/merge.sh: the command line is merge/checkpoint.py."""

from scripts.merge.checkpoint import main

raise SystemExit(main())

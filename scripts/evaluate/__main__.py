"""python -m scripts.evaluate, run by scripts/eval.sh: the command line is evaluate/cli.py."""

from scripts.evaluate.cli import main

raise SystemExit(main())

"""python -m scripts.preflight: the command line is scripts/preflight/cli.py."""

from scripts.preflight.cli import main

raise SystemExit(main())

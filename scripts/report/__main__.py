"""python -m scripts.report: the command line is scripts/report/cli.py."""

from scripts.report.cli import main

raise SystemExit(main())

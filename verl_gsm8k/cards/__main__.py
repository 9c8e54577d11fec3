"""python -m verl_gsm8k.cards [--write docs/gpu.md]: the per-card table (table.py)."""

from verl_gsm8k.cards.table import main

raise SystemExit(main())

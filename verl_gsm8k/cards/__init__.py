"""Which recipe fits which card: the per-card table of docs/gpu.md, from the preflight's memory
model (``python -m verl_gsm8k.cards``; table.py)."""

"""The run report: verl metrics -> report.html, summary.json and health checks.

python -m verl_gsm8k.report RUN_DIR_OR_FILE [--out DIR] [--follow [--interval S]]
python -m verl_gsm8k.report RUN_A RUN_B [RUN_C ...] [--out DIR]   (verl_gsm8k/compare/)
"""

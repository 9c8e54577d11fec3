"""The run report: verl metrics -> report.html, summary.json and health checks.

python -m verl_gsm8k.report RUN_DIR_OR_FILE [--out DIR] [--follow [--interval S]]
"""

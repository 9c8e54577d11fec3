"""One run's report page: summary.json (summary), report.html (html, its SVG charts in plots) and
the terminal digest (digest), from what verl_gsm8k.analysis read and checked. The entry point,
``python -m verl_gsm8k.report``, lives one layer up in verl_gsm8k/report.
"""

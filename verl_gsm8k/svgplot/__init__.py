"""A small SVG line-chart library (chart.py), standard library only, below every page that draws
charts: one run's report (verl_gsm8k/runpage/plots.py) and the run comparison
(verl_gsm8k/compare/charts.py)."""

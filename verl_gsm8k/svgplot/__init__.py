"""What the offline pages are drawn with, standard library only: SVG line charts (chart.py) and
the pages' shared stylesheet, page, tables and data files (page.py)."""

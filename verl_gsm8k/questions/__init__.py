"""Which questions changed: one row per question, one column per model or step
(docs/questions.md): table.py (the rows, their classes, McNemar), runs.py (the columns of runs
and evaluations), page.py (questions.html, its data files, summary.json)."""

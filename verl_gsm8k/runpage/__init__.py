"""One run's report: summary.json, report.html and the terminal digest."""

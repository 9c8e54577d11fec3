"""A run read and checked, no page drawn: the metrics, the health checks, the evaluations."""

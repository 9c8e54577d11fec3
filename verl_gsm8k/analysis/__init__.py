"""A run read and checked, no page drawn: verl's metrics in every format it writes (parse, one
vocabulary of names in vocab), the health checks (checks, learning; their constants in
thresholds, what they return in finding), the watchdog's trips and the kept best (guard_records),
and the checkpoint evaluations beside validation (evals). Used by the run report, the replay's
checks and the run comparison; imports none of them.
"""

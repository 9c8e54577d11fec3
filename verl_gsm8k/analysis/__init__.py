"""A run read and checked, no page drawn: verl's metrics in every format it writes (parse), the
health checks (checks: guard's per-step rules over every step and the whole-run trends; what they
return in finding), the watchdog's trips and the kept best (guard_records), and the checkpoint
evaluations beside validation (evals). Used by the run report, the replay's checks and the run
comparison; imports none of them.
"""

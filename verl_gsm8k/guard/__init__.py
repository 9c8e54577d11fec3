"""Protections inside verl's trainer for a long run: what it leaves in the run directory
(files.py), the watchdog's rules (rules.py) and the trainer that applies them (trainer.py)."""

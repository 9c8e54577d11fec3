"""Checks before a launch: the knob table (knobs.py) and the preflight (cli.py).

Standard library only at this level: knobs.py must import without verl.
"""

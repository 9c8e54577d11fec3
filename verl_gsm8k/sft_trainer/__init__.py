"""The trainer the SFT recipe runs: verl's SFT entry (``__main__.py``; it has no trainer
registry) with ``stoppable.py``'s trainer, which saves the step in flight on a stop request."""

"""The SFT recipe's trainer: verl's SFT entry (``__main__.py``) with ``stoppable.py``'s trainer."""

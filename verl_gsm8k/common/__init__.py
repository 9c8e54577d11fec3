"""Small helpers shared by the stages: atomic writes, the tiny offline test model."""

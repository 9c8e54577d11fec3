"""Small helpers shared by the stages."""

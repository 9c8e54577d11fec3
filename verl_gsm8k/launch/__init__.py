"""The launch of a recipe, from its knobs to verl and back: python -m verl_gsm8k.launch."""

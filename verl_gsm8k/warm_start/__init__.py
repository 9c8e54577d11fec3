"""The warm start picked by its accuracy (``python -m verl_gsm8k.warm_start``): the first save
of an SFT run whose greedy accuracy lands in a band (learn_tiny's TOY_TASK=hard)."""

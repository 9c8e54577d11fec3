"""The warm start picked by its accuracy, not its step count: ``python -m verl_gsm8k.warm_start``.

An SFT run that saves every few steps (``huggingface/`` in a step directory, verl's ``hf_model``
save) is scored save by save, greedily, on a verl RL test parquet (``score.py``: the reward's
marker accuracy and the share right in any format), and the first save whose accuracy lands in a
band is the one kept (``pick.py``). recipes/learn_tiny.sh uses it for ``TOY_TASK=hard``, whose sum
table emerges abruptly during SFT and at a different step for every seed (docs/algorithms.md).
"""

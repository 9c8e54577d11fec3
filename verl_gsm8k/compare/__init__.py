"""The run comparison: two or more runs on one page.

python -m verl_gsm8k.report RUN_A RUN_B [RUN_C ...] [--out DIR]
"""

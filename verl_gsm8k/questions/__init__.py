"""Which questions changed: one row per question, one column per model or step (docs/questions.md).

    python -m verl_gsm8k.questions RUN_DIR/validation/0.jsonl RUN_DIR/validation/20.jsonl --out DIR
    python -m verl_gsm8k.questions --run RUN_DIR --out DIR      # every validation step of a run
    python -m verl_gsm8k.questions --evalscope RUN_DIR/checkpoint_eval --out DIR  # eval.sh output

table.py reads verl's validation dumps (``<step>.jsonl``: input, output, gts, acc) and EvalScope's
reviews (judged again by our reward, rewards/gsm8k.py), matches rows
by question text + ground truth (never by position), classifies each question (learned,
forgotten, flipping, never/always right, format-not-arithmetic) and runs the exact McNemar test
of the first vs the last column. page.py writes questions.html, one ``data/col<i>.js`` per
column (loaded by <script>, not inlined) and summary.json, each to a temp path then renamed.
"""

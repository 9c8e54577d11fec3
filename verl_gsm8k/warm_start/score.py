"""Greedy accuracy of a Hugging Face model on a verl RL parquet (``prompt``: chat messages,
``reward_model.ground_truth``, ``data_source``), scored by the project's reward: the marker line
(``compute_score``, what verl's validation reports) and right in any format
(``compute_score_flexible``). Transformers' ``generate`` on the CPU, in batches, left-padded, the
chat template applied as verl's RL dataset applies it: for the toy model, seconds per save.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rewards.gsm8k import compute_score, compute_score_flexible


@dataclass(frozen=True)
class Score:
    marker: float  # accuracy on the "#### N" line: verl's val-core acc for this reward
    any_format: float  # the number right wherever it is written
    questions: int


def read_questions(test_file: Path) -> list[dict]:
    """The parquet's rows; one line naming the file and the missing column when it is not a verl
    RL parquet."""
    import pyarrow.parquet as pq

    rows = pq.read_table(test_file).to_pylist()
    for column in ("prompt", "reward_model", "data_source"):
        if rows and column not in rows[0]:
            raise ValueError(f"{test_file}: no column {column!r} (not a verl RL parquet)")
    if not rows:
        raise ValueError(f"{test_file}: no rows")
    return rows


def greedy_answers(
    model_dir: Path, prompts: list[list[dict]], max_new_tokens: int, batch_size: int = 100
) -> list[str]:
    """The model's greedy response to each chat prompt, special tokens dropped."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()  # a bar per load, one load per save: noise in the log
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
    answers: list[str] = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True)
            out = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
            new = out[:, batch["input_ids"].shape[1] :]
            answers += tokenizer.batch_decode(new, skip_special_tokens=True)
    return answers


def score(model_dir: Path, rows: list[dict], max_new_tokens: int) -> Score:
    answers = greedy_answers(model_dir, [row["prompt"] for row in rows], max_new_tokens)
    marker = flexible = 0.0
    for row, answer in zip(rows, answers, strict=True):
        truth, source = row["reward_model"]["ground_truth"], row["data_source"]
        marker += compute_score(source, answer, truth)["acc"]
        flexible += compute_score_flexible(source, answer, truth)["acc"]
    return Score(marker / len(rows), flexible / len(rows), len(rows))

"""Greedy accuracy of a Hugging Face model on a verl RL parquet, by the project's reward: on the
``#### N`` line (``compute_score``: verl's validation) and right in any format. transformers'
``generate`` on the CPU, left-padded batches, the chat template as verl's RL dataset applies it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rewards.gsm8k import compute_score, compute_score_flexible


@dataclass(frozen=True)
class Score:
    marker: float  # accuracy on the "#### N" line
    any_format: float  # the number right wherever it is written
    questions: int


def read_questions(test_file: Path) -> list[dict]:
    """The parquet's rows; ValueError naming the file and what is missing."""
    import pyarrow.parquet as pq

    rows = pq.read_table(test_file).to_pylist()
    if not rows:
        raise ValueError(f"{test_file}: no rows")
    for column in ("prompt", "reward_model", "data_source"):
        if column not in rows[0]:
            raise ValueError(f"{test_file}: no column {column!r} (not a verl RL parquet)")
    return rows


def greedy_answers(model_dir: Path, prompts: list[list[dict]], max_new_tokens: int) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()  # one bar per save scored: noise in the log
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side, tokenizer.pad_token = "left", tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    answers: list[str] = []
    for start in range(0, len(prompts), 100):
        texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
                 for p in prompts[start : start + 100]]  # fmt: skip
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)  # fmt: skip
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

"""Preflight checks of what a run reads: the train/val data files and the reward function.

Both work on the composed verl config (see verl_gsm8k/preflight/cli.py, which runs them):
  data     train/val files exist, have verl's RLHFDataset columns, enough rows for a batch, and
           how many prompts exceed max_prompt_length;
  reward   verl's own loader imports the reward and it scores a right and a wrong answer correctly.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path

from verl_gsm8k.preflight.lines import Report, one_line

REQUIRED_COLUMNS = ("prompt", "data_source", "reward_model")
# A right and a wrong answer in each format a GSM8K prompt can ask for (ground truth 72).
ANSWERS = {
    "####": (
        "She sold 48 / 2 = 24 clips in May, so 48 + 24 = 72 in total.\n#### 72",
        "She sold 48 clips in April and 24 in May.\n#### 70",
    ),
    "\\boxed{}": (
        "She sold 48 / 2 = 24 clips in May, so 48 + 24 = 72 in total: \\boxed{72}",
        "She sold 48 clips in April and 24 in May: \\boxed{70}",
    ),
}


# ---------------------------------------------------------------------------- data
def as_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def read_rows(path: Path):
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        return pq.read_table(path)
    if path.suffix in (".json", ".jsonl"):
        import pyarrow.json as pj

        return pj.read_json(path)
    raise ValueError(f"unsupported file type {path.suffix} (verl reads .parquet, .json, .jsonl)")


def check_data(cfg, tokenizer, report: Report) -> str:
    """Check the train/val files; return the text of the first train prompt ('' if none)."""
    first_prompt = ""
    splits = [
        ("train", as_list(cfg.data.train_files), cfg.data.get("train_max_samples", -1)),
        ("val", as_list(cfg.data.val_files), cfg.data.get("val_max_samples", -1)),
    ]
    for split, files, max_samples in splits:
        total = 0
        for name in files:
            path = Path(os.path.expanduser(name))
            if not path.is_file():
                report.error(
                    "data", f"{split} file {path} does not exist (python -m data_prep.gsm8k)"
                )
                continue
            try:
                table = read_rows(path)
            except Exception as exc:
                report.error("data", f"{split} file {path} cannot be read: {one_line(exc)}")
                continue
            problem = schema_problem(table)
            if problem:
                report.error("data", f"{split} file {path}: {problem}")
                continue
            total += table.num_rows
            if split == "train" and not first_prompt:
                first_prompt = str(table.slice(0, 1).to_pylist()[0]["prompt"][-1].get("content"))
            if tokenizer is not None:
                check_prompt_lengths(cfg, tokenizer, table, path, report)
        if max_samples is not None and max_samples > 0:
            total = min(total, max_samples)
        if total and split == "train":
            check_steps(cfg, total, report)
        elif total:
            report.ok("data", f"val: {total} rows")
    return first_prompt


def schema_problem(table) -> str | None:
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        return f"missing column(s) {', '.join(missing)} (have {', '.join(table.column_names)})"
    if table.num_rows == 0:
        return "no rows"
    row = table.slice(0, 1).to_pylist()[0]
    prompt = row["prompt"]
    if not (isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)):
        return "column prompt must be a list of chat messages [{role, content}]"
    if not isinstance(row["reward_model"], dict) or "ground_truth" not in row["reward_model"]:
        return "column reward_model must be a struct with a ground_truth field"
    return None


def check_steps(cfg, rows: int, report: Report) -> None:
    batch = cfg.data.train_batch_size
    steps_per_epoch = rows // batch
    if steps_per_epoch == 0:
        report.error("data", f"train: {rows} rows < train_batch_size {batch}: not one full batch")
        return
    total = cfg.trainer.total_training_steps or steps_per_epoch * cfg.trainer.total_epochs
    report.ok(
        "data",
        f"train: {rows} rows -> {steps_per_epoch} steps/epoch; this run: {total} steps "
        f"(checkpoint every {cfg.trainer.save_freq}, validation every {cfg.trainer.test_freq})",
    )


def check_prompt_lengths(cfg, tokenizer, table, path: Path, report: Report) -> None:
    limit = cfg.data.max_prompt_length
    prompts = table.column("prompt").to_pylist()
    texts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    too_long = sum(n > limit for n in lengths)
    longest = max(lengths)
    if too_long and not cfg.data.filter_overlong_prompts and cfg.data.truncation == "error":
        report.error(
            "data",
            f"{path.name}: {too_long} prompts exceed max_prompt_length {limit} (longest {longest} "
            "tokens) and data.truncation=error would stop training; raise MAX_PROMPT_LENGTH",
        )
    elif too_long:
        report.warn(
            "data",
            f"{path.name}: {too_long} prompts exceed max_prompt_length {limit} and are "
            f"dropped (longest {longest} tokens)",
        )
    else:
        report.ok("data", f"{path.name}: longest prompt {longest} tokens <= {limit}")


# ---------------------------------------------------------------------------- reward
def check_reward(cfg, report: Report, prompt: str = "") -> set[str] | None:
    """The reward must prefer a right answer to a wrong one, in the format the prompts ask for.
    Returns the keys of the reward's result when it is a dict (what verl logs beside the score,
    and what DAPO's filter may read), else None."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    reward_cfg = cfg.reward.custom_reward_function
    if not reward_cfg.path:
        report.warn("reward", "no reward.custom_reward_function.path: verl's built-in scorer runs")
        return
    if not Path(reward_cfg.path).is_file():
        report.error("reward", f"reward file {reward_cfg.path} does not exist")
        return
    try:
        fn = get_custom_reward_fn(cfg)
    except Exception as exc:
        report.error(
            "reward",
            f"verl cannot load '{reward_cfg.name}' from {reward_cfg.path}: "
            f"{one_line(exc)}{available_functions(reward_cfg.path)}",
        )
        return
    answer_format = "\\boxed{}" if "\\boxed" in prompt else "####"
    scores = {}
    keys: set[str] | None = None
    for label, response in zip(("right", "wrong"), ANSWERS[answer_format], strict=True):
        try:
            result = fn(
                data_source="openai/gsm8k",
                solution_str=response,
                ground_truth="72",
                extra_info={"split": "preflight"},
            )
        except Exception as exc:
            report.error("reward", f"{reward_cfg.name} raised on a {label} answer: {one_line(exc)}")
            return
        score = result.get("score") if isinstance(result, dict) else result
        if not is_number(score):
            if not isinstance(result, dict):
                got = repr(result)
            elif "score" in result:
                got = f"a dict with score {score!r}"
            else:
                got = f"a dict without 'score' (keys: {', '.join(map(str, result))})"
            report.error(
                "reward",
                f"{reward_cfg.name} returned {got[:80]} for a {label} answer: a reward must "
                "return a number, or a dict with a numeric 'score'",
            )
            return
        scores[label] = score
        keys = set(map(str, result)) if isinstance(result, dict) else None
    if not scores["right"] > scores["wrong"]:
        hint = (
            "; the training prompts ask for \\boxed{} answers: use a reward that reads them "
            "(REWARD_FN=compute_score_flexible) or prepare data with --prompt-style hash"
            if answer_format != "####"
            else ""
        )
        report.error(
            "reward",
            f"{reward_cfg.name} scores a right {answer_format} answer {scores['right']} and a "
            f"wrong one {scores['wrong']}: it does not separate them{hint}",
        )
        return
    report.ok(
        "reward",
        f"{Path(reward_cfg.path).name}:{reward_cfg.name} loads through verl; right "
        f"{answer_format} answer -> {scores['right']}, wrong -> {scores['wrong']}",
    )
    return keys


def is_number(value: object) -> bool:
    """A finite real number, as verl adds rewards up (a bool or a numeric string is not)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def available_functions(path: str) -> str:
    import ast

    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError):
        return ""
    names = [
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
    ]
    return f" (functions in that file: {', '.join(names)})" if names else ""

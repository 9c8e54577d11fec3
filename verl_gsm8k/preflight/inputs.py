"""What a run reads, for both preflights: the train/val files (rows, verl's columns, lengths, the
steps they make) and the reward function (it scores a right answer above a wrong one)."""

from __future__ import annotations

import ast
import math
import numbers
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def read_rows(path: Path):
    """A data file as verl reads it (.parquet, .json, .jsonl), as a pyarrow table."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        return pq.read_table(path)
    if path.suffix in (".json", ".jsonl"):
        return pj.read_json(path)
    raise ValueError(f"unsupported file type {path.suffix} (verl reads .parquet, .json, .jsonl)")


def check_files(
    cfg: Any, read: Callable[[str, Path, Any], int | None], prep: str, report: Report
) -> dict[str, int]:
    """Rows of each split (train, val; at most its max_samples), each file's table handed to
    ``read(split, path, table)`` (its rows, or None after its error line)."""
    totals = {}
    for split in ("train", "val"):
        rows = 0
        for name in as_list(cfg.data[f"{split}_files"]):
            path = Path(os.path.expanduser(name))
            try:
                table = read_rows(path) if path.is_file() else None
            except Exception as exc:
                report.error("data", f"{split} file {path} cannot be read: {one_line(exc)}")
                continue
            if table is None:
                report.error("data", f"{split} file {path} does not exist (python -m {prep})")
                continue
            rows += read(split, path, table) or 0
        cap = cfg.data.get(f"{split}_max_samples", -1)
        totals[split] = min(rows, cap) if cap and cap > 0 else rows
    return totals


def as_list(value: Any) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else [str(v) for v in value]


def check_lengths(
    cfg: Any,
    lengths: list[int],
    path: Path,
    what: tuple[str, str, str],
    fate: str | None,
    report: Report,
) -> None:
    """``what``: (the texts' noun, the limit's key, its knob); ``fate``: what happens to a text
    over the limit, None when the first one stops training (data.truncation=error)."""
    noun, key, knob = what
    limit = cfg.data[key]
    too_long, longest = sum(n > limit for n in lengths), max(lengths)
    said = f"{path.name}: {too_long} of {len(lengths)} {noun}s exceed {key} {limit}"
    if too_long and fate is None:
        report.error(
            "data",
            f"{said} (longest {longest} tokens) and data.truncation=error "
            f"stops training at the first; raise {knob}",
        )
    elif too_long:
        report.warn("data", f"{said} and are {fate} (longest {longest} tokens)")
    else:
        report.ok("data", f"{path.name}: longest {noun} {longest} tokens <= {limit}")


def token_lengths(tokenizer: Any, conversations: list, generation_prompt: bool) -> list[int]:
    texts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=generation_prompt, tokenize=False)
        for c in conversations
    ]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def check_schedule(cfg: Any, rows: int, n_gpus: int, report: Report, strict: bool = False) -> None:
    """Steps as verl's loader makes them (rows // n_gpus a GPU, whole batches); ``strict``: a
    total_training_steps past the epochs' end is an error (the loop ends first, unsaved)."""
    batch = cfg.data.train_batch_size
    per_epoch = (rows // n_gpus) // max(batch // n_gpus, 1)
    if per_epoch == 0:
        report.error("data", f"train: {rows} rows < train_batch_size {batch}: not one full batch")
        return
    epochs, wanted = cfg.trainer.total_epochs, cfg.trainer.total_training_steps
    if strict and wanted and wanted > per_epoch * epochs:
        report.error(
            "data",
            f"train: total_training_steps={wanted} but {epochs} epoch(s) of "
            f"{per_epoch} steps end verl's SFT loop at step {per_epoch * epochs}, "
            "without a final checkpoint; raise TOTAL_EPOCHS to at least "
            f"{-(-wanted // per_epoch)} (trainer.total_epochs)",
        )
        return
    report.ok(
        "data",
        f"train: {rows} rows -> {per_epoch} steps/epoch; this run: "
        f"{wanted or per_epoch * epochs} steps (checkpoint every {cfg.trainer.save_freq}, "
        f"validation every {cfg.trainer.test_freq})",
    )


def check_data(cfg: Any, tokenizer: Any, report: Report) -> str:
    """The RL data (verl's RLHFDataset columns); returns the first train prompt's text."""
    first: list[str] = []
    cut = None if cfg.data.truncation == "error" else f"cut ({cfg.data.truncation})"
    fate = "dropped" if cfg.data.filter_overlong_prompts else cut

    def read(split: str, path: Path, table: Any) -> int | None:
        problem = schema_problem(table)
        if problem:
            report.error("data", f"{split} file {path}: {problem}")
            return None
        prompts = table.column("prompt").to_pylist()
        if split == "train" and not first:
            first.append(str(prompts[0][-1].get("content")))
        if tokenizer is not None:
            lengths = token_lengths(tokenizer, prompts, generation_prompt=True)
            what = ("prompt", "max_prompt_length", "MAX_PROMPT_LENGTH")
            check_lengths(cfg, lengths, path, what, fate, report)
        return table.num_rows

    rows = check_files(cfg, read, "data_prep.gsm8k", report)
    if rows["train"]:
        check_schedule(cfg, rows["train"], 1, report)
    if rows["val"]:
        report.ok("data", f"val: {rows['val']} rows")
    return first[0] if first else ""


def schema_problem(table: Any) -> str | None:
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


def check_reward(cfg: Any, report: Report, prompt: str = "") -> set[str] | None:
    """The reward, loaded by verl, must score a right answer above a wrong one in the format the
    prompts ask for. Returns its result's keys when it is a dict (what DAPO's filter may read)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    reward = cfg.reward.custom_reward_function
    if not reward.path:
        report.warn("reward", "no reward.custom_reward_function.path: verl's built-in scorer runs")
        return None
    if not Path(reward.path).is_file():
        report.error("reward", f"reward file {reward.path} does not exist")
        return None
    try:
        fn = get_custom_reward_fn(cfg)
    except Exception as exc:
        report.error(
            "reward",
            f"verl cannot load '{reward.name}' from {reward.path}: "
            f"{one_line(exc)}{available_functions(reward.path)}",
        )
        return None
    style = "\\boxed{}" if "\\boxed" in prompt else "####"
    scores, keys = {}, None
    for label, response in zip(("right", "wrong"), ANSWERS[style], strict=True):
        try:
            result = fn(
                data_source="openai/gsm8k",
                solution_str=response,
                ground_truth="72",
                extra_info={"split": "preflight"},
            )
        except Exception as exc:
            report.error("reward", f"{reward.name} raised on a {label} answer: {one_line(exc)}")
            return None
        score = result.get("score") if isinstance(result, dict) else result
        if not is_number(score):
            got = (
                repr(result)
                if not isinstance(result, dict)
                else f"a dict with score {score!r}"
                if "score" in result
                else f"a dict without 'score' (keys: {', '.join(map(str, result))})"
            )
            report.error(
                "reward",
                f"{reward.name} returned {got[:80]} for a {label} answer: "
                "a reward must return a number, or a dict with a numeric 'score'",
            )
            return None
        scores[label] = score
        keys = set(map(str, result)) if isinstance(result, dict) else None
    if not scores["right"] > scores["wrong"]:
        hint = (
            "; the training prompts ask for \\boxed{} answers: use a reward that reads them "
            "(REWARD_FN=compute_score_flexible) or prepare data with --prompt-style hash"
            if style != "####"
            else ""
        )
        report.error(
            "reward",
            f"{reward.name} scores a right {style} answer "
            f"{scores['right']} and a wrong one {scores['wrong']}: it does not "
            f"separate them{hint}",
        )
        return None
    report.ok(
        "reward",
        f"{Path(reward.path).name}:{reward.name} loads through verl; right "
        f"{style} answer -> {scores['right']}, wrong -> {scores['wrong']}",
    )
    return keys


def is_number(value: object) -> bool:
    """A finite real number, as verl adds rewards up (a bool or a numeric string is not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def available_functions(path: str) -> str:
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return ""
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name[0] != "_"]
    return f" (functions in that file: {', '.join(names)})" if names else ""

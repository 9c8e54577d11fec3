"""What a run reads: the train/val files and the reward function."""

import ast
import math
import numbers
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_gsm8k.preflight.lines import Report, one_line
from verl_gsm8k.preflight.multi_turn import check_budget, check_loops, tools_of

# A right and a wrong answer in each format a GSM8K prompt can ask for (ground truth 72).
ANSWERS = {
    "####": ("48 / 2 = 24 in May, 48 + 24 = 72.\n#### 72", "48 and 24.\n#### 70"),
    "\\boxed{}": ("48 / 2 = 24 in May, 48 + 24 = 72: \\boxed{72}", "48 and 24: \\boxed{70}"),
}


def check_files(cfg: Any, read: Callable[[str, Path, Any], int | None], prep: str,
                report: Report) -> dict[str, int]:  # fmt: skip
    """Rows of each split, each file read as verl reads it, handed to ``read``."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    totals, reader = {}, {".parquet": pq.read_table, ".json": pj.read_json, ".jsonl": pj.read_json}
    for split in ("train", "val"):
        names, rows = cfg.data[f"{split}_files"] or [], 0
        for name in [names] if isinstance(names, str) else names:
            path = Path(os.path.expanduser(str(name)))
            try:
                table = reader[path.suffix](path) if path.is_file() else None
            except Exception as exc:  # KeyError: a type verl does not read
                report.error("data", f"{split} file {path} cannot be read: {one_line(exc)}")
                continue
            if table is None:
                report.error("data", f"{split} file {path} does not exist (python -m {prep})")
                continue
            rows += read(split, path, table) or 0
        cap = cfg.data.get(f"{split}_max_samples", -1)
        totals[split] = min(rows, cap) if cap and cap > 0 else rows
    return totals


def check_lengths(cfg: Any, tokenizer: Any, chats: list, path: Path, key: str, fate: str | None,
                  report: Report, tools: list | None = None) -> None:  # fmt: skip
    """Chats longer than data.<key> tokens, each with its tools block (``tools``: one per chat);
    ``fate``: what becomes of them."""
    noun = "prompt" if key == "max_prompt_length" else "example"
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=noun == "prompt",
                                           tokenize=False, tools=t)
             for c, t in zip(chats, tools or [None] * len(chats), strict=True)]  # fmt: skip
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    limit, longest = cfg.data[key], max(lengths)
    over = sum(n > limit for n in lengths)
    said = f"{path.name}: {over} of {len(lengths)} {noun}s exceed {key} {limit}"
    if over and fate is None:  # a tool prompt is cut from the left by verl's agent loop
        tooled = noun == "prompt" and any(tools or ())  # verl's agent loop, not its SFT
        stop = "lose the tools block first" if tooled else "data.truncation=error stops training"
        report.error("data", f"{said} (longest {longest}) and {stop}; raise {key.upper()}")
    elif over:
        report.warn("data", f"{said} and are {fate} (longest {longest} tokens)")
    else:
        report.ok("data", f"{path.name}: longest {noun} {longest} tokens <= {limit}")


def check_schedule(cfg: Any, rows: int, n_gpus: int, report: Report, strict: bool = False) -> None:
    """Steps as verl's loader makes them; ``strict``: steps past the last epoch fail."""
    batch = cfg.data.train_batch_size
    per_epoch = rows // n_gpus // max(batch // n_gpus, 1)
    epochs, wanted = cfg.trainer.total_epochs, cfg.trainer.total_training_steps
    if per_epoch == 0:
        report.error("data", f"train: {rows} rows < train_batch_size {batch}: not one full batch")
    elif strict and wanted and wanted > per_epoch * epochs:
        report.error("data", f"train: total_training_steps={wanted} but {epochs} epoch(s) of "
                     f"{per_epoch} steps end verl's SFT loop at step {per_epoch * epochs}, "
                     "without a final checkpoint; raise TOTAL_EPOCHS to at least "
                     f"{-(-wanted // per_epoch)}")  # fmt: skip
    else:
        report.ok("data", f"train: {rows} rows -> {per_epoch} steps/epoch; this run: "
                  f"{wanted or per_epoch * epochs} steps (save every {cfg.trainer.save_freq}, "
                  f"validate every {cfg.trainer.test_freq})")  # fmt: skip


def check_data(cfg: Any, tokenizer: Any, report: Report) -> str:
    """verl's RLHFDataset columns; the first train prompt's text."""
    first, data = [], cfg.data
    fate = None if data.truncation == "error" else f"cut ({data.truncation})"
    fate = "dropped" if data.filter_overlong_prompts else fate
    tools = tools_of(cfg, report)
    if tools:  # verl's agent loop cuts a long prompt from the left: the tools block goes first
        fate = None
        check_budget(cfg, tools, report)

    def read(split: str, path: Path, table: Any) -> int | None:
        have = table.column_names
        missing = [c for c in ("prompt", "data_source", "reward_model") if c not in have]
        row = table.slice(0, 1).to_pylist()[0] if table.num_rows and not missing else {}
        prompt, truth = row.get("prompt"), row.get("reward_model")
        problem = next((why for bad, why in (
            (missing, f"missing column(s) {', '.join(missing)} (have {', '.join(have)})"),
            (not row, "no rows"),
            (not (isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)),
             "column prompt must be a list of chat messages [{role, content}]"),
            (not isinstance(truth, dict) or "ground_truth" not in truth,
             "column reward_model must be a struct with a ground_truth field"),
        ) if bad), "")  # fmt: skip
        if problem:
            report.error("data", f"{split} file {path}: {problem}")
            return None
        prompts = table.column("prompt").to_pylist()
        first.append(str(prompts[0][-1].get("content")) if split == "train" else "")
        if tools is not None:
            check_loops(cfg, table, path, split, report)
        if tokenizer is not None:
            check_lengths(cfg, tokenizer, prompts, path, "max_prompt_length", fate, report,
                          tools and [tools] * len(prompts))  # fmt: skip
        return table.num_rows

    rows = check_files(cfg, read, "data_prep.gsm8k", report)
    if rows["train"]:
        check_schedule(cfg, rows["train"], 1, report)
    if rows["val"]:
        report.ok("data", f"val: {rows['val']} rows")
    return next((text for text in first if text), "")


def check_reward(cfg: Any, report: Report, prompt: str = "") -> set[str] | None:
    """The reward scores a right answer above a wrong one; its dict's keys."""
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
        report.error("reward", f"verl cannot load '{reward.name}' from {reward.path}: "
                     f"{one_line(exc)}{functions_in(reward.path)}")  # fmt: skip
        return None
    style = "\\boxed{}" if "\\boxed" in prompt else "####"
    scores, keys = [], None
    for label, response in zip(("right", "wrong"), ANSWERS[style], strict=True):
        try:
            result = fn(data_source="openai/gsm8k", solution_str=response, ground_truth="72",
                        extra_info={"split": "preflight"})  # fmt: skip
        except Exception as exc:
            report.error("reward", f"{reward.name} raised on a {label} answer: {one_line(exc)}")
            return None
        keys = set(map(str, result)) if isinstance(result, dict) else None
        score = result.get("score") if keys else result
        real = isinstance(score, numbers.Real) and not isinstance(score, bool)
        if not (real and math.isfinite(score)):
            got = repr(result) if keys is None else f"a dict with score {score!r}"
            if keys is not None and "score" not in keys:
                got = f"a dict without 'score' (keys: {', '.join(sorted(keys))})"
            report.error("reward", f"{reward.name} returned {got[:80]} for a {label} "
                         "answer: a reward must return a number, or a dict with a numeric "
                         "'score'")  # fmt: skip
            return None
        scores.append(score)
    if not scores[0] > scores[1]:
        hint = ("; the prompts ask for \\boxed{} answers: REWARD_FN=compute_score_flexible reads "
                "them" if style != "####" else "")  # fmt: skip
        report.error("reward", f"{reward.name} scores a right {style} answer {scores[0]} and a "
                     f"wrong one {scores[1]}: it does not separate them{hint}")  # fmt: skip
        return None
    report.ok("reward", f"{Path(reward.path).name}:{reward.name} loads through verl; right "
              f"{style} answer -> {scores[0]}, wrong -> {scores[1]}")  # fmt: skip
    return keys


def functions_in(path: str) -> str:
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return ""
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name[0] != "_"]
    return f" (functions in that file: {', '.join(names)})" if names else ""

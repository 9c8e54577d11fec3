"""``rollouts.html``: every response verl dumped (``RUN_DIR/rollouts/<step>.jsonl``, all of a
step's, not only the traced ones) and every validation answer (``RUN_DIR/validation/<step>.jsonl``),
with filters (reward earned or not, no ``####`` line, hedged, cut at max length), sorting (score,
length) and search; the same validation question side by side at the first and the last
validation.

Written beside ``report.html`` with its data in ``rollouts/`` (one file per step, loaded when
chosen). Flags: ``####`` by the text; hedged by ``rewards/gsm8k.py``'s parser (the marker line
offers several numbers); cut at max length from the trace's response lengths (verl's dump keeps
the text without its end-of-sequence token, so without a trace this flag is unknown).
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from rewards.gsm8k import compute_score
from verl_gsm8k.common import json_read
from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.run_dir import ROLLOUTS_DIR, VALIDATION_DIR
from verl_gsm8k.replay.assets import data_js, page, script, write_data
from verl_gsm8k.replay.load import Trace

PAGE_NAME = "rollouts.html"
DATA_DIRNAME = "rollouts"


def _rows(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    rows, issue = [], None
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        try:
            row = json_read.parse(line, str(path))
        except json_read.JsonError:
            issue = (
                f"{path.parent.name}/{path.name}: line {number} is not JSON; rows after it skipped"
            )
            break
        if isinstance(row, dict):
            rows.append(row)
    return rows, issue


def _steps(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.stem) for p in folder.glob("*.jsonl") if p.stem.isdigit())


def _question(prompt: str) -> str:
    """The user's turn of a decoded chat prompt (verl's dump keeps role names as plain lines)."""
    if "\nuser\n" in prompt:
        prompt = prompt.split("\nuser\n", 1)[1]
    return prompt.rsplit("\nassistant\n", 1)[0].strip()


def flags(output: str, gt: Any) -> dict[str, int]:
    graded = compute_score("openai/gsm8k", output, "" if gt is None else str(gt))
    return {"marker": int("####" in output), "hedged": int(graded["hedged"] > 0)}


def _number(value: Any) -> float | None:
    """A dumped number for a data file: verl writes a NaN score as JSON's ``NaN`` (json.dumps,
    ``_write_generations``), which a data file cannot hold; None for it and for a non-number."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _payload(rows: list[dict[str, Any]], lengths: dict[str, int], limit: int | None) -> dict:
    prompts: list[str] = []
    where: dict[str, int] = {}
    out = []
    for row in rows:
        question = _question(str(row.get("input", "")))
        if question not in where:
            where[question] = len(prompts)
            prompts.append(question)
        output, gt = str(row.get("output", "")), row.get("gts")
        n = lengths.get(str(row.get("uid")))
        score = row.get("score")
        item = {"p": where[question], "o": output, "gt": gt, "s": _number(score),
                "n": n, "clip": None if n is None or limit is None else int(n >= limit),
                **flags(output, gt)}  # fmt: skip
        if isinstance(score, float) and math.isnan(score):
            item["nan"] = 1  # shown as "score NaN", not "n/a"
        if "acc" in row:
            item["acc"] = _number(row["acc"])
        out.append(item)
    return {"prompts": prompts, "rows": out}


def write_rollouts(
    run_dir: Path, trace: Trace, out_dir: Path, run_name: str
) -> tuple[Path | None, list[str]]:
    """Write the browser and its data; (page or None when the run dumped nothing, issues)."""
    issues: list[str] = []
    train, val = _steps(run_dir / ROLLOUTS_DIR), _steps(run_dir / VALIDATION_DIR)
    if not train and not val:
        return None, [f"no rollout or validation dumps in {run_dir} (trainer.rollout_data_dir): "
                      "no rollout browser"]  # fmt: skip
    data_dir = out_dir / DATA_DIRNAME
    limit = trace.run.get("max_response_length")
    for kind, steps in (("train", train), ("val", val)):
        folder = run_dir / (ROLLOUTS_DIR if kind == "train" else VALIDATION_DIR)
        for step in steps:
            rows, issue = _rows(folder / f"{step}.jsonl")
            if issue:
                issues.append(issue)
            traced = trace.steps.get(step) if kind == "train" else None
            lengths = (traced.head.get("batch") or {}).get("response_lengths", {}) if traced else {}
            payload = _payload(rows, lengths, limit)
            write_data(
                data_dir, f"{kind}-{step}.js", data_js("ROLLOUTS", f"{kind}-{step}", payload)
            )
    index = {"name": run_name, "train": train, "val": val, "limit": limit,
             "lengths": any(bool((t.head.get("batch") or {}).get("response_lengths"))
                            for t in trace.steps.values())}  # fmt: skip
    write_data(data_dir, "index.js", data_js("ROLLOUTS_INDEX", "run", index))
    path = out_dir / PAGE_NAME
    body = _BODY.format(name=html.escape(run_name))
    write_atomic(path, page(f"Rollouts: {run_name}", body, script("rollouts.js"),
                            [f"{DATA_DIRNAME}/index.js"]))  # fmt: skip
    return path, issues


_BODY = """
<h1>Rollouts and validation answers: {name}</h1>
<div class=meta>Every response verl dumped, from <code>rollouts/&lt;step&gt;.jsonl</code> (training,
sampled) and <code>validation/&lt;step&gt;.jsonl</code> (greedy). <a href="report.html">Back to the
report</a> &middot; <a href="replay.html">replay one iteration</a>.</div>
<nav><label>show <select id=kind><option value=train>training rollouts</option>
<option value=val>validation answers</option><option value=compare>validation: first vs last
</option></select></label><label>step <select id=step></select></label>
<label>filter <select id=filter><option value=all>all</option><option value=right>earned reward
</option><option value=wrong>no reward</option><option value=nomarker>no #### line</option>
<option value=hedged>hedged</option><option value=clipped>cut at max length</option></select>
</label><label>sort <select id=sort><option value=none>as dumped</option><option value=score>
by score</option><option value=length>by length</option></select></label>
<label>search <input id=search size=18></label><span id=status class=why></span></nav>
<div id=list></div>
"""

"""replay.html (the trace, token by token) and rollouts.html (every dumped response), loading one
step's data file at a time."""

import math
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from rewards.gsm8k import compute_score
from verl_gsm8k.analysis.evals import finite_number
from verl_gsm8k.common import json_read
from verl_gsm8k.common import run_dir as rd
from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.questions.table import question_of
from verl_gsm8k.replay.load import Trace, TraceStep
from verl_gsm8k.svgplot.page import data_js, page

HERE = Path(__file__).parent
EXPLAIN = {
    "actor/pg_loss": "the clipped surrogate loss the actor's update minimised",
    "actor/pg_clipfrac": "share of tokens whose ratio new/old left [1 - clip_low, 1 + clip_high] "
    "and so stopped pulling",
    "actor/ppo_kl": "approximate KL between the policy before and after this update, on the "
    "sampled tokens: how far one step moved it",
    "actor/grad_norm": "the actor's gradient norm before clipping",
    "actor/lr": "the actor's learning rate at this step",
    "actor/entropy": "mean entropy of the actor's next-token distribution on the sampled tokens",
    "actor/reward_kl_penalty": "mean KL to the reference the reward was charged (KL in the "
    "reward), before the coefficient",
    "actor/reward_kl_penalty_coeff": "the coefficient that KL was charged at",
    "actor/kl_loss": "KL to the reference as a loss term (GRPO), at the current policy",
    "critic/vf_loss": "the critic's regression loss toward the returns",
    "critic/vf_clipfrac": "share of values whose change was clipped (critic.cliprange_value)",
    "critic/vf_explained_var": "share of the returns' variance the values explain: 1 a perfect "
    "critic, 0 no better than a constant",
    "critic/grad_norm": "the critic's gradient norm before clipping",
    "critic/lr": "the critic's learning rate at this step",
    "training/rollout_probs_diff_max": "largest gap between vLLM's and the actor's probability "
    "of a sampled token: a stale weight sync shows here",
}


@dataclass
class Pages:
    replay: Path | None = None
    rollouts: Path | None = None
    issues: list[str] = field(default_factory=list)


def _write_page(out: Path, stem: str, run_name: str) -> Path:
    """<stem>.html from <stem>.html and <stem>.js here, its data in <stem>/index.js."""
    body = (HERE / f"{stem}.html").read_text().replace("{name}", escape(run_name))
    code = (HERE / "common.js").read_text() + (HERE / f"{stem}.js").read_text()
    write_atomic(out / f"{stem}.html", page(f"{stem.capitalize()}: {run_name}", [body],
                                            scripts=[f"{stem}/index.js"], code=code))  # fmt: skip
    return out / f"{stem}.html"


def charged_kl_coef(head: dict[str, Any]) -> Any:
    logged = (head.get("metrics") or {}).get("actor/reward_kl_penalty_coeff")
    return logged if logged is not None else ((head.get("run") or {}).get("kl") or {}).get("coef")


def default_choice(trace: Trace) -> tuple[int, int]:
    """(step, sample) to open: the latest step with a reward spread, the most advantage."""
    for step in sorted(trace.steps, reverse=True):
        samples = trace.steps[step].samples
        scores = [s.get("score") or 0.0 for s in samples]
        if not samples or max(scores) <= 0 or (len(set(scores)) == 1 and len(samples) > 1):
            continue
        weights = []
        for score, sample in zip(scores, samples, strict=True):
            adv = (sample.get("per_token") or {}).get("advantage") or []
            adv = [abs(a) for a in adv if a is not None]
            weights.append((score, sum(adv) / len(adv) if adv else 0.0))
        return step, weights.index(max(weights))
    return max(trace.steps), 0


def _step(ts: TraceStep) -> dict[str, Any]:
    head = ts.head
    samples = [{
        "key": s.get("key"), "uid": s.get("uid"), "session": s.get("session"),
        "score": s.get("score"), "gt": s.get("ground_truth"), "source": s.get("data_source"),
        "extra": s.get("reward_extra") or {},
        "prompt": "".join((s.get("prompt") or {}).get("tokens") or []),
        "tokens": (s.get("response") or {}).get("tokens") or [],
        "ids": (s.get("response") or {}).get("ids") or [], "pt": s.get("per_token") or {},
        "mask": (s.get("response") or {}).get("mask") or [],
        "absent": s.get("absent") or {},
    } for s in ts.samples]  # fmt: skip
    batch = {k: v for k, v in (head.get("batch") or {}).items() if k != "response_lengths"}
    return {"step": ts.step, "run": head.get("run") or {}, "kl_coef": charged_kl_coef(head),
            "traced": head.get("traced"), "of": head.get("of"), "batch": batch,
            "metrics": head.get("metrics") or {}, "samples": samples}  # fmt: skip


def write_replay(trace: Trace, out: Path, name: str) -> Path:
    steps = []
    for step, ts in sorted(trace.steps.items()):
        write_atomic(out / f"replay/step-{step}.js", data_js("REPLAY", step, _step(ts)))
        scores = [s.get("score") for s in ts.samples]
        known = scores and None not in scores
        steps.append({"step": step, "n": len(scores),
                      "mean": sum(scores) / len(scores) if known else None})  # fmt: skip
    step, sample = default_choice(trace)
    index = {"run": trace.run, "name": name, "steps": steps, "explain": EXPLAIN,
             "default": {"step": step, "sample": sample}}  # fmt: skip
    write_atomic(out / "replay/index.js", data_js("REPLAY_INDEX", "run", index))
    return _write_page(out, "replay", name)


def _rows(path: Path, lengths: dict[str, int], limit: int | None) -> tuple[dict, str | None]:
    prompts: dict[str, int] = {}
    rows, issue = [], None
    for number, row in rd.jsonl(path):
        if isinstance(row, json_read.JsonError):
            issue = f"{path.parent.name}/{path.name}: line {number} is not JSON; rows after it "
            issue += "skipped"
            break
        if not isinstance(row, dict):
            continue
        output, gt, n = str(row.get("output", "")), row.get("gts"), lengths.get(str(row.get("uid")))
        graded = compute_score("openai/gsm8k", output, "" if gt is None else str(gt))
        score = row.get("score")
        item = {"p": prompts.setdefault(question_of(str(row.get("input", ""))), len(prompts)),
                "o": output, "gt": gt, "s": finite_number(score), "n": n,
                "clip": None if n is None or limit is None else int(n >= limit),
                "marker": int("####" in output), "hedged": int(graded["hedged"] > 0)}  # fmt: skip
        item.update({"nan": 1} if isinstance(score, float) and math.isnan(score) else {})
        item.update({"acc": finite_number(row["acc"])} if "acc" in row else {})
        rows.append(item)
    return {"prompts": list(prompts), "rows": rows}, issue


def write_rollouts(run: Path, trace: Trace, out: Path, name: str) -> tuple[Path | None, list[str]]:
    dumps = {"train": rd.dump_files(run, rd.ROLLOUTS_DIR),
             "val": rd.dump_files(run, rd.VALIDATION_DIR)}  # fmt: skip
    if not any(dumps.values()):
        return None, [f"no rollout or validation dumps in {run} (trainer.rollout_data_dir): "
                      "no rollout browser"]  # fmt: skip
    limit, issues = trace.run.get("max_response_length"), []
    for kind, files in dumps.items():
        for step, path in files.items():
            traced = trace.steps.get(step) if kind == "train" else None
            lengths = (traced.head.get("batch") or {}).get("response_lengths") if traced else {}
            try:
                payload, issue = _rows(path, lengths or {}, limit)
            except OSError as err:
                payload, issue = {"prompts": [], "rows": []}, f"{path}: unreadable ({err})"
            issues += [issue] if issue else []
            text = data_js("ROLLOUTS", f"{kind}-{step}", payload)
            write_atomic(out / f"rollouts/{kind}-{step}.js", text)
    lengths = any((t.head.get("batch") or {}).get("response_lengths") for t in trace.steps.values())
    index = {"name": name, "train": list(dumps["train"]), "val": list(dumps["val"]),
             "limit": limit, "lengths": lengths}  # fmt: skip
    write_atomic(out / "rollouts/index.js", data_js("ROLLOUTS_INDEX", "run", index))
    return _write_page(out, "rollouts", name), issues


def write_pages(run: Path, trace: Trace, out: Path) -> Pages:
    pages = Pages(issues=list(trace.issues))
    if trace.steps:
        pages.replay = write_replay(trace, out, run.name)
    pages.rollouts, issues = write_rollouts(run, trace, out, run.name)
    pages.issues += issues
    return pages

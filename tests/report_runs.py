"""The report tests' synthetic verl 0.9.1 runs, a planted NaN, measured critics."""

import json
import math
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from browser import parse_svgs as parse_svgs

from verl_gsm8k.analysis import finding as rf
from verl_gsm8k.runpage import summary as rs

# the real verl console logs (the verl_logs_dir fixture)
LOG_512 = "qwen2.5-0.5b-ppo-gsm8k-resp512.log"
LOG_256 = "qwen2.5-0.5b-ppo-gsm8k-resp256.log"

# The critic's value loss and grad norm from step 1 of CPU runs (critic lr 1e-1: exploding).
_LEARNING_VF_LOSS = [0.206, 0.129, 0.119, 0.115, 0.097, 0.067, 0.039, 0.038, 0.021, 0.040]
_LEARNING_VF_LOSS += [0.017, 0.041, 0.048, 0.034, 0.018, 0.029, 0.011, 0.013, 0.027, 0.012]
_LEARNING_GRAD_NORM = [2.95, 0.88, 1.11, 1.51, 0.69, 0.90, 0.33, 0.47, 0.44, 0.57]
_LEARNING_GRAD_NORM += [0.41, 0.45, 0.27, 0.42, 0.60, 0.23, 0.14, 0.30, 0.29, 0.30]
EXPLODING_CRITICS = {
    "first": ([0.27, 15.7, 20.5, 42.9], [7.6, 30.0, 60.0, 100.0]),
    "second": ([1.145, 63.14, 28.67, 16.03], [15.84, 123.3, 75.43, 26.79]),
    "third": ([0.5618, 15.65, 16.93, 3.149], [10.58, 59.98, 37.92, 17.15]),
    "fourth": ([3.917, 44.16, 10.58], [23.46, 67.90, 45.61]),  # step 1 already diverging
    "fifth": ([0.8390, 81.76, 42.82, 6.577], [16.25, 121.7, 52.35, 18.83]),
}
HEALTHY_CRITICS = {
    "smoke, actor lr 1e-2": ([0.0449, 0.0277, 0.0188, 0.0124], [4.57, 3.11, 1.91, 0.51]),
    "smoke, default lrs": ([0.0320, 0.0207, 0.0151, 0.0097], [3.61, 2.62, 1.67, 0.52]),
    "learning run": (_LEARNING_VF_LOSS, _LEARNING_GRAD_NORM),
}


STEPS = 200
PHASES = {"gen": 20.0, "reward": 0.8, "old_log_prob": 4.0, "ref": 4.5, "values": 5.0, "adv": 0.1,
          "update_critic": 15.0, "update_actor": 18.0, "update_weights": 1.2}  # fmt: skip
STEP_OVERHEAD = 0.5  # seconds of each step that no phase covers ("other")
VAL_KEY = "val-core/openai/gsm8k/acc/mean@1"
STAMP = "20250101T000000Z"
SEGMENT = f"metrics/metrics-{STAMP}.jsonl"


def healthy_record(step: int, rng: random.Random) -> dict[str, float]:

    def noisy(value: float, rel: float = 0.05) -> float:
        return value * (1 + rng.uniform(-rel, rel))

    score = 0.15 + 0.55 * (1 - math.exp(-step / 40))
    kl = 0.2 * (1 - math.exp(-step / 60))
    length = noisy(260.0, 0.04)
    phases = {name: noisy(sec, 0.03) for name, sec in PHASES.items()}
    step_time = sum(phases.values()) + STEP_OVERHEAD
    tokens = 256 * (105 + length)
    record: dict[str, float] = {
        "critic/score/mean": score + rng.uniform(-0.02, 0.02), "critic/rewards/mean": score - 0.01,
        "actor/reward_kl_penalty": kl + rng.uniform(0, 0.01),
        "actor/reward_kl_penalty_coeff": 0.001,
        "actor/entropy": noisy(0.08 + 0.4 * math.exp(-step / 50)),
        "actor/pg_loss": rng.uniform(-0.02, 0.02), "actor/pg_clipfrac": noisy(0.004, 0.3),
        "actor/ppo_kl": rng.uniform(-1e-4, 1e-4), "actor/grad_norm": noisy(3.0, 0.2),
        "actor/lr": 1e-6, "critic/vf_loss": noisy(0.05 + 0.15 * math.exp(-step / 120), 0.1),
        "critic/vf_clipfrac": noisy(0.01, 0.3), "critic/grad_norm": noisy(20.0, 0.3),
        "critic/values/mean": score, "response_length/mean": length, "response_length/max": 512.0,
        "response_length/clip_ratio": noisy(0.01, 0.3), "prompt_length/mean": 105.0,
        "timing_s/step": step_time,
        "timing_s/agent_loop/generate_sequences/mean": phases["gen"] * 0.9,  # nested, not a phase
        "timing_per_token_ms/gen": 0.3, "perf/total_num_tokens": tokens,
        "perf/time_per_step": step_time, "perf/throughput": tokens / step_time,
        "training/global_step": float(step),
        **{f"timing_s/{name}": sec for name, sec in phases.items()},
        "actor/perf/max_memory_allocated_gb": 30.0 + 0.01 * step,
        "actor/perf/max_memory_reserved_gb": 34.0 + 0.01 * step,
        "actor/perf/cpu_memory_used_gb": noisy(80.0, 0.01),
        "critic/perf/max_memory_allocated_gb": 12.0, "critic/perf/max_memory_reserved_gb": 14.0,
        "critic/perf/cpu_memory_used_gb": noisy(80.0, 0.01),
        "training/rollout_probs_diff_valid": 1.0,
        "training/rollout_probs_diff_max": noisy(0.25, 0.2),
        "training/rollout_probs_diff_mean": noisy(0.003, 0.2),
        "training/rollout_probs_diff_std": noisy(0.01, 0.2),
        "training/rollout_actor_probs_pearson_corr": 0.998 + rng.uniform(-0.001, 0.001),
    }  # fmt: skip
    if step % 10 == 0:
        record[VAL_KEY] = 0.30 + 0.25 * (1 - math.exp(-step / 50)) + rng.uniform(-0.01, 0.01)
        record["timing_s/testing"] = noisy(40.0, 0.03)
        for key, value in (("format", 0.97), ("pred_found", 0.99), ("clipped", 0.02)):
            record[f"val-aux/openai/gsm8k/{key}/mean@1"] = value
    return record


Mutator = Callable[[int, dict[str, Any]], None]


def build_run(mutate: Mutator | None = None, seed: int = 7) -> list[dict[str, Any]]:
    """verl 0.9.1 file-logger records: validation at step 0, then steps 1..STEPS."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = [{"step": 0, "data": {VAL_KEY: 0.30}}]
    for step in range(1, STEPS + 1):
        data: dict[str, Any] = healthy_record(step, rng)
        if mutate is not None:
            mutate(step, data)
        records.append({"step": step, "data": data})
    return records


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_evals(run: Path, rows: list[dict[str, Any]]) -> Path:
    """A checkpoint sweep's comparison.json in ``run`` holding ``rows``."""
    return write_jsonl(run / "checkpoint_eval" / "comparison.json", [{"results": rows}])


def write_run(run: Path, records: list[dict[str, Any]] | None = None) -> Path:
    """A run directory whose metrics segment holds ``records`` (``build_run()`` unless given)."""
    write_jsonl(run / SEGMENT, build_run() if records is None else records)
    return run


# what verl logs as NaN once a reward turns NaN (a real smoke run with one planted)
SICK_KEY = re.compile(
    r"^critic/(score|rewards|advantages|returns)/|loss$|grad_norm$|vf_explained_var$"
    r"|^val-(core|aux)/.+/(acc|score|reward|acc_success_only)/"
)
SICK_PER_TOKEN = ("score", "reward", "advantage", "return")


def _rewrite_jsonl(path: Path, change: Callable[[dict[str, Any]], None], **dump: Any):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        change(row)
    path.write_text("".join(json.dumps(row, **dump) + "\n" for row in rows))


def plant_nan(run: Path, first: int):
    """The reward NaN from step ``first``: null in metrics and trace, ``NaN`` in verl's dumps."""

    def metrics(record: dict[str, Any]):
        if record["step"] >= first:
            record["data"] = {k: None if SICK_KEY.search(k) else v
                              for k, v in record["data"].items()}  # fmt: skip

    def dumped(row: dict[str, Any]):
        for key in ("score", "reward", "acc"):
            if key in row:
                row[key] = math.nan

    def traced(line: dict[str, Any]):
        if line.get("kind") == "step":
            line["metrics"] = {k: None if SICK_KEY.search(k) else v
                               for k, v in (line.get("metrics") or {}).items()}  # fmt: skip
            groups = (line.get("batch") or {}).get("groups") or {}
            groups.update({k: None for k in ("score_min", "score_max") if k in groups})
        elif line.get("kind") == "sample":
            line["score"] = None
            extra = line.get("reward_extra") or {}
            extra.update({k: None for k in ("acc", "score") if k in extra})
            per_token = line.get("per_token") or {}
            for key in SICK_PER_TOKEN:
                if key in per_token:
                    per_token[key] = [None] * len(per_token[key])

    for segment in (run / "metrics").glob("*.jsonl"):
        _rewrite_jsonl(segment, metrics, separators=(",", ":"))
    for folder, change, dump in (("rollouts", dumped, {"ensure_ascii": False}),
                                 ("validation", dumped, {"ensure_ascii": False}),
                                 ("trace", traced, {"allow_nan": False})):  # fmt: skip
        for path in (run / folder).glob("*.jsonl"):
            if int(path.stem) >= first:
                _rewrite_jsonl(path, change, **dump)


def checks_fired(findings: list[rf.Finding], severities: tuple[str, ...] = ("error", "warning")):
    return {f.check for f in findings if f.severity in severities}


def only(findings: list[rf.Finding], check: str) -> rf.Finding:
    hits = [f for f in findings if f.check == check]
    assert len(hits) == 1, [str(f) for f in findings]
    return hits[0]


def analyse_records(tmp_path: Path, records: list[dict[str, Any]]):
    return rs.analyse(write_run(tmp_path / "run", records))

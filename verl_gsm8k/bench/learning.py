"""Does the learning recipe learn for every seed? Runs `bash recipes/learn_tiny.sh` per seed and
algorithm, one run at a time, and prints greedy validation accuracy before (step 0: the warm
start) and after (the last step), the sampled train score of the first and last five steps, and
the wall time of each launch (the warm start's SFT run included when that seed has none cached).
Beside verl's accuracy (the reward's: the number on the "#### N" line) it prints the share of
validation answers whose number is right in any format, from verl's validation dumps, before and
after: how much of a rise is the format the reward asks for, how much is sums, and whether the
run lost sums the warm start knew (flagged **LOST SUMS**: ``knowledge_lost``, a binomial
tolerance on the 100 questions, the same property tests/test_learn_cpu.py asserts).

    python -m verl_gsm8k.bench.learning                           # seeds 0 1 2, ppo and grpo
    python -m verl_gsm8k.bench.learning --seeds 0 --algos grpo -- ACTOR_LR=1e-4
    python -m verl_gsm8k.bench.learning --algos remax rloo --group-size recipe

A benchmark, not a test: it prints figures (and writes them as JSON with --json). Every run goes
to a fresh run root (--out; the cache of tiny model, toy data and warm starts is the normal
CACHE_DIR unless --fresh-cache). Run it alone: another job on the machine slows every phase.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rewards.gsm8k import compute_score_flexible
from verl_gsm8k.bench.cpu_train import read_metrics
from verl_gsm8k.common.children import dies_with_this_process
from verl_gsm8k.common.run_dir import VALIDATION_DIR
from verl_gsm8k.launch.knobs import BY_NAME, LEARN_ALGOS, recipe_settings

ROOT = Path(__file__).resolve().parents[2]
VAL = "val-core/openai/gsm8k/acc/mean@1"
SCORE = "critic/score/mean"


def validation_dump(run_dir: Path, step: int) -> list[dict] | None:
    """verl's dump of the validation answers at ``step`` (``input``, ``output``, ``gts``, ...),
    or None where that step has none."""
    path = run_dir / VALIDATION_DIR / f"{step}.jsonl"
    if not path.is_file():
        return None
    return [json.loads(line) for line in path.read_text().splitlines()]


def any_format_right(run_dir: Path, step: int) -> tuple[int, int] | None:
    """(right, questions): validation answers whose number is right in any format (the reward's
    flexible scorer: marker, boxed, "answer is", else the last number), from verl's dump."""
    rows = validation_dump(run_dir, step)
    if rows is None:
        return None
    right = [compute_score_flexible("openai/gsm8k", r["output"], r["gts"])["acc"] for r in rows]
    return (int(sum(right)), len(right)) if right else None


def any_format_accuracy(run_dir: Path, step: int) -> float | None:
    counted = any_format_right(run_dir, step)
    return counted[0] / counted[1] if counted else None


# The knowledge-kept property: did RL lose sums the warm start had? The trained model's count of
# validation answers right in any format is compared with a binomial of the warm start's rate on
# the same number of questions; it fails when that count is below the binomial's one-sided
# KNOWLEDGE_ALPHA quantile. A warm start right on every question is taken at 1 - 1/n (100 of
# 100 does not prove a rate of exactly 1). With n = 100: a warm start at 1.00 keeps its
# knowledge at >= 0.97, one at 0.95 at >= 0.91, one at 0.80 at >= 0.73 (a fresh clone's PPO run
# fell 0.80 -> 0.72, which counts as lost: docs/learning.md, "Why sums were lost, and what fixed
# it").
KNOWLEDGE_ALPHA = 0.05


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(0, k + 1))


def knowledge_floor(before_right: int, n: int, alpha: float = KNOWLEDGE_ALPHA) -> int:
    """The fewest right answers (of n) a trained model may give and still count as having kept
    the warm start's ``before_right`` of n."""
    p = min(before_right / n, 1 - 1 / n)
    floor = 0
    while floor <= n and binomial_cdf(floor, n, p) < alpha:
        floor += 1
    return floor


def knowledge_lost(before_right: int, after_right: int, n: int) -> bool:
    return after_right < knowledge_floor(before_right, n)


def group_size(algo: str, choice: str) -> int:
    """The responses per prompt a run of ``algo`` gets: learn_tiny's (the same for every
    algorithm) or the algorithm's own recipe's (recipes/<algo>_qwen2.5-0.5b_gsm8k.sh; the knob's
    default where the recipe sets none)."""
    recipe = "learn_tiny" if choice == "learn_tiny" else f"{algo}_qwen2.5-0.5b_gsm8k"
    value = recipe_settings(ROOT / "recipes" / f"{recipe}.sh").get("ROLLOUT_N")
    return int(value or BY_NAME["ROLLOUT_N"].default)


def add_group_size_flag(parser: argparse.ArgumentParser) -> None:
    """``--group-size``, shared by the benchmarks that train learn_tiny per algorithm."""
    parser.add_argument(
        "--group-size",
        choices=("learn_tiny", "recipe"),
        default="learn_tiny",
        help="responses per prompt (ROLLOUT_N): learn_tiny's, the same for every algorithm (the "
        "default), or each algorithm's own recipe's (1 for PPO, REINFORCE++ and ReMax, 4 for "
        "RLOO, 5 for GRPO, 16 for DAPO and GSPO); a ROLLOUT_N=... knob after -- wins over both",
    )


def run_once(
    seed: int, algo: str, out: Path, knobs: list[str], cache: Path | None, name: str = ""
) -> dict:
    env = dict(os.environ, ALGO=algo, SEED=str(seed), RUNS_ROOT=str(out))
    env["EXPERIMENT_NAME"] = name or f"learn_{algo}_seed{seed}"
    run_dir = out / env["EXPERIMENT_NAME"]
    if cache is not None:
        env["CACHE_DIR"] = str(cache)
    env.update(knob.split("=", 1) for knob in knobs)
    rollout_n = int(env.get("ROLLOUT_N") or group_size(algo, "learn_tiny"))
    log = out / f"{env['EXPERIMENT_NAME']}.log"
    start = time.monotonic()
    with log.open("w") as sink:
        status = subprocess.run(
            ["bash", str(ROOT / "recipes" / "learn_tiny.sh")],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            check=False,
            # SIGKILLed, the benchmark takes its launch with it: SIGTERM, the launcher's stop
            preexec_fn=dies_with_this_process(signal.SIGTERM),  # noqa: PLW1509  # one prctl call
        ).returncode
    wall = time.monotonic() - start
    steps = read_metrics(run_dir)
    val = sorted((s, m[VAL]) for s, m in steps.items() if VAL in m)
    score = [m[SCORE] for _, m in sorted(steps.items()) if SCORE in m]
    return {
        "seed": seed,
        "algo": algo,
        "rollout_n": rollout_n,
        "run_dir": str(run_dir),
        "status": status,
        "log": str(log),
        "wall_s": round(wall, 1),
        "warm_start_built": "warm start (once)" in log.read_text(),
        "val_before": val[0][1] if val else None,
        "val_after": val[-1][1] if val else None,
        "val_best": max(v for _, v in val) if val else None,
        "val_by_step": val,
        "any_format_before": any_format_accuracy(run_dir, val[0][0]) if val else None,
        "any_format_after": any_format_accuracy(run_dir, val[-1][0]) if val else None,
        "knowledge_lost": lost(run_dir, val[0][0], val[-1][0]) if val else None,
        "score_first5": statistics.fmean(score[:5]) if score else None,
        "score_last5": statistics.fmean(score[-5:]) if score else None,
    }


def lost(run_dir: Path, first: int, last: int) -> bool | None:
    before, after = any_format_right(run_dir, first), any_format_right(run_dir, last)
    if before is None or after is None or before[1] != after[1]:
        return None
    return knowledge_lost(before[0], after[0], before[1])


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: list[dict]) -> str:
    lines = [
        "| algo | n | seed | val before | val after (best) | rise | sum right in any format, "
        "before -> after | train score, first 5 -> last 5 | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rise = (
            f"{r['val_after'] - r['val_before']:+.2f}"
            if r["val_after"] is not None and r["val_before"] is not None
            else "-"
        )
        wall = f"{r['wall_s'] / 60:.1f} min" + (
            " (with warm start)" if r["warm_start_built"] else ""
        )
        if r["status"] != 0:
            wall += f", exit {r['status']}"
        lines.append(
            f"| {r['algo']} | {r.get('rollout_n', '-')} | {r['seed']} | {fmt(r['val_before'])} "
            f"| {fmt(r['val_after'])} "
            f"({fmt(r['val_best'])}) | {rise} | {fmt(r['any_format_before'])} -> "
            f"{fmt(r['any_format_after'])}{' **LOST SUMS**' if r.get('knowledge_lost') else ''}"
            f" | {fmt(r['score_first5'])} -> "
            f"{fmt(r['score_last5'])} | {wall} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.bench.learning", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="SEED values")
    parser.add_argument(
        "--algos",
        nargs="+",
        choices=LEARN_ALGOS,
        default=["ppo", "grpo"],
        help=f"ALGO values (default ppo grpo; any of {', '.join(LEARN_ALGOS)})",
    )
    parser.add_argument(
        "--out", type=Path, help="run root for the runs and their logs (default: a new temp dir)"
    )
    parser.add_argument(
        "--fresh-cache",
        action="store_true",
        help="build tiny model, toy data and warm starts in a new cache under --out (first-use "
        "wall time) instead of the normal CACHE_DIR",
    )
    add_group_size_flag(parser)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "knobs", nargs="*", metavar="KNOB=VALUE", help="after --: knobs for every run"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bad = [k for k in args.knobs if "=" not in k]
    if bad:
        print(f"bench.learning: not KNOB=VALUE: {' '.join(bad)}", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-learning-"))
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache" if args.fresh_cache else None
    rows = []
    for seed in args.seeds:
        for algo in args.algos:
            print(f"bench.learning: seed {seed}, {algo} ...", flush=True)
            size = [f"ROLLOUT_N={group_size(algo, args.group_size)}"]
            name = f"learn_{algo}_n{size[0].split('=')[1]}_seed{seed}"
            rows.append(run_once(seed, algo, out, size + args.knobs, cache, name))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["status"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

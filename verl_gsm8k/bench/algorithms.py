"""Which algorithm learns the toy task best? Trains every algorithm of docs/algorithms.md with
`recipes/learn_tiny.sh` on the harder setting of its toy task (``TOY_TASK=hard``: 100 sums, a
warm start that knows part of them) over the same seeds, one run at a time, and writes per
algorithm: greedy validation accuracy at steps 0 (the warm start), 5, 10 and 20, the area under
the validation curve (its mean over the steps, trapezoids between test steps), wall time and the
tokens generated, and the share of answers whose equation starts with the question's own two
numbers at the first and last test (the work behind the "####" line, which the reward does not
score); over several seeds, each algorithm's last accuracy per seed with its rank on that seed,
beside the spread over seeds and over algorithms (a ranking that one seed's noise can reverse is
no ranking); then, per seed, the comparison page and the per-question page of
``python -m verl_gsm8k.report`` over every algorithm's run.

    python -m verl_gsm8k.bench.algorithms --out bench-algos                 # 9 algorithms x 3 seeds
    python -m verl_gsm8k.bench.algorithms --seeds 0 --algos ppo grpo dapo --out bench-algos
    python -m verl_gsm8k.bench.algorithms --group-size recipe --out bench-algos-own-n

Every algorithm runs at learn_tiny's group size (``ROLLOUT_N=8``: equal responses per step), or
with ``--group-size recipe`` at its own recipe's; a run is named and keyed by its algorithm, its
group size and its seed, so the two kinds of row can share a table.

A run already complete in --out (its last validation step logged) is read, not trained again: an
interrupted benchmark resumes with the same command. ``--with`` adds the rows of an earlier
benchmark's algorithms.json (another day's seeds: docs/algorithms.md keeps each seed's file), not
trained again either, so seeds measured in separate sessions make one table.

A benchmark, not a test: it prints figures, writes them as Markdown (OUT/algorithms.md) and JSON
(OUT/algorithms.json), and is run alone (every other job on the machine slows every phase; the
wall times are then not the algorithms').

Tokens generated: the responses of the training batch (``perf/total_num_tokens`` split by the
mean prompt and response lengths: exact counts of the batch), plus what verl generated and did
not train on, at the step's mean response length (an estimate): DAPO's groups dropped by dynamic
sampling (``.../filter_groups/evicted_samples`` and ``discarded_surplus_samples``, each a group of
``rollout.n`` responses) and ReMax's greedy baseline, one response per prompt
(``data.train_batch_size``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

from verl_gsm8k.analysis.sampling import dropped_groups
from verl_gsm8k.bench.cpu_train import read_metrics
from verl_gsm8k.bench.learning import (
    VAL,
    add_group_size_flag,
    group_size,
    run_once,
    validation_dump,
)
from verl_gsm8k.common.launch_record import lookup, read_records
from verl_gsm8k.launch.knobs import LEARN_ALGOS

PROG = "bench.algorithms"
# The harder setting of the toy task (docs/algorithms.md, "A task that separates them").
HARD_SETTING = ("TOY_TASK=hard",)
AT_STEPS = (0, 5, 10, 20)


def accuracy_at(curve: list[tuple[int, float]], step: int) -> float | None:
    """The validation accuracy logged at ``step``, or None."""
    return next((acc for s, acc in curve if s == step), None)


def area_under(curve: list[tuple[int, float]]) -> float | None:
    """The mean validation accuracy over the run's steps: trapezoids between test steps, divided
    by the steps from the first test to the last (1.0: right from step 0 on; the warm start's
    accuracy: no learning)."""
    points = sorted(curve)
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return None
    area = sum(
        (a1 + a2) / 2 * (s2 - s1) for (s1, a1), (s2, a2) in zip(points, points[1:], strict=False)
    )
    return area / (points[-1][0] - points[0][0])


def step_tokens(metrics: dict[str, float], group: int, greedy_prompts: int = 0) -> float:
    """Tokens generated in one training step (see the module's docstring): ``group`` responses
    per prompt (``rollout.n``), ``greedy_prompts`` greedy baseline responses (ReMax)."""
    total = metrics.get("perf/total_num_tokens")
    prompt = metrics.get("prompt_length/mean")
    response = metrics.get("response_length/mean")
    if total is None or prompt is None or response is None or prompt + response <= 0:
        return 0.0
    trained = total * response / (prompt + response)  # responses x mean response length
    return trained + (dropped_groups(metrics) * group + greedy_prompts) * response


def tokens_generated(run_dir: Path, algo: str) -> int | None:
    """Tokens the run generated over its training steps, or None without metrics or a launch
    record (rollout.n and the batch size come from the last one)."""
    steps = read_metrics(run_dir)
    records = read_records(run_dir)
    if not steps or not records:
        return None
    config = records[-1]["config"]
    group = int(lookup(config, "actor_rollout_ref.rollout.n") or 1)
    greedy = int(lookup(config, "data.train_batch_size") or 0) if algo == "remax" else 0
    return round(sum(step_tokens(m, group, greedy) for m in steps.values()))


# The toy task's question ends its numbers before "How many" and its worked answer starts with
# them ("A + B = C"): data_prep/arithmetic.py's wordings and worked_answer.
EQUATION = re.compile(r"\s*(\d+)\s*\+\s*(\d+)")


def numbers_copied(run_dir: Path, step: int) -> float | None:
    """The share of validation answers whose equation starts with the question's two numbers, from
    verl's dump of ``step``: the work the reward does not score (it reads the "#### N" line only),
    so RL is free to let it drift while the answer line stays; or None without a dump."""
    rows = validation_dump(run_dir, step)
    if rows is None:
        return None
    copied = 0
    for row in rows:
        asked = re.findall(r"\d+", row["input"].split("How many")[0])[-2:]
        written = EQUATION.match(row["output"])
        copied += bool(written) and list(written.groups()) == asked
    return copied / len(rows) if rows else None


def warm_start_pick(run_dir: Path) -> dict | None:
    """How the run's warm start was picked (``python -m verl_gsm8k.warm_start``'s record beside
    the model the run started from: the SFT step, its scores, the band), or None where the model
    was not picked by a band or the run has no launch record."""
    records = read_records(run_dir)
    model = lookup(records[-1]["config"], "actor_rollout_ref.model.path") if records else None
    path = Path(f"{model}.pick.json") if model else None
    if path is None or not path.is_file():
        return None
    record = json.loads(path.read_text())
    scores = record["scores"][str(record["picked_step"])]
    return {
        "step": record["picked_step"],
        "band": record["band"],
        "in_band": record["in_band"],
        "marker": scores["marker"],
        "any_format": scores["any_format"],
    }


def warm_starts(rows: list[dict]) -> str:
    """Markdown: one line per seed, the SFT save its runs started from."""
    lines = []
    for seed in dict.fromkeys(r["seed"] for r in rows):
        pick = next((r["warm_start"] for r in rows if r["seed"] == seed and r["warm_start"]), None)
        if pick is None:
            continue
        low, high = pick["band"]
        where = "in the band" if pick["in_band"] else "NONE IN THE BAND, the closest to"
        lines.append(
            f"- seed {seed}: the warm start is SFT step {pick['step']}, accuracy "
            f"{pick['marker']:.2f} (right in any format {pick['any_format']:.2f}), {where} "
            f"{low:.2f}-{high:.2f}"
        )
    return "\n".join(lines)


def summarize(run: dict) -> dict:
    """One run's figures for the table, from bench.learning's run record."""
    curve = [(int(s), float(v)) for s, v in run["val_by_step"]]
    run_dir = Path(run["run_dir"])
    return {
        "algo": run["algo"],
        "rollout_n": run["rollout_n"],
        "seed": run["seed"],
        "status": run["status"],
        "run_dir": str(run_dir),
        "wall_s": run["wall_s"],
        "warm_start_built": run["warm_start_built"],
        "acc": {str(step): accuracy_at(curve, step) for step in AT_STEPS},
        "auc": area_under(curve),
        "tokens": tokens_generated(run_dir, run["algo"]),
        "any_format_before": run["any_format_before"],
        "any_format_after": run["any_format_after"],
        "knowledge_lost": run["knowledge_lost"],
        "copied_before": numbers_copied(run_dir, min(curve)[0]) if curve else None,
        "copied_after": numbers_copied(run_dir, max(curve)[0]) if curve else None,
        "warm_start": warm_start_pick(run_dir),
    }


def arm(row: dict) -> tuple[str, int]:
    """What a row compares: its algorithm at its group size (a table line, a rank)."""
    return row["algo"], row["rollout_n"]


def run_name(algo: str, n: int, seed: int) -> str:
    return f"{algo}_n{n}_seed{seed}"


def complete(run_dir: Path, last_step: int) -> bool:
    """Whether a run in --out already logged its last validation step (then it is not rerun)."""
    steps = read_metrics(run_dir)
    return VAL in steps.get(last_step, {})


def _spread(values: list[float | None], digits: int = 2) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    mean = f"{statistics.fmean(known):.{digits}f}"
    if len(known) == 1:
        return mean
    return f"{mean} ({min(known):.{digits}f}-{max(known):.{digits}f})"


def table(rows: list[dict]) -> str:
    """Markdown: one line per algorithm, the mean over seeds and (min-max)."""
    lines = [
        "| algorithm | n | seeds | "
        + " | ".join("warm start" if s == 0 else f"step {s}" for s in AT_STEPS)
        + " | area under the curve | sums right in any format, first -> last (lost: of the "
        "warm start's) | question's numbers copied into the equation, first -> last | wall per "
        "run (min) | tokens generated (thousands) |",
        "|---|---|---|" + "---|" * (len(AT_STEPS) + 5),
    ]
    for algo, n in dict.fromkeys(arm(r) for r in rows):
        runs = [r for r in rows if arm(r) == (algo, n)]
        failed = [r for r in runs if r["status"] != 0]
        seeds = ", ".join(str(r["seed"]) for r in runs)
        if failed:
            seeds += " (" + ", ".join(f"seed {r['seed']}: exit {r['status']}" for r in failed) + ")"
        cells = [_spread([r["acc"][str(s)] for r in runs]) for s in AT_STEPS]
        walls = [r["wall_s"] / 60 for r in runs if not r["warm_start_built"]]
        tokens = [r["tokens"] / 1000 if r["tokens"] is not None else None for r in runs]
        kept = f"{_spread([r['any_format_before'] for r in runs])} -> " + _spread(
            [r["any_format_after"] for r in runs]
        )
        lost = [str(r["seed"]) for r in runs if r["knowledge_lost"]]
        if lost:
            kept += f" (**lost**: seed {', '.join(lost)})"
        lines.append(
            f"| {algo} | {n} | {seeds} | "
            + " | ".join(cells)
            + f" | {_spread([r['auc'] for r in runs])} | {kept} | "
            f"{_spread([r['copied_before'] for r in runs])} -> "
            f"{_spread([r['copied_after'] for r in runs])} | {_spread(walls, 1)} | "
            f"{_spread(tokens, 1)} |"
        )
    return "\n".join(lines)


def by_seed(rows: list[dict]) -> str:
    """Markdown: the last step's accuracy of each algorithm on each seed, its rank among that
    seed's algorithms (1: the best; ties share the better rank), and the two spreads a ranking
    is read against: each algorithm's range over the seeds, each seed's range over the
    algorithms. Empty with fewer than two seeds."""
    last = str(AT_STEPS[-1])
    final = {(arm(r), r["seed"]): r["acc"][last] for r in rows if r["status"] == 0}
    final = {key: acc for key, acc in final.items() if acc is not None}
    seeds = list(dict.fromkeys(seed for _, seed in final))
    if len(seeds) < 2:
        return ""

    rank = {
        (key, seed): 1 + sum(acc > mine for (_, s), acc in final.items() if s == seed)
        for (key, seed), mine in final.items()
    }

    def spread(values: list[float]) -> str:
        return f"{max(values) - min(values):.2f}" if len(values) > 1 else "-"

    lines = [
        f"| algorithm | n | {' | '.join(f'step {last}, seed {s} (rank)' for s in seeds)} | "
        "mean rank | range over the seeds |",
        "|---|---|" + "---|" * (len(seeds) + 2),
    ]
    for key in dict.fromkeys(key for key, _ in final):
        mine = [s for s in seeds if (key, s) in final]
        cells = [f"{final[(key, s)]:.2f} ({rank[(key, s)]})" if s in mine else "-" for s in seeds]
        mean_rank = statistics.fmean(rank[(key, s)] for s in mine)
        spread_seeds = spread([final[(key, s)] for s in mine])
        lines.append(
            f"| {key[0]} | {key[1]} | {' | '.join(cells)} | {mean_rank:.1f} | {spread_seeds} |"
        )
    ranges = [spread([acc for (_, s), acc in final.items() if s == seed]) for seed in seeds]
    lines.append(f"| range over the algorithms | | {' | '.join(ranges)} | | |")
    return "\n".join(lines)


def pages(rows: list[dict], out: Path) -> list[Path]:
    """Per seed: the comparison page (and its questions page) over every algorithm's run."""
    written = []
    for seed in dict.fromkeys(r["seed"] for r in rows):
        runs = [
            r["run_dir"]
            for r in rows
            if r["seed"] == seed and r["status"] == 0 and Path(r["run_dir"]).is_dir()
        ]  # a row of --with whose runs are gone (another machine, another day): no page
        if len(runs) < 2:
            continue
        page = out / f"comparison-seed{seed}"
        command = [sys.executable, "-m", "verl_gsm8k.report", *runs, "--out", str(page), "--quiet"]
        if subprocess.run(command, check=False).returncode == 0:
            written.append(page / "comparison.html")
        else:
            print(f"{PROG}: the comparison page of seed {seed} failed: {' '.join(command)}")
    return written


ROW_KEYS = (
    "algo", "rollout_n", "seed", "status", "run_dir", "wall_s", "warm_start_built", "acc", "auc"
)  # fmt: skip


def read_earlier(paths: list[Path]) -> list[dict]:
    """The rows of earlier algorithms.json files (summarize()'s, as main() writes them); a file
    that is not one, or an (algorithm, group size, seed) in two of them: ValueError naming the
    file."""
    rows: list[dict] = []
    seen: dict[tuple[str, int, int], Path] = {}
    for path in paths:
        try:
            loaded = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"--with {path}: {error}") from None
        if not isinstance(loaded, list):
            raise ValueError(f"--with {path}: not this benchmark's algorithms.json (no list)")
        for number, row in enumerate(loaded, 1):
            missing = [k for k in ROW_KEYS if not isinstance(row, dict) or k not in row]
            if missing:
                raise ValueError(f"--with {path}: row {number} has no {', '.join(missing)}")
            key = (*arm(row), row["seed"])
            if key in seen:
                raise ValueError(f"--with {path}: {run_name(*key)} is also in {seen[key]}")
            seen[key] = path
            rows.append(row)
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m verl_gsm8k.{PROG}", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="SEED values")
    parser.add_argument(
        "--algos",
        nargs="+",
        choices=LEARN_ALGOS,
        default=list(LEARN_ALGOS),
        help="ALGO values (default: all of them)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="run root: the runs, their logs, algorithms.md/.json and the comparison pages; "
        "a run already complete here is read, not trained again",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=AT_STEPS[-1],
        help=f"TOTAL_TRAINING_STEPS of every run (default {AT_STEPS[-1]})",
    )
    parser.add_argument(
        "--with",
        dest="earlier",
        type=Path,
        nargs="+",
        default=[],
        metavar="JSON",
        help="algorithms.json files of earlier runs of this benchmark: their rows join the table "
        "and their (algorithm, group size, seed) runs are not trained again",
    )
    add_group_size_flag(parser)
    parser.add_argument(
        "knobs",
        nargs="*",
        metavar="KNOB=VALUE",
        help=f"after --: knobs for every run, after the setting's own ({' '.join(HARD_SETTING)})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bad = [k for k in args.knobs if "=" not in k]
    if bad:
        print(f"{PROG}: not KNOB=VALUE: {' '.join(bad)}", file=sys.stderr)
        return 2
    try:
        earlier = read_earlier(args.earlier)
    except ValueError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    knobs = [*HARD_SETTING, f"TOTAL_TRAINING_STEPS={args.steps}", *args.knobs]
    rows = list(earlier)
    done = {(*arm(r), r["seed"]) for r in earlier}
    given = dict(knob.split("=", 1) for knob in args.knobs).get("ROLLOUT_N")  # wins, as in runs
    for seed in args.seeds:
        for algo in args.algos:
            n = int(given or group_size(algo, args.group_size))
            name = run_name(algo, n, seed)
            if (algo, n, seed) in done:
                print(f"{PROG}: {name}: in --with, not trained again", flush=True)
                continue
            record = args.out / f"{name}.json"
            if record.is_file() and complete(args.out / name, args.steps):
                print(f"{PROG}: {name}: complete in {args.out}, read", flush=True)
                run = json.loads(record.read_text())
            else:
                print(f"{PROG}: {name} ...", flush=True)
                run = run_once(seed, algo, args.out, [f"ROLLOUT_N={n}", *knobs], None, name=name)
                record.write_text(json.dumps(run, indent=2) + "\n")
            rows.append(summarize(run))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    for part in (warm_starts(rows), by_seed(rows)):
        if part:
            text += "\n\n" + part
    print(text)
    (args.out / "algorithms.md").write_text(text + "\n")
    (args.out / "algorithms.json").write_text(json.dumps(rows, indent=2) + "\n")
    for page in pages(rows, args.out):
        print(f"{PROG}: {page}")
    return 0 if all(r["status"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

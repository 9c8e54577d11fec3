"""The algorithm comparison's figures (python -m verl_gsm8k.bench.algorithms): the area under the
validation curve, the accuracy at a step, the tokens generated (DAPO's dropped groups and ReMax's
greedy baseline counted), the table, and which runs are read instead of trained again. The
benchmark's training runs are not made here (docs/algorithms.md has its command and figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl_gsm8k.bench.algorithms import (
    accuracy_at,
    area_under,
    by_seed,
    complete,
    main,
    numbers_copied,
    read_earlier,
    step_tokens,
    summarize,
    table,
    tokens_generated,
    warm_start_pick,
    warm_starts,
)
from verl_gsm8k.bench.learning import VAL

# One training step as verl's file logger writes it (keys and values of a real CPU step).
STEP = {
    "perf/total_num_tokens": 5745,
    "prompt_length/mean": 238.1875,
    "response_length/mean": 120.875,
}


def write_run(
    run_dir: Path, steps: dict[int, dict[str, float]], batch: int = 16, group: int = 8
) -> Path:
    (run_dir / "metrics").mkdir(parents=True)
    lines = [json.dumps({"step": s, "data": m}) for s, m in sorted(steps.items())]
    (run_dir / "metrics" / "metrics-20260101T000000Z.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "launches").mkdir()
    (run_dir / "launches" / "launch-20260101T000000Z.yaml").write_text(
        f"stamp: '20260101T000000Z'\nconfig:\n  data:\n    train_batch_size: {batch}\n"
        f"  actor_rollout_ref:\n    rollout:\n      n: {group}\n"
    )
    return run_dir


def test_area_under_the_curve_is_the_mean_accuracy_over_the_steps():
    assert area_under([(0, 0.4), (20, 0.4)]) == pytest.approx(0.4)  # no learning: the warm start
    # 0 -> 5: 0.2 to 0.6 (mean 0.4 over 5 steps), then 0.6 to step 20: (0.4*5 + 0.6*15) / 20
    assert area_under([(0, 0.2), (5, 0.6), (20, 0.6)]) == pytest.approx(0.55)
    assert area_under([(5, 0.6), (0, 0.2), (20, 0.6)]) == pytest.approx(0.55)  # any order
    assert area_under([(0, 0.5)]) is None


def test_accuracy_at_a_step_or_none():
    curve = [(0, 0.3), (5, 0.5)]
    assert accuracy_at(curve, 5) == 0.5
    assert accuracy_at(curve, 10) is None


def test_tokens_of_a_step_count_the_batch_and_what_was_dropped():
    trained = 16 * 120.875  # 16 responses (5745 / (238.1875 + 120.875)) at the mean length
    assert step_tokens(STEP, 8) == pytest.approx(trained)
    # DAPO: verl's metric names (a real CPU DAPO step logged these two), counting groups
    dapo = dict(STEP, **{"training/filter_groups/evicted_samples": 12.0,
                         "training/filter_groups/discarded_surplus_samples": 2.0})  # fmt: skip
    assert step_tokens(dapo, 8) == pytest.approx(trained + 14 * 8 * 120.875)
    assert step_tokens(STEP, 8, greedy_prompts=4) == pytest.approx(trained + 4 * 120.875)  # ReMax
    assert step_tokens({}, 8) == 0.0


def test_tokens_of_a_run_read_the_group_and_remax_prompts_from_the_launch_record(tmp_path):
    dapo = dict(STEP, **{"training/filter_groups/evicted_samples": 1.0})
    run = write_run(tmp_path / "run", {1: STEP, 2: dapo}, batch=4, group=2)
    assert tokens_generated(run, "grpo") == round((2 * 16 + 2) * 120.875)
    assert tokens_generated(run, "remax") == round((2 * 20 + 2) * 120.875)
    assert tokens_generated(tmp_path / "none", "grpo") is None


def test_a_complete_run_is_read_not_trained_again(tmp_path):
    run = write_run(tmp_path / "run", {0: {VAL: 0.3}, 5: {VAL: 0.5}})
    assert complete(run, 5)
    assert not complete(run, 20)  # stopped before its last validation


def test_the_table_gives_mean_and_spread_over_seeds(tmp_path):
    rows = []
    for seed, (before, after) in enumerate([(0.3, 0.6), (0.4, 0.8)]):
        run = write_run(tmp_path / f"grpo_seed{seed}", {1: STEP, 20: {VAL: after}})
        rows.append(
            summarize(
                {
                    "algo": "grpo",
                    "rollout_n": 8,
                    "seed": seed,
                    "status": 0,
                    "run_dir": str(run),
                    "wall_s": 300.0,
                    "warm_start_built": False,
                    "val_by_step": [[0, before], [20, after]],
                    "any_format_before": 0.6,
                    "any_format_after": after,
                    "knowledge_lost": seed == 0,
                }
            )  # fmt: skip
        )
    line = table(rows).splitlines()[-1]
    assert line.startswith("| grpo | 8 | 0, 1 | 0.35 (0.30-0.40) | - | - | 0.70 (0.60-0.80) |"), (
        line
    )
    assert "| 0.53 (0.45-0.60) | 0.60 (0.60-0.60) -> 0.70 (0.60-0.80) (**lost**: seed 0) |" in line
    assert line.endswith("| - -> - | 5.0 (5.0-5.0) | 1.9 (1.9-1.9) |"), line  # no dumps here
    rows[1]["status"] = 1
    assert "(seed 1: exit 1)" in table(rows)


def test_numbers_copied_read_the_equation_not_the_answer(tmp_path):
    """Real toy-task wordings; the answers of a hard-task GRPO run's step 20 (seed 0): right on
    the "####" line under an equation of other numbers."""
    made = "Betty made {} dollars in April and {} dollars in May. How many dollars did Betty make?"
    rows = [
        (made.format(4, 2), "4 + 2 = 6\n#### 6", "6"),  # copied, right
        (made.format(3, 3), "4 + 4 = 6\n#### 7", "6"),  # drifted, wrong
        (made.format(6, 3), "7 + 4 = 11\n#### 9", "9"),  # drifted, right: not the work
        (made.format(9, 7), "9 + 7 = 16", "16"),  # copied, no marker
    ]
    (tmp_path / "validation").mkdir()
    dump = [json.dumps({"input": q, "output": o, "gts": g}) for q, o, g in rows]
    (tmp_path / "validation" / "20.jsonl").write_text("\n".join(dump) + "\n")
    assert numbers_copied(tmp_path, 20) == 0.5
    assert numbers_copied(tmp_path, 5) is None


def test_bad_knob_is_one_line(capsys, tmp_path):
    assert main(["--out", str(tmp_path), "--", "ACTOR_LR"]) == 2
    assert capsys.readouterr().err.strip() == "bench.algorithms: not KNOB=VALUE: ACTOR_LR"


def test_help_names_every_flag():
    out = subprocess.run(
        [sys.executable, "-m", "verl_gsm8k.bench.algorithms", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for flag in ("--seeds", "--algos", "--out", "--steps", "--with", "TOY_TASK=hard"):
        assert flag in out


def test_each_seeds_warm_start_is_read_from_the_pick_beside_the_model(tmp_path):
    """The model a run started from (its launch record's actor_rollout_ref.model.path) with
    python -m verl_gsm8k.warm_start's record beside it: the SFT step and its scores, one line per
    seed; a model set by hand (no record) gives none."""
    model = tmp_path / "cache" / "warm-start-300-acc0.30-0.45"
    Path(f"{model}.pick.json").parent.mkdir(parents=True)
    Path(f"{model}.pick.json").write_text(json.dumps({
        "band": [0.3, 0.45], "picked_step": 140, "in_band": True,
        "scores": {"130": {"marker": 0.26, "any_format": 0.34, "questions": 400},
                   "140": {"marker": 0.44, "any_format": 0.605, "questions": 400}},
    }))  # fmt: skip
    runs = {}
    for name, path in (("picked", model), ("by_hand", tmp_path / "mine")):
        run = tmp_path / name / "launches"
        run.mkdir(parents=True)
        (run / "launch-20260101T000000Z.yaml").write_text(
            f"stamp: '20260101T000000Z'\nconfig:\n  actor_rollout_ref:\n    model:\n"
            f"      path: {path}\n"
        )
        runs[name] = warm_start_pick(run.parent)
    assert runs["by_hand"] is None
    assert runs["picked"] == {"step": 140, "band": [0.3, 0.45], "in_band": True,
                              "marker": 0.44, "any_format": 0.605}  # fmt: skip
    rows = [{"seed": 0, "warm_start": runs["picked"]}, {"seed": 1, "warm_start": None}]
    assert warm_starts(rows) == (
        "- seed 0: the warm start is SFT step 140, accuracy 0.44 (right in any format 0.60), "
        "in the band 0.30-0.45"
    )


def _row(algo: str, seed: int, run_dir: Path, acc20: float, n: int = 8) -> dict:
    return {"algo": algo, "rollout_n": n, "seed": seed, "status": 0, "run_dir": str(run_dir),
            "wall_s": 300.0, "warm_start_built": False,
            "acc": {"0": 0.4, "5": None, "10": None, "20": acc20},
            "auc": None, "tokens": None, "any_format_before": 0.6, "any_format_after": acc20,
            "knowledge_lost": False, "copied_before": None, "copied_after": None,
            "warm_start": None}  # fmt: skip


def test_rows_of_an_earlier_run_join_the_table_and_are_not_trained_again(tmp_path, capsys):
    """--with: another session's algorithms.json (its runs gone from this machine) joins this
    one's rows: one table over both seeds, nothing trained for a pair it holds."""
    earlier = tmp_path / "seed0.json"
    earlier.write_text(json.dumps([_row("grpo", 0, tmp_path / "gone", 0.6)]))
    out = tmp_path / "out"
    run = write_run(out / "grpo_n8_seed1", {0: {VAL: 0.4}, 20: {VAL: 0.8}})
    (out / "grpo_n8_seed1.json").write_text(json.dumps({
        "algo": "grpo", "rollout_n": 8, "seed": 1, "status": 0, "run_dir": str(run),
        "wall_s": 300.0, "warm_start_built": False, "val_by_step": [[0, 0.4], [20, 0.8]],
        "any_format_before": 0.6, "any_format_after": 0.8, "knowledge_lost": False,
    }))  # fmt: skip
    code = main(["--seeds", "0", "1", "--algos", "grpo", "--with", str(earlier), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "grpo_n8_seed0: in --with, not trained again" in printed
    assert "grpo_n8_seed1: complete in" in printed  # read from --out, not trained
    line = (out / "algorithms.md").read_text().splitlines()[2]
    assert line.startswith("| grpo | 8 | 0, 1 | 0.40 (0.40-0.40) | - | - | 0.70 (0.60-0.80) |"), (
        line
    )
    assert [r["seed"] for r in json.loads((out / "algorithms.json").read_text())] == [0, 1]


def test_an_earlier_file_that_is_not_the_benchmarks_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"algo": "grpo", "seed": 0}]))
    assert main(["--with", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bench.algorithms: --with {bad}: row 1 has no rollout_n, status")
    assert not (tmp_path / "out").exists()  # nothing written for a refused command
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps([_row("grpo", 0, tmp_path, 0.5)]))
    with pytest.raises(ValueError, match=f"grpo_n8_seed0 is also in {twice}"):
        read_earlier([twice, twice])


def test_by_seed_ranks_each_seed_and_shows_both_spreads(tmp_path):
    """The last step per seed, its rank on that seed (ties share the better rank), the range of
    one algorithm over the seeds and of one seed over the algorithms; nothing for one seed."""
    rows = [
        _row(algo, seed, tmp_path, acc)
        for algo, seed, acc in [
            ("ppo", 0, 0.7), ("grpo", 0, 0.5), ("dapo", 0, 0.7),
            ("ppo", 1, 0.6), ("grpo", 1, 0.8), ("dapo", 1, 0.9),
        ]
    ]  # fmt: skip
    lines = by_seed(rows).splitlines()
    assert lines[0].startswith(
        "| algorithm | n | step 20, seed 0 (rank) | step 20, seed 1 (rank) |"
    )
    assert lines[2] == "| ppo | 8 | 0.70 (1) | 0.60 (3) | 2.0 | 0.10 |"
    assert lines[3] == "| grpo | 8 | 0.50 (3) | 0.80 (2) | 2.5 | 0.30 |"
    assert lines[4] == "| dapo | 8 | 0.70 (1) | 0.90 (1) | 1.0 | 0.20 |"
    assert lines[5] == "| range over the algorithms | | 0.20 | 0.30 | | |"
    rows[1]["status"] = 1  # a failed run is not ranked
    assert "| grpo | 8 | - | 0.80 (2) | 2.0 | - |" in by_seed(rows)
    assert by_seed([r for r in rows if r["seed"] == 0]) == ""


def test_each_algorithm_runs_at_learn_tinys_group_size_or_its_own_recipes():
    """bench.learning --group-size: the same ROLLOUT_N for every algorithm (learn_tiny's), or each
    algorithm's own recipe's (docs/algorithms.md, "On the CPU toy task")."""
    from verl_gsm8k.bench.learning import group_size
    from verl_gsm8k.launch.knobs import LEARN_ALGOS

    own = {algo: group_size(algo, "recipe") for algo in ("reinforce_pp", "remax", "rloo", "dapo")}
    assert own == {"reinforce_pp": 1, "remax": 1, "rloo": 4, "dapo": 16}
    assert {group_size(algo, "learn_tiny") for algo in LEARN_ALGOS} == {8}


def test_an_algorithm_at_two_group_sizes_is_two_lines_and_two_runs(tmp_path, capsys):
    """--group-size recipe: each algorithm at its recipe's ROLLOUT_N; a run is keyed by algorithm,
    group size and seed, so GRPO at 8 (learn_tiny's, from --with) and at 5 (its recipe's) are
    two table lines and two ranks, and neither is read for the other."""
    earlier = tmp_path / "n8.json"
    earlier.write_text(json.dumps([_row("grpo", 0, tmp_path / "gone", 0.6)]))
    out = tmp_path / "out"
    run = write_run(out / "grpo_n5_seed0", {0: {VAL: 0.4}, 20: {VAL: 0.7}}, group=5)
    (out / "grpo_n5_seed0.json").write_text(json.dumps({
        "algo": "grpo", "rollout_n": 5, "seed": 0, "status": 0, "run_dir": str(run),
        "wall_s": 200.0, "warm_start_built": False, "val_by_step": [[0, 0.4], [20, 0.7]],
        "any_format_before": 0.6, "any_format_after": 0.7, "knowledge_lost": False,
    }))  # fmt: skip
    argv = ["--seeds", "0", "--algos", "grpo", "--with", str(earlier), "--out", str(out)]
    assert main([*argv, "--group-size", "recipe"]) == 0
    printed = capsys.readouterr().out
    assert "grpo_n5_seed0: complete in" in printed and "not trained again" not in printed
    lines = (out / "algorithms.md").read_text().splitlines()
    assert lines[2].startswith("| grpo | 8 | 0 | 0.40 | - | - | 0.60 |"), lines[2]
    assert lines[3].startswith("| grpo | 5 | 0 | 0.40 | - | - | 0.70 |"), lines[3]

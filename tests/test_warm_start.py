"""python -m verl_gsm8k.warm_start: the band (WARM_START_ACC), the pick (the first save in the
band, else the closest), the command line on real Hugging Face models (transformers' greedy
generation, the reward's scores), and its bad input as one line. The recipe's own use of it (an
SFT run saving every 10 steps, the pick, the merge) is tests/test_learn_cpu.py's same-seed test;
the scorer against verl's own validation is test_learn_cpu.py's too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verl_gsm8k.warm_start.band import distance, parse_band
from verl_gsm8k.warm_start.pick import pick, saves
from verl_gsm8k.warm_start.score import Score, read_questions, score


@pytest.mark.parametrize(
    ("text", "band"), [("0.30-0.45", (0.30, 0.45)), ("0-1", (0.0, 1.0)), (".5-.5", (0.5, 0.5))]
)
def test_a_band_is_low_dash_high(text, band):
    assert parse_band(text) == band


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0.45-0.30", "needs 0 <= LOW <= HIGH <= 1"),
        ("0.3-1.5", "needs 0 <= LOW <= HIGH <= 1"),
        ("0.3", "is not LOW-HIGH"),
        ("last", "is not LOW-HIGH"),
        ("-0.1-0.3", "is not LOW-HIGH"),
    ],
)
def test_a_bad_band_says_why(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_band(text)


def test_distance_is_zero_inside_and_the_gap_outside():
    band = (0.30, 0.45)
    assert distance(0.30, band) == distance(0.45, band) == 0.0
    assert distance(0.20, band) == pytest.approx(0.10)
    assert distance(0.50, band) == pytest.approx(0.05)


def _scores(curve: dict[int, float]):
    """A scorer over made-up accuracies (the pick's logic only), and the saves it was asked."""
    asked: list[int] = []

    def scorer(model: Path) -> Score:
        step = int(model.parent.name.removeprefix("global_step_"))
        asked.append(step)
        return Score(curve[step], min(1.0, 2 * curve[step]), 400)

    return scorer, asked


def test_the_first_save_in_the_band_is_picked_and_no_later_one_is_scored():
    curve = {10: 0.05, 20: 0.20, 30: 0.50, 40: 0.35, 50: 0.40}
    candidates = [(s, Path(f"/run/global_step_{s}")) for s in curve]
    scorer, asked = _scores(curve)
    step, scores = pick(candidates, (0.30, 0.45), scorer, log=lambda line: None)
    assert step == 40  # 30 jumped past the band: not picked
    assert asked == [10, 20, 30, 40] and set(scores) == {10, 20, 30, 40}


def test_with_no_save_in_the_band_the_closest_is_picked_the_earliest_of_equals():
    curve = {10: 0.05, 20: 0.20, 30: 0.50, 40: 0.25, 50: 0.50}
    candidates = [(s, Path(f"/run/global_step_{s}")) for s in curve]
    scorer, asked = _scores(curve)
    lines: list[str] = []
    step, _ = pick(candidates, (0.30, 0.45), scorer, log=lines.append)
    assert step == 30  # 0.05 above the band; 40 is 0.05 below it, but later
    assert asked == [10, 20, 30, 40, 50]
    assert lines[2] == "warm start: step 30: accuracy 0.500, right in any format 1.000"


def test_only_saves_with_a_hugging_face_model_are_candidates(tmp_path):
    for name in ("global_step_20", "global_step_100", "global_step_5"):
        (tmp_path / name / "huggingface").mkdir(parents=True)
        (tmp_path / name / "huggingface" / "config.json").write_text("{}")
    (tmp_path / "global_step_30").mkdir()  # a save without hf_model: no model to score
    (tmp_path / "global_step_x" / "huggingface").mkdir(parents=True)
    assert [step for step, _ in saves(tmp_path)] == [5, 20, 100]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verl_gsm8k.warm_start", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def sft_run(tiny_model_dir: Path, tmp_path_factory) -> Path:
    """An SFT run's layout, two saves of the tiny random model (global_step_10, _20)."""
    run = tmp_path_factory.mktemp("sft-run")
    for step in (10, 20):
        shutil.copytree(tiny_model_dir, run / f"global_step_{step}" / "huggingface")
    return run


def test_the_command_line_scores_real_models_and_prints_the_picked_save(
    sft_run, prepared_gsm8k_dir, tmp_path
):
    """Real greedy generation over a real verl RL parquet: the random tiny model is right on no
    GSM8K question, so a band from 0 picks the first save and one above 0 picks none (the
    closest, the first, said loudly); every score taken is in the record."""
    test_file = prepared_gsm8k_dir / "test.parquet"
    questions = len(read_questions(test_file))
    record = tmp_path / "pick.json"
    result = _cli(str(sft_run), "--test-file", str(test_file), "--band", "0-0.5",
                  "--max-new-tokens", "8", "--record", str(record))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(sft_run / "global_step_10")
    assert f"step 10 of 20, accuracy 0.00 (right in any format 0.00, {questions} test" in (
        result.stderr
    )
    saved = json.loads(record.read_text())
    assert saved["picked_step"] == 10 and saved["in_band"] is True
    assert list(saved["scores"]) == ["10"]  # in the band at once: step 20 never scored

    result = _cli(str(sft_run), "--test-file", str(test_file), "--band", "0.3-0.45",
                  "--max-new-tokens", "8")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(sft_run / "global_step_10")
    assert "NONE IN THE BAND, the closest to 0.3-0.45" in result.stderr.splitlines()[-1]


def test_the_scores_are_the_rewards_on_the_greedy_answers(prepared_gsm8k_dir, monkeypatch):
    """score() counts what rewards/gsm8k.py says of each answer: the ground truth after the
    marker scores on both, one written elsewhere only in any format, a wrong one on neither."""
    from verl_gsm8k.warm_start import score as scoring

    rows = read_questions(prepared_gsm8k_dir / "test.parquet")[:3]
    truths = [row["reward_model"]["ground_truth"] for row in rows]
    answers = [f"so\n#### {truths[0]}", f"The answer is {truths[1]}.", "#### 123456789"]
    monkeypatch.setattr(scoring, "greedy_answers", lambda model, prompts, tokens: answers)
    assert score(Path("unused"), rows, 24) == Score(1 / 3, 2 / 3, 3)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--band", "0.5-0.3"], "warm start: band '0.5-0.3': needs 0 <= LOW <= HIGH <= 1"),
        (["--band", "0-1", "--test-file", "/nope.parquet"], "warm start: "),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, line, sft_run, prepared_gsm8k_dir, tmp_path):
    base = ["--test-file", str(prepared_gsm8k_dir / "test.parquet")]
    record = tmp_path / "pick.json"
    result = _cli(str(sft_run), *base, *args, "--record", str(record))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith(line)
    assert not record.exists()


def test_a_run_without_saves_is_one_line(prepared_gsm8k_dir, tmp_path):
    result = _cli(str(tmp_path), "--test-file", str(prepared_gsm8k_dir / "test.parquet"),
                  "--band", "0-1")  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == f"warm start: {tmp_path}: no global_step_N/huggingface save"

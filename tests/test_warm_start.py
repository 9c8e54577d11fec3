"""python -m verl_gsm8k.warm_start: the band, the pick (the first save in the band, else the
closest), the command line on real models, bad input in one line. The recipe's use of it and the
scorer against verl's validation: tests/test_learn_cpu.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verl_gsm8k.warm_start.band import distance, is_band, parse_band
from verl_gsm8k.warm_start.pick import main, pick, saves
from verl_gsm8k.warm_start.score import Score, read_questions, score


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.30-0.45", (0.30, 0.45)), ("0-1", (0.0, 1.0)), (".5-.5", (0.5, 0.5)),
     ("0.45-0.30", "needs 0 <= LOW <= HIGH <= 1"), ("0.3-1.5", "needs 0 <= LOW <= HIGH <= 1"),
     ("0.3", "is not LOW-HIGH"), ("last", "is not LOW-HIGH"), ("-0.1-0.3", "is not LOW-HIGH")],
)  # fmt: skip
def test_a_band_is_low_dash_high_or_says_why(text, expected):
    if isinstance(expected, tuple):
        assert parse_band(text) == expected and is_band(text)
    else:
        with pytest.raises(ValueError, match=expected):
            parse_band(text)
        assert not is_band(text)
    assert [distance(a, (0.3, 0.45)) for a in (0.3, 0.45, 0.2, 0.5)] == [
        0, 0, pytest.approx(0.1), pytest.approx(0.05)]  # fmt: skip


@pytest.mark.parametrize(
    ("curve", "picked", "asked"),
    [({10: 0.05, 20: 0.20, 30: 0.50, 40: 0.35, 50: 0.40}, 40, [10, 20, 30, 40]),  # 30 jumped
     ({10: 0.05, 20: 0.20, 30: 0.50, 40: 0.25, 50: 0.50}, 30, [10, 20, 30, 40, 50])],
)  # fmt: skip
def test_the_first_save_in_the_band_is_picked_else_the_closest_earliest(curve, picked, asked):
    """No save after the first in the band is scored; with none in it, 30 (0.05 above) beats 40
    (0.05 below, later)."""
    scored: list[int] = []
    lines: list[str] = []

    def scorer(model: Path) -> Score:
        step = int(model.parent.name.removeprefix("global_step_"))
        scored.append(step)
        return Score(curve[step], min(1.0, 2 * curve[step]), 400)

    candidates = [(s, Path(f"/run/global_step_{s}")) for s in curve]
    step, scores = pick(candidates, (0.30, 0.45), scorer, log=lines.append)
    assert (step, scored, sorted(scores)) == (picked, asked, asked)
    assert lines[2] == "warm start: step 30: accuracy 0.500, right in any format 1.000"


def test_only_saves_with_a_hugging_face_model_are_candidates(tmp_path):
    for name in ("global_step_20", "global_step_100", "global_step_5"):
        (tmp_path / name / "huggingface").mkdir(parents=True)
        (tmp_path / name / "huggingface" / "config.json").write_text("{}")
    (tmp_path / "global_step_30").mkdir()  # a save without hf_model: no model to score
    (tmp_path / "global_step_x" / "huggingface").mkdir(parents=True)
    assert [step for step, _ in saves(tmp_path)] == [5, 20, 100]


@pytest.fixture(scope="module")
def sft_run(tiny_model_dir: Path, tmp_path_factory) -> Path:
    """An SFT run's layout, two saves of the tiny random model (global_step_10, _20)."""
    run = tmp_path_factory.mktemp("sft-run")
    for step in (10, 20):
        shutil.copytree(tiny_model_dir, run / f"global_step_{step}" / "huggingface")
    return run


def test_the_command_line_scores_real_models_and_prints_the_picked_save(
    sft_run, prepared_gsm8k_dir, tmp_path, capsys
):
    """Real greedy answers over a real verl RL parquet: the random tiny model is right on no
    GSM8K question, so a band from 0 picks the first save and one above 0 picks none (the
    closest, the first, said loudly); every score taken is in the record."""
    test_file = prepared_gsm8k_dir / "test.parquet"
    questions = len(read_questions(test_file))
    record = tmp_path / "pick.json"
    base = [str(sft_run), "--test-file", str(test_file), "--max-new-tokens", "8"]
    assert main([*base, "--band", "0-0.5", "--record", str(record)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(sft_run / "global_step_10")
    assert f"step 10 of 20, accuracy 0.00 (right in any format 0.00, {questions} test" in err
    saved = json.loads(record.read_text())
    assert saved["picked_step"] == 10 and saved["in_band"] is True
    assert list(saved["scores"]) == ["10"]  # in the band at once: step 20 never scored
    assert main([*base, "--band", "0.3-0.45"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(sft_run / "global_step_10")
    assert "NONE IN THE BAND, the closest to 0.3-0.45" in err.splitlines()[-1]


def test_the_scores_are_the_rewards_on_the_greedy_answers(prepared_gsm8k_dir, monkeypatch):
    """score() counts what rewards/gsm8k.py says of each answer: the ground truth after the
    marker scores on both, one written elsewhere only in any format, a wrong one on neither."""
    rows = read_questions(prepared_gsm8k_dir / "test.parquet")[:3]
    truths = [row["reward_model"]["ground_truth"] for row in rows]
    answers = [f"so\n#### {truths[0]}", f"The answer is {truths[1]}.", "#### 123456789"]
    monkeypatch.setattr("verl_gsm8k.warm_start.score.greedy_answers", lambda *args: answers)
    assert score(Path("unused"), rows, 24) == Score(1 / 3, 2 / 3, 3)


@pytest.mark.parametrize(
    ("band", "test_file", "empty_run", "line"),
    [("0.5-0.3", "test.parquet", False, "band '0.5-0.3': needs 0 <= LOW <= HIGH <= 1"),
     ("0-1", "nope.parquet", False, ""),
     ("0-1", "test.parquet", True, "{run}: no global_step_N/huggingface save")],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(
    band, test_file, empty_run, line, sft_run, prepared_gsm8k_dir, tmp_path, capsys
):
    run, record = tmp_path if empty_run else sft_run, tmp_path / "pick.json"
    argv = [str(run), "--test-file", str(prepared_gsm8k_dir / test_file), "--band", band,
            "--record", str(record)]  # fmt: skip
    expected = "warm start: " + line.format(run=run)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith(expected), err
    assert not record.exists()
    if band == "0.5-0.3":  # the module's entry point, as learn_tiny runs it
        done = subprocess.run([sys.executable, "-m", "verl_gsm8k.warm_start", *argv],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert (done.returncode, done.stderr.strip()) == (2, expected)

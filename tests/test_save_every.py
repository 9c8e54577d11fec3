"""SAVE_EVERY_MIN at launch (verl_gsm8k/launch/save_every.py): the interval of the time saves,
from the run's own slowest save measured, so that they cost at most 3% of the run; the trainer's
side (a time save on a real run, SIGKILLed mid-save and resumed) is tests/test_train_cpu.py's
kill test."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_gsm8k.guard.deadline import Timings
from verl_gsm8k.launch.plan import recipe_plan
from verl_gsm8k.launch.save_every import FIRST_MIN, MIN_MIN, choose

ROOT = Path(__file__).resolve().parents[1]


def measured(run_dir: Path, save_s: float) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    Timings(step_s=60.0, save_s=save_s).write(run_dir)
    return run_dir


@pytest.mark.parametrize(
    ("save_s", "minutes"),
    [(18.0, 10.0), (90.0, 50.0), (0.05, MIN_MIN)],  # 18 s = 3% of 10 min; a CPU's: the floor
)
def test_auto_saves_at_most_3_percent_of_the_time(tmp_path: Path, save_s: float, minutes: float):
    got, line = choose(measured(tmp_path / "run", save_s), "auto")
    assert got == minutes, line
    assert f"each {minutes:g} min (SAVE_EVERY_MIN=auto: a save takes {save_s:.0f} s" in line


def test_auto_before_any_save_and_the_users_own(tmp_path: Path):
    assert choose(tmp_path / "new", "auto")[0] == FIRST_MIN
    assert choose(measured(tmp_path / "run", 90.0), "7.5") == (
        7.5, "recipe: a time save after the first step past each 7.5 min (SAVE_EVERY_MIN)"
    )  # fmt: skip
    minutes, line = choose(tmp_path / "run", "0")
    assert minutes == 0 and "no time saves" in line


def test_the_launch_passes_the_minutes_to_the_trainer(tmp_path: Path):
    run_dir = measured(tmp_path / "runs" / "ppo_qwen2.5-0.5b_gsm8k", 18.0)
    env = {"HOME": str(tmp_path), "RUNS_ROOT": str(tmp_path / "runs")}
    plan = recipe_plan(ROOT / "recipes" / "ppo_qwen2.5-0.5b_gsm8k.sh", env, gpu=True)
    assert plan.run_dir == run_dir
    assert "gsm8k_guard.save_every_min=10" in plan.all_overrides([])
    said = "recipe: a time save after the first step past each 10 min (SAVE_EVERY_MIN=auto: a "
    assert plan.save_every_line.startswith(said + "save takes 18 s here"), plan.save_every_line
    sft = recipe_plan(ROOT / "recipes" / "sft_qwen2.5-0.5b_gsm8k.sh", env, gpu=True)
    assert not any("save_every_min" in o for o in sft.all_overrides([]))  # verl's SFT trainer

"""STOP_GRACE_S chosen from the steps and saves measured in the run directory, said in one line
(verl_gsm8k/launch/grace.py, called by verl_gsm8k/launch/cli.py at each PPO launch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_gsm8k.guard.deadline import MARGIN_S, Timings
from verl_gsm8k.launch.grace import RAY_JOB_ENV, RAY_WAIT_ENV, choose, stop_needs


def measured(run_dir: Path, **timings: float) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "timings.json").write_text(json.dumps(timings))
    return run_dir


def test_a_stop_needs_a_whole_step_its_validation_and_save():
    assert stop_needs(Timings()) is None
    assert stop_needs(Timings(step_s=60, save_s=20, val_s=10)) == 60 + 10 + 20 + MARGIN_S
    assert stop_needs(Timings(step_s=60)) == 60 + 60 + MARGIN_S  # no save measured: a step's


def test_nothing_measured_keeps_the_default_and_says_so(tmp_path: Path):
    grace, said = choose(Timings.read(tmp_path), {})
    assert grace == 30 and said == [
        "recipe: STOP_GRACE_S=30 s (the default; nothing measured in this run directory yet)"
    ]


def test_a_slow_step_raises_the_grace_unless_the_user_set_it(tmp_path: Path):
    run_dir = measured(tmp_path, step_s=66.2, save_s=20.5, start_s=120)
    grace, said = choose(Timings.read(run_dir), {})
    assert grace == 102  # 66.2 + 20.5 + 15, up
    assert said[0].startswith("recipe: STOP_GRACE_S=102 s, what a stop needs here (102 s: ")
    grace, said = choose(Timings.read(run_dir), {"STOP_GRACE_S": "40"})
    assert grace == 40 and len(said) == 1
    assert said[0].startswith("recipe: warning: STOP_GRACE_S=40 s is shorter than a stop needs")
    grace, said = choose(Timings.read(run_dir), {"STOP_GRACE_S": "600"})
    assert (grace, said) == (600, [])  # set and long enough: nothing to say


def test_a_fast_step_keeps_the_default(tmp_path: Path):
    grace, said = choose(Timings.read(measured(tmp_path, step_s=5, save_s=3)), {})
    assert grace == 30 and said == [
        "recipe: STOP_GRACE_S=30 s (the default; a stop needs 23 s: step 5 s, save 3 s, +15 s, "
        "measured in timings.json)"
    ]


def test_a_ray_jobs_stop_wait_shorter_than_the_grace_is_a_warning(tmp_path: Path):
    run_dir = measured(tmp_path, step_s=66, save_s=20)
    # Ray's default: SIGKILL 3 s after SIGTERM
    _, said = choose(Timings.read(run_dir), {RAY_JOB_ENV: "{}"})
    assert said[-1].startswith(f"recipe: warning: a Ray job: `ray job stop` sends SIGKILL "
                               f"{RAY_WAIT_ENV}=3 s after its SIGTERM")  # fmt: skip
    assert f"start the Ray head with {RAY_WAIT_ENV}=101 in its environment" in said[-1]
    _, said = choose(Timings.read(run_dir), {RAY_JOB_ENV: "{}", RAY_WAIT_ENV: "300"})
    assert not any("Ray job" in line for line in said)
    _, said = choose(Timings.read(run_dir), {RAY_WAIT_ENV: "1"})  # not a Ray job's entrypoint
    assert not any("Ray job" in line for line in said)


def test_the_grace_is_said_a_shorter_setting_kept_with_a_warning_and_a_word_refused(
    tmp_path: Path,
):
    run_dir = measured(tmp_path, step_s=66, save_s=20)
    grace, said = choose(Timings.read(run_dir), {})
    assert grace == 101 and said[-1].startswith(
        "recipe: STOP_GRACE_S=101 s, what a stop needs here"
    )
    grace, said = choose(Timings.read(run_dir), {"STOP_GRACE_S": "9"})
    assert grace == 9 and said[-1].startswith("recipe: warning: STOP_GRACE_S=9 s is shorter")
    for key in ("STOP_GRACE_S", RAY_WAIT_ENV):
        with pytest.raises(ValueError) as err:
            choose(Timings.read(run_dir), {key: "soon", RAY_JOB_ENV: "{}"})
        assert str(err.value) == f"recipe: {key}='soon' is not a number of seconds"

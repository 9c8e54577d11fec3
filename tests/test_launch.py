"""A relaunch never resumes another experiment's checkpoint silently (a stand-in verl:
test_recipes.fake_verl_python); what a launch records: test_recipes::test_launch_on_a_gpu_machine;
RESUME=disable: tests/test_same_config.py and the knob table in test_recipes.py; RESUME=force: the
kill test (tests/test_train_cpu.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import fake_nvidia_smi, recipe_env, run_recipe
from test_recipes import fake_verl_python

from verl_gsm8k.common.launch_record import read_records

RECIPE = "ppo_qwen2.5-0.5b_gsm8k"


@pytest.fixture
def gpu_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path) -> dict[str, str]:
    python = fake_verl_python(tmp_path / "python", tmp_path / "verl-args.txt")
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [("NVIDIA H100 80GB HBM3", 81559)])
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", PYTHON=str(python),
                     SKIP_PREFLIGHT="1")  # fmt: skip
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


def run_dir(env: dict[str, str]) -> Path:
    return Path(env["RUNS_ROOT"]) / RECIPE


def place_checkpoint(source: Path, directory: Path, step: int) -> None:
    """A whole checkpoint (tests/conftest.py's whole_checkpoints) as step STEP of DIRECTORY."""
    shutil.copytree(source / "global_step_4", directory / f"global_step_{step}")
    (directory / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_a_relaunch_of_another_experiment_stops_with_one_line(gpu_env, whole_checkpoints, tmp_path):
    assert run_recipe(RECIPE, gpu_env).returncode == 0
    place_checkpoint(whole_checkpoints, run_dir(gpu_env), 20)
    (tmp_path / "verl-args.txt").unlink()
    other = run_recipe(RECIPE, dict(gpu_env, ACTOR_LR="1e-4"))
    assert other.returncode == 2
    (line,) = [x for x in other.stderr.splitlines() if x.startswith("launch:")]
    assert "holds the checkpoint of step 20 of another experiment (1 key(s) differ from " in line
    assert "actor_rollout_ref.actor.optim.lr 1e-06 -> 0.0001" in line
    assert "new EXPERIMENT_NAME" in line and "RESUME=force" in line
    assert not (tmp_path / "verl-args.txt").exists()  # verl never started
    assert len(read_records(run_dir(gpu_env))) == 1  # and nothing recorded

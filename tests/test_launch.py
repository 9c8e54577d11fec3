"""Every launch records what it was, and a relaunch never resumes another experiment's
checkpoint silently (a stand-in verl: test_recipes.fake_verl_python)."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
from helpers import fake_nvidia_smi, recipe_env, run_recipe
from test_recipes import fake_verl_python, recorded

from verl_gsm8k.common.command_line import PREFIX
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


def test_a_launch_records_its_config_knobs_versions_and_host(gpu_env, tmp_path):
    result = run_recipe(RECIPE, dict(gpu_env, ACTOR_LR="2e-6"), "trainer.total_epochs=3")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (record,) = read_records(run_dir(gpu_env))
    path = f"{run_dir(gpu_env)}/launches/launch-{record['stamp']}.yaml"
    assert f"launch: recorded -> {path}" in result.stdout
    args, _, metrics = recorded(tmp_path / "verl-args.txt")
    assert metrics.name == f"metrics-{record['stamp']}.jsonl"  # one stamp per launch
    assert (record["recipe"], record["trainer"], record["config_name"]) == (
        RECIPE, "ppo", "gsm8k_ppo")  # fmt: skip
    config = record["config"]
    assert config["actor_rollout_ref"]["actor"]["optim"]["lr"] == 2e-6  # resolved, typed
    assert config["trainer"]["total_epochs"] == 3  # the user's override, last
    assert record["knobs"]["ACTOR_LR"] == "2e-6"
    assert record["knob_keys"]["actor_rollout_ref.actor.optim.lr"] == "ACTOR_LR"
    assert record["user_overrides"] == ["trainer.total_epochs=3"]
    assert record["versions"]["verl"] == "0.9.1" and record["versions"]["torch"]
    assert len(record["git"]["commit"]) == 40 and isinstance(record["git"]["dirty"], bool)
    assert record["host"]["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.6}]
    # the exact command verl got: said on the console, kept in the record, what verl received
    (said,) = [x for x in result.stdout.splitlines() if x.startswith(PREFIX)]
    assert said == PREFIX + record["verl_command"]
    command = shlex.split(record["verl_command"])
    assert command[next(i for i, w in enumerate(command) if "=" not in w) + 1 :] == args
    assert args[:2] == ["-m", "verl.trainer.main_ppo"]
    assert f"VERL_FILE_LOGGER_PATH={metrics}" in command


def test_a_relaunch_of_another_experiment_stops_with_one_line_and_resume_disable_starts_over(
    gpu_env, whole_checkpoints, tmp_path
):
    assert run_recipe(RECIPE, gpu_env).returncode == 0
    place_checkpoint(whole_checkpoints, run_dir(gpu_env), 20)
    again = run_recipe(RECIPE, gpu_env)  # the same experiment: resumes, a second record
    assert again.returncode == 0, again.stderr[-2000:]
    (tmp_path / "verl-args.txt").unlink()
    other = run_recipe(RECIPE, dict(gpu_env, ACTOR_LR="1e-4"))
    assert other.returncode == 2
    (line,) = [x for x in other.stderr.splitlines() if x.startswith("launch:")]
    assert "holds the checkpoint of step 20 of another experiment (1 key(s) differ from " in line
    assert "actor_rollout_ref.actor.optim.lr 1e-06 -> 0.0001" in line
    assert "new EXPERIMENT_NAME" in line and "RESUME=force" in line
    assert not (tmp_path / "verl-args.txt").exists()  # verl never started
    assert len(read_records(run_dir(gpu_env))) == 2  # and nothing recorded
    forced = run_recipe(RECIPE, dict(gpu_env, ACTOR_LR="1e-4", RESUME="force"))
    assert forced.returncode == 0 and len(read_records(run_dir(gpu_env))) == 3
    result = run_recipe(RECIPE, dict(gpu_env, ACTOR_LR="3e-6", RESUME="disable"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "trainer.resume_mode=disable" in recorded(tmp_path / "verl-args.txt")[0]
    # the checkpoints are set aside, nothing deleted (tests/test_same_config.py)
    (aside,) = run_dir(gpu_env).glob("superseded-*")
    assert (aside / "global_step_20").is_dir() and not list(run_dir(gpu_env).glob("global_step_*"))
    assert f"moved to {aside} (nothing deleted" in result.stdout

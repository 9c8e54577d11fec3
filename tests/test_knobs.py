"""The knob table: a bad value stops a recipe in one line; the table, Hydra, verl, docs agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, launch_in_process, recipe_env

from verl_gsm8k.launch import knobs
from verl_gsm8k.launch.plan import Recipe, make_plan

# (recipe, knobs, the user's key=value, the one line): the launch's paths to a refusal.
BAD = {
    "a value": ("ppo", {"TRAIN_BATCH_SIZE": "1e3"}, [], "TRAIN_BATCH_SIZE=1e3 is not an integer"),
    "two values together": (
        "ppo", {"TRAIN_BATCH_SIZE": "7", "PPO_MINI_BATCH_SIZE": "4"}, [],
        "TRAIN_BATCH_SIZE=7 does not split into mini-batches of PPO_MINI_BATCH_SIZE=4"),
    "LOGGER without file": ("ppo", {"LOGGER": "console"}, [], "LOGGER=console is not a "),
    "trainer.logger without file": (
        "ppo", {}, ["trainer.logger=console"], "trainer.logger=console after -- leaves out "
        "verl's file logger, which writes RUN_DIR/metrics/ (the report, the watchdog and a resume "
        "read it): write trainer.logger=[console,file]"),
    "SFT on two nodes": ("sft", {"NNODES": "2"}, [], "recipe: NNODES=2: the SFT recipe trains "
                         "on one node (torchrun --standalone); set NDEVICES_PER_NODE"),
}  # fmt: skip
RECIPES = {"ppo": "ppo_qwen2.5-0.5b_gsm8k", "sft": "sft_qwen2.5-0.5b_gsm8k"}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_value_stops_the_recipe_with_one_line(case, tmp_path):
    trainer, values, user, shown = BAD[case]
    env = recipe_env(Path("/x"), Path("/x"), tmp_path / "runs", DRY_RUN="1", **values)
    result = launch_in_process(RECIPES[trainer], env, *user)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output[-3000:]
    assert "\n" not in output and shown in output, output  # the preflight never started
    assert output.startswith(("knobs: ", "recipe: ")) and "Traceback" not in output


def test_the_file_logger_stays_whatever_the_users_list():

    def refused(*user: str) -> list[str]:
        plan = make_plan(Recipe("r", "gsm8k_ppo"), {"HOME": "/x"}, lambda: True, False, user)
        return [line.split(": write ")[-1] for line in plan.problems()]

    assert refused("trainer.logger=[console,file]", "+trainer.logger='[file, wandb]'") == []
    assert refused("++trainer.logger=[console, 'wandb']") == ["trainer.logger=[console,wandb,file]"]
    assert refused("trainer.logger=[console,file]", "~trainer.logger") == ["trainer.logger=[file]"]
    assert refused("trainer.logger=file", "trainer.logger=[]") == ["trainer.logger=[file]"]


@pytest.mark.parametrize(
    "name,good,bad",
    [
        ("TRAIN_BATCH_SIZE", ["1", "128", "1024"], ["0", "-1", "007", "1.0", "1e3", "+3", ""]),
        ("ACTOR_LR", ["1e-6", "1E-6", "0.5", ".5", "2.", "3"], ["0", "0.0", "-1e-6", "nan", "x"]),
        ("KL_COEF", ["0", "0.0", "0.001", "1e-3"], ["-0.001", "inf", "low"]),
        ("ROLLOUT_GPU_MEM_UTIL", ["0.4", "1", "1.0", ".05"], ["0", "1.5", "1.01", "40%"]),
        ("TOTAL_TRAINING_STEPS", ["null", "1", "200"], ["0", "None", "-1", "2.5"]),
        ("SAVE_FREQ", ["-1", "1", "20"], ["0", "-2", "never"]),
        ("MAX_CKPT_TO_KEEP", ["null", "1", "3"], ["0", "-1", "all"]),
        ("REWARD_FN", ["compute_score", "compute_score_flexible"], ["compute-score", "1fn", ""]),
        ("LOGGER", ["console,file", "file", "console,file,wandb"],
         ["", "console", "console,", "tensorboard", "file,tracking"]),
        ("DRY_RUN", ["0", "1"], ["yes", "true", ""]),
        ("SEED", ["0", "7"], ["-1"]),
        ("TOY_TASK", ["easy", "products"], ["medium", "hard"]),
        ("ALGO", list(knobs.LEARN_ALGOS), ["reinforce"]),
        ("TOOLS", ["calculator"], ["python", "calculator,search", ""]),
        ("TOOL_TURNS", ["1", "3"], ["0", "all"]),
    ],
)  # fmt: skip
def test_checks_accept_and_refuse(name, good, bad):
    for value in good:
        assert knobs.problems({name: value}) == [], (name, value)
    for value in bad:
        (line,) = knobs.problems({name: value})
        assert line.startswith(f"{knobs.shown(name, value)} is not "), line


def test_accepted_numbers_are_numbers_to_hydra():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    B = "TRAIN_BATCH_SIZE"
    for name, value, kind in [(B, "128", int), ("ACTOR_LR", "1E-6", float),
                              ("ACTOR_LR", ".5", float), ("ACTOR_LR", "2.", float),
                              ("KL_COEF", "0", int), ("TOTAL_TRAINING_STEPS", "null", type(None)),
                              (B, "007", str), (B, "01.5", str)]:  # fmt: skip
        assert type(parser.parse_override(f"k={value}").value()) is kind, value
        assert (knobs.problems({name: value}) == []) is (kind is not str), value  # strings refused


def test_cross_check_only_when_both_sizes_are_valid():
    assert knobs.problems({"TRAIN_BATCH_SIZE": "128", "PPO_MINI_BATCH_SIZE": "64"}) == []
    assert knobs.problems({"TRAIN_BATCH_SIZE": "64", "PPO_MINI_BATCH_SIZE": "128"}) == [
        "PPO_MINI_BATCH_SIZE=128 is larger than TRAIN_BATCH_SIZE=64"
    ]
    (line,) = knobs.problems({"TRAIN_BATCH_SIZE": "abc", "PPO_MINI_BATCH_SIZE": "4"})
    assert line.startswith("TRAIN_BATCH_SIZE=abc")
    assert knobs.problems({"UNKNOWN_KNOB": "whatever"}) == []


def test_loggers_are_verls():
    from verl.utils.tracking import Tracking

    assert set(knobs.VERL_LOGGERS) == set(Tracking.supported_backend)


def test_cli_is_stdlib_only_and_quotes_values_and_docs_hold_its_table():
    """-S: no site-packages, so the check cannot depend on verl, Hydra or torch."""
    script = [sys.executable, "-S", "-m", "verl_gsm8k.launch.knobs"]
    result = subprocess.run([*script, "TRAIN_BATCH_SIZE=12 8", "ACTOR_LR=1e-6"], cwd=ROOT,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == "knobs: TRAIN_BATCH_SIZE='12 8' is not an integer > 0\n"
    table = subprocess.run([*script, "--markdown"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    names = [line.split("`")[1] for line in table.splitlines()[2:]]
    assert names == [knob.name for knob in knobs.KNOBS]
    assert table in (ROOT / "docs" / "knobs.md").read_text(), "python -m ...knobs --markdown"


def test_a_knob_that_always_sets_a_key_is_its_only_default():
    from omegaconf import OmegaConf

    found = []
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        config = OmegaConf.load(path)
        for knob in knobs.KNOBS:
            if knob.default is None or knob.recipes:
                continue
            for key in (key for trainer in knob.trainers for key in knob.keys(trainer)):
                if OmegaConf.select(config, key.path, default=None) is not None:
                    found.append(f"{path.name}: {key.path} (set by {knob.name})")
    assert found == [], found

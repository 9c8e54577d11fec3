"""The knob table (verl_gsm8k/launch/knobs.py): every bad value stops a real recipe before the
preflight, with one line naming the knob and the value; the table, Hydra, verl and docs/knobs.md
agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, launch_in_process, recipe_env

from verl_gsm8k.launch import knobs

# Bad knob values -> what the one line must show. Before the table existed, the first ones ended
# in a Python traceback, the others passed the dry run and would have failed on the GPU.
BAD = {
    "batch not a number": ({"TRAIN_BATCH_SIZE": "abc"}, "TRAIN_BATCH_SIZE=abc"),
    "batch zero": ({"TRAIN_BATCH_SIZE": "0"}, "TRAIN_BATCH_SIZE=0"),
    "batch in float notation": ({"TRAIN_BATCH_SIZE": "1e3"}, "TRAIN_BATCH_SIZE=1e3"),
    "no devices": ({"NDEVICES_PER_NODE": "0"}, "NDEVICES_PER_NODE=0"),
    "learning rate a word": ({"ACTOR_LR": "fast"}, "ACTOR_LR=fast"),
    "no responses per prompt": ({"ROLLOUT_N": "0"}, "ROLLOUT_N=0"),
    "memory share above 1": ({"ROLLOUT_GPU_MEM_UTIL": "1.5"}, "ROLLOUT_GPU_MEM_UTIL=1.5"),
    "negative KL": ({"KL_COEF": "-0.1"}, "KL_COEF=-0.1"),
    "zero total steps": ({"TOTAL_TRAINING_STEPS": "0"}, "TOTAL_TRAINING_STEPS=0"),
    "unknown logger": ({"LOGGER": "console,wandbb"}, "LOGGER=console,wandbb"),
    "batch does not split into mini-batches": (
        {"TRAIN_BATCH_SIZE": "7", "PPO_MINI_BATCH_SIZE": "4"},
        "TRAIN_BATCH_SIZE=7 does not split into mini-batches of PPO_MINI_BATCH_SIZE=4",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_knob_stops_the_recipe_with_one_line(
    case, tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    values, shown = BAD[case]
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1", **values)
    result = launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output[-3000:]
    assert "\n" not in output, output[-3000:]  # one line, and the preflight never started
    assert output.startswith("knobs: ") and shown in output, output
    assert "Traceback" not in output


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
        ("LOGGER", ["console", "console,file,wandb", "tensorboard"], ["", "console,", "tracking"]),
        ("DRY_RUN", ["0", "1"], ["yes", "true", ""]),
    ],
)
def test_checks_accept_and_refuse(name, good, bad):
    for value in good:
        assert knobs.problems({name: value}) == [], (name, value)
    for value in bad:
        (line,) = knobs.problems({name: value})
        assert line.startswith(f"{knobs.shown(name, value)} is not "), line


def test_accepted_numbers_are_numbers_to_hydra():
    """What the table lets through, Hydra parses as the number the user meant (not a string)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for name, value, kind in [
        ("TRAIN_BATCH_SIZE", "128", int),
        ("ACTOR_LR", "1E-6", float),
        ("ACTOR_LR", ".5", float),
        ("ACTOR_LR", "2.", float),
        ("KL_COEF", "0", int),
        ("TOTAL_TRAINING_STEPS", "null", type(None)),
    ]:
        assert knobs.problems({name: value}) == []
        assert type(parser.parse_override(f"k={value}").value()) is kind, value
    for value in ("007", "01.5"):  # Hydra reads these as strings: the table refuses them
        assert isinstance(parser.parse_override(f"k={value}").value(), str)
        assert knobs.problems({"TRAIN_BATCH_SIZE": value})


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


def test_cli_is_stdlib_only_and_quotes_values():
    """-S: no site-packages at all, so the check cannot depend on verl, Hydra or torch."""
    # -S: only the repository root (cwd) to import from
    script = ["-m", "verl_gsm8k.launch.knobs"]
    result = subprocess.run(
        [sys.executable, "-S", *script, "TRAIN_BATCH_SIZE=12 8", "ACTOR_LR=1e-6"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr == "knobs: TRAIN_BATCH_SIZE='12 8' is not an integer > 0\n"
    table = subprocess.run(
        [sys.executable, "-S", *script, "--markdown"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert [line.split("`")[1] for line in table.splitlines()[2:]] == [
        knob.name for knob in knobs.KNOBS
    ]


def test_docs_list_every_knob_check():
    assert knobs.markdown_table(ROOT / "recipes") in (ROOT / "docs" / "knobs.md").read_text(), (
        "docs/knobs.md's table is not the table's: python -m verl_gsm8k.launch.knobs --markdown"
    )


def test_a_knob_that_always_sets_a_key_is_its_only_default():
    """A key a knob sets at every launch of a trainer (a default, no recipe of its own) has no
    value in configs/: declared ??? at most, so that the knob table is its one default."""
    import glob

    from omegaconf import OmegaConf

    from verl_gsm8k.launch.knobs import KNOBS

    found = []
    for path in sorted(glob.glob(str(ROOT / "configs" / "**" / "*.yaml"), recursive=True)):
        config = OmegaConf.load(path)
        for knob in KNOBS:
            if knob.default is None or knob.recipes:
                continue
            for trainer in knob.trainers:
                for key in knob.keys(trainer):
                    if OmegaConf.select(config, key.path, default=None) is not None:
                        found.append(f"{Path(path).name}: {key.path} (set by {knob.name})")
    assert found == [], found

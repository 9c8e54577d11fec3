"""Before a relaunch resumes (resume/verify.py), on real checkpoints at steps 2 and 4: each attack
and each damage to a file of step 4 (crafted_shards.py) makes the launch resume step 2, one line
naming the file and why, nothing run or deleted."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from crafted_shards import plant
from helpers import assert_loads_as_torch

from verl_gsm8k.common.run_dir import TRACKER
from verl_gsm8k.resume.verify import NoWholeCheckpoint, resume_point

ROLES = ("actor", "critic")


@pytest.fixture
def run(whole_checkpoints: Path, tmp_path: Path) -> Path:
    return shutil.copytree(whole_checkpoints, tmp_path / "run")


def test_a_whole_checkpoint_is_resumed_as_named(run):
    step, said = resume_point(run, ROLES)
    assert step == 4 and said == ["resume: global_step_4 is whole (every shard checked)"]


def test_real_checkpoints_load_as_torch_loads_them(whole_checkpoints):
    assert assert_loads_as_torch(whole_checkpoints) == 26  # 2 steps: 12 shards and data.pt


TWO = "not one zip archive from byte 0 (two archives glued, or data before or after it)"
OBJECTS = "allowlisted via `add_safe_globals`, but got <class 'numpy.dtypes.ObjectDType'>"


@pytest.mark.parametrize(("file", "kind", "why"), [
    ("critic/optim_world_size_2_rank_1.pt", "truncated", "is truncated or damaged (File is not"),
    ("actor/model_world_size_2_rank_0.pt", "garbled", "is truncated or damaged (Bad CRC-32 for"),
    ("data.pt", "missing", "missing data.pt (the dataloader's position)"),
    ("actor/model_world_size_2_rank_0.pt", "link", "is a symbolic link (verl writes none)"),
    ("critic/extra_state_world_size_2_rank_1.pt", "fifo", ": not a regular file"),
    ("actor/extra_state_world_size_2_rank_1.pt", "directory", "/data/0 is marked a directory"),
    ("critic/model_world_size_2_rank_1.pt", "torchscript", "Cannot use ``weights_only=True`` with "
     "TorchScript archives passed to ``torch.load``"),
    ("actor/model_world_size_2_rank_1.pt", "glued", TWO),
    ("critic/model_world_size_2_rank_0.pt", "prepended", TWO),
    ("actor/optim_world_size_2_rank_1.pt", "appended", TWO),
    ("data.pt", "payload", "GLOBAL posix.system whose module posix is blocked."),
    ("actor/extra_state_world_size_2_rank_0.pt", "objects", OBJECTS),
    ("data.pt", "objects", OBJECTS),
    ("critic/model_world_size_2_rank_1.pt", "objects", OBJECTS),
])  # fmt: skip
def test_a_refused_file_makes_the_resume_fall_back_in_one_line(run, tmp_path, file, kind, why):
    path, marker = run / "global_step_4" / file, tmp_path / "ran"
    if kind == "missing":
        path.unlink()
    else:
        plant(kind, path, marker)
    step, said = resume_point(run, ROLES)
    assert step == 2 and (run / TRACKER).read_text() == "2", said
    assert said[0].startswith(f"resume: global_step_4, which {TRACKER} names, is not whole: ")
    assert why in said[0] and path.name in said[0] and "\n" not in said[0], said[0]
    assert said[-1] == f"resume: from global_step_2 instead ({TRACKER} now names it)"
    assert not marker.exists(), "a payload ran"
    assert kind == "missing" or os.path.lexists(path)  # nothing deleted


@pytest.mark.parametrize("tracker", ["", None])
def test_an_empty_or_missing_tracker_names_the_newest_whole_step(run, tracker):
    if tracker is None:
        (run / TRACKER).unlink()
    else:
        (run / TRACKER).write_text(tracker)
    step, said = resume_point(run, ROLES)
    assert step == 4 and (run / TRACKER).read_text() == "4"
    assert "verl would train from scratch" in said[0]
    assert said[-1] == f"resume: from global_step_4 instead ({TRACKER} now names it)", said


def test_no_whole_checkpoint_is_one_line_and_deletes_nothing(run):
    for step in (2, 4):
        (run / f"global_step_{step}" / "actor" / "model_world_size_2_rank_0.pt").write_bytes(b"")
    with pytest.raises(NoWholeCheckpoint) as err:
        resume_point(run, ROLES)
    assert "\n" not in str(err.value) and "RESUME=disable" in str(err.value)
    assert (run / TRACKER).read_text() == "4"
    assert sorted(p.name for p in run.glob("global_step_*")) == ["global_step_2", "global_step_4"]


def test_a_critic_missing_from_a_ppo_step_is_not_whole(run):
    shutil.rmtree(run / "global_step_4" / "critic")
    step, said = resume_point(run, ROLES)
    assert step == 2 and "no critic/" in said[0]
    assert resume_point(run, ("actor",))[0] == 2  # the tracker now names 2; actor-only: whole


def test_a_checkpoint_the_watchdog_marked_sick_is_never_resumed(run):
    """A tracker lost after the watchdog marked step 4 sick must not bring the resume back to it."""
    from verl_gsm8k.common.run_dir import mark_sick

    mark_sick(run, 4, {"step": 5, "rule": "non_finite"})
    (run / TRACKER).unlink()
    step, said = resume_point(run, ROLES)
    assert step == 2 and (run / TRACKER).read_text() == "2"
    assert any("global_step_4 is not whole either: the watchdog marked it sick" in s for s in said)
    assert (run / "global_step_4" / "actor").is_dir()  # kept


def test_a_world_size_no_directory_could_hold_is_one_line_at_once(run):
    from verl_gsm8k.reshard.shards import ReshardError, world_size_of

    role = run / "global_step_4" / "actor"
    (role / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 10**8}))
    started = time.monotonic()
    with pytest.raises(ReshardError) as err:
        world_size_of(role)
    step, said = resume_point(run, ROLES)  # the merge's check, the same (merge/find.py)
    assert step == 2 and time.monotonic() - started < 1.0
    for message in (str(err.value), said[0]):
        assert "says world_size 100000000, but" in message and "\n" not in message, message

"""Before a relaunch resumes (verl_gsm8k/resume/verify.py): real FSDP checkpoints of verl's
checkpoint manager at steps 2 and 4 (tests/conftest.py's ``whole_checkpoints``), then each way a
kill leaves a run directory: the newest shard truncated, data.pt missing, the tracker empty or
gone, nothing whole at all."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from verl_gsm8k.common.run_dir import TRACKER
from verl_gsm8k.resume.verify import NoWholeCheckpoint, resume_point

ROLES = ("actor", "critic")


def copy_of(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


def test_a_whole_checkpoint_is_resumed_as_named(whole_checkpoints, tmp_path):
    run = copy_of(whole_checkpoints, tmp_path)
    step, said = resume_point(run, ROLES)
    assert step == 4 and said == ["resume: global_step_4 is whole (every shard checked)"]


def test_a_truncated_shard_falls_back_to_the_previous_whole_step(whole_checkpoints, tmp_path):
    run = copy_of(whole_checkpoints, tmp_path)
    shard = run / "global_step_4" / "critic" / "optim_world_size_2_rank_1.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # killed mid-save
    step, said = resume_point(run, ROLES)
    assert step == 2 and (run / TRACKER).read_text() == "2"
    assert "global_step_4, which latest_checkpointed_iteration.txt names, is not whole" in said[0]
    assert "optim_world_size_2_rank_1.pt" in said[0] and "truncated" in said[0]
    assert said[-1] == f"resume: from global_step_2 instead ({TRACKER} now names it)"
    assert shard.exists()  # nothing deleted


def test_a_missing_data_pt_falls_back_too(whole_checkpoints, tmp_path):
    run = copy_of(whole_checkpoints, tmp_path)
    (run / "global_step_4" / "data.pt").unlink()
    step, said = resume_point(run, ROLES)
    assert step == 2 and "missing data.pt" in said[0]


@pytest.mark.parametrize("tracker", ["", None])
def test_an_empty_or_missing_tracker_names_the_newest_whole_step(
    whole_checkpoints, tmp_path, tracker
):
    run = copy_of(whole_checkpoints, tmp_path)
    if tracker is None:
        (run / TRACKER).unlink()
    else:
        (run / TRACKER).write_text(tracker)
    step, said = resume_point(run, ROLES)
    assert step == 4 and (run / TRACKER).read_text() == "4"
    assert "verl would train from scratch" in said[0]


def test_no_whole_checkpoint_is_one_line_and_deletes_nothing(whole_checkpoints, tmp_path):
    run = copy_of(whole_checkpoints, tmp_path)
    for step in (2, 4):
        (run / f"global_step_{step}" / "actor" / "model_world_size_2_rank_0.pt").write_bytes(b"")
    with pytest.raises(NoWholeCheckpoint) as err:
        resume_point(run, ROLES)
    assert "\n" not in str(err.value) and "RESUME=disable" in str(err.value)
    assert (run / TRACKER).read_text() == "4"
    assert sorted(p.name for p in run.glob("global_step_*")) == ["global_step_2", "global_step_4"]


def test_a_critic_missing_from_a_ppo_step_is_not_whole(whole_checkpoints, tmp_path):
    run = copy_of(whole_checkpoints, tmp_path)
    shutil.rmtree(run / "global_step_4" / "critic")
    step, said = resume_point(run, ROLES)
    assert step == 2 and "no critic/" in said[0]
    assert resume_point(run, ("actor",))[0] == 2  # the tracker now names 2; actor-only: whole


def test_a_crafted_data_pt_is_skipped_without_running_code(whole_checkpoints, tmp_path):
    """verl's resume loads data.pt and the optimizer shards with weights_only=False: a crafted one
    in a shared run directory is named and skipped before verl starts, never unpickled."""
    import torch
    from test_merge import _Planted

    run = copy_of(whole_checkpoints, tmp_path)
    marker = tmp_path / "ran"
    torch.save({"planted": _Planted(marker)}, run / "global_step_4" / "data.pt")
    step, said = resume_point(run, ROLES)
    assert step == 2 and not marker.exists()
    assert "global_step_4" in said[0] and "system" in said[0] and "data.pt" in said[0], said[0]


def test_a_checkpoint_the_watchdog_marked_sick_is_never_resumed(whole_checkpoints, tmp_path):
    """Step 4's weights produced a sick step 5 (ppo_trainer/guarded.py marks it and points the
    tracker at 2); a tracker lost since must not bring the resume back to the sick one."""
    from verl_gsm8k.common.run_dir import mark_sick

    run = copy_of(whole_checkpoints, tmp_path)
    mark_sick(run, 4, {"step": 5, "rule": "non_finite"})
    (run / TRACKER).unlink()
    step, said = resume_point(run, ROLES)
    assert step == 2 and (run / TRACKER).read_text() == "2"
    assert any("global_step_4 is not whole either: the watchdog marked it sick" in s for s in said)
    assert (run / "global_step_4" / "actor").is_dir()  # kept

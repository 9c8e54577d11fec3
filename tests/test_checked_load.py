"""verl's own checkpoint loaders with verl_plugins/checked_load.py imported: a crafted file is
refused at the load in one line; a whole one loads as before."""

import importlib
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from crafted_shards import plant
from omegaconf import OmegaConf

import verl_gsm8k.verl_plugins.checked_load  # noqa: F401  (wraps verl's loaders, as in verl)
from verl_gsm8k.common.checkpoint_files import ShardError
from verl_gsm8k.launch.outcome import refused_load, verdict


@pytest.fixture(scope="module")
def single_process_group(tmp_path_factory):
    if not torch.distributed.is_initialized():
        store = tmp_path_factory.mktemp("gloo") / "store"
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0,
                                             world_size=1)  # fmt: skip


def manager(load: list[str]):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    model = torch.nn.Linear(4, 4)
    return FSDPCheckpointManager(model, torch.optim.AdamW(model.parameters()), None, None,
                                 {"load_contents": load, "save_contents": load})  # fmt: skip


def test_a_worker_loads_a_whole_checkpoint_as_before(tmp_path, single_process_group):
    role = tmp_path / "global_step_3" / "actor"
    role.mkdir(parents=True)
    saved = manager(["model", "optimizer", "extra"])
    torch.nn.init.constant_(saved.model.weight, 0.5)
    torch.save(saved.model.state_dict(), role / "model_world_size_1_rank_0.pt")
    torch.save(saved.optimizer.state_dict(), role / "optim_world_size_1_rank_0.pt")
    rng = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(),
           "random": random.getstate()}  # fmt: skip
    torch.save({"rng": rng, "lr_scheduler": None}, role / "extra_state_world_size_1_rank_0.pt")
    loaded = manager(["model", "optimizer", "extra"])
    loaded.load_checkpoint(str(role))
    assert torch.equal(loaded.model.weight, saved.model.weight)
    # a truncated shard is refused at the load by name, not with torch's traceback
    shard = role / "optim_world_size_1_rank_0.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ShardError, match=f"checked load: shard {shard} is truncated"):
        manager(["model", "optimizer", "extra"]).load_checkpoint(str(role))
    assert not getattr(torch.load, "_gsm8k_checked", False)  # checked inside verl's loaders only


# one kind per check (every kind: tests/test_resume_verify.py)
@pytest.mark.parametrize("kind", ["glued", "objects"])
def test_a_worker_refuses_a_planted_shard_at_its_load(tmp_path, single_process_group, kind):
    marker = tmp_path / "ran"
    role = tmp_path / "global_step_3" / "actor"
    role.mkdir(parents=True)
    shard = role / "model_world_size_1_rank_0.pt"
    torch.save(manager(["model"]).model.state_dict(), shard)
    plant(kind, shard, marker)
    with pytest.raises(ShardError) as err:
        manager(["model"]).load_checkpoint(str(role))
    said = str(err.value)
    assert said.startswith(f"checked load: refused to load {shard}: ") and "\n" not in said, said
    assert not marker.exists(), "the crafted shard ran inside verl's load"


class _Stand:  # verl's remote worker group and dataloader: what they were given
    def __init__(self) -> None:
        self.state, self.loaded = None, []

    def load_state_dict(self, state) -> None:
        self.state = state

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self.loaded.append(local_path)


def trainer_resuming(step_dir: Path):
    """verl's v1 trainer resuming from trainer.resume_from_path (the launcher never reads it)."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    trainer = PPOTrainerSync.__new__(PPOTrainerSync)
    trainer.config = OmegaConf.create({"trainer": {
        "resume_mode": "resume_path", "resume_from_path": str(step_dir),
        "del_local_ckpt_after_load": False}})  # fmt: skip
    trainer.actor_rollout_wg, trainer.use_critic = _Stand(), False
    trainer.train_dataloader, trainer.trainer_mode = _Stand(), "sync"
    return trainer


def test_the_trainer_refuses_a_planted_data_pt_on_resume_from_path(tmp_path):
    marker = tmp_path / "ran"
    step_dir = tmp_path / "elsewhere" / "global_step_5"
    step_dir.mkdir(parents=True)
    torch.save({"epoch": 0, "batch": 3}, step_dir / "data.pt")
    plant("payload", step_dir / "data.pt", marker)
    trainer = trainer_resuming(step_dir)
    with pytest.raises(ShardError, match=f"checked load: refused to load {step_dir / 'data.pt'}"):
        trainer._load_checkpoint()
    assert not marker.exists() and trainer.train_dataloader.state is None
    torch.save({"epoch": 0, "batch": 3}, step_dir / "data.pt")
    trainer = trainer_resuming(step_dir)
    trainer._load_checkpoint()
    assert trainer.train_dataloader.state == {"epoch": 0, "batch": 3}
    assert trainer.global_steps == 5
    assert trainer.actor_rollout_wg.loaded == [str(step_dir / "actor")]


def test_every_loader_verl_runs_is_wrapped_where_it_is_imported():
    from verl_gsm8k.verl_plugins.checked_load import LOADERS

    for module, owner, name in LOADERS:
        method = getattr(getattr(importlib.import_module(module), owner), name)
        assert getattr(method, "_gsm8k_checking", False), f"{owner}.{name}"


def test_the_launcher_names_the_refused_file_in_one_line(tmp_path):
    stamp = "20261126T000000Z"
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"console-{stamp}.log").write_text(
        "ray.exceptions.RayTaskError(ShardError): ray::WorkerDict.actor_rollout_load_checkpoint()\n"
        "verl_gsm8k.common.checkpoint_files.ShardError: checked load: refused to load "
        "/r/global_step_8/actor/model_world_size_1_rank_0.pt: Trying to load unsupported GLOBAL "
        "posix.system whose module posix is blocked.\n"
    )
    status, lines = verdict(tmp_path, stamp, 1)
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith("recipe: verl stopped at its checkpoint load: refused to load /r/")
    assert "posix.system" in lines[0] and "\n" not in lines[0]
    assert refused_load("Training from scratch\n") is None

"""verl's own checkpoint loaders, with verl_plugins/checked_load.py imported as verl's workers and
trainer import it: a crafted file is refused in the loading process, at the load, whatever path
or world size it has; a whole one loads as before (docs/reliability.md, "What survives what": a
file swapped after the launcher's scan).

The real loaders run here: FSDPCheckpointManager.load_checkpoint (each worker's shards) and the v1
trainer's _load_checkpoint (data.pt), with only verl's remote worker groups stood in for. That a
real launch's worker loads through this check: tests/test_train_cpu.py (the kill test, its last
launch held at the actor worker's first load); no real launch is given a crafted file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from crafted_shards import KINDS
from crafted_shards import plant as plant_crafted
from omegaconf import OmegaConf

import verl_gsm8k.verl_plugins.checked_load  # noqa: F401  (wraps verl's loaders, as in verl)
from verl_gsm8k.common.checkpoint_files import ShardError
from verl_gsm8k.launch.outcome import refused_load, verdict


class _Planted:
    """A pickle that runs a command when loaded: what a swapped-in shard could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rng": _Planted(marker), "lr_scheduler": None}, path)
    return path


@pytest.fixture(scope="module")
def single_process_group(tmp_path_factory):
    """verl's checkpoint manager reads its rank and world size from torch.distributed. A file
    rendezvous, not a port: pytest-xdist may run this module's tests in two workers at once."""
    if not torch.distributed.is_initialized():
        store = tmp_path_factory.mktemp("gloo") / "store"
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0,
                                             world_size=1)  # fmt: skip
    yield


def manager(load: list[str]):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    model = torch.nn.Linear(4, 4)
    return FSDPCheckpointManager(model, torch.optim.AdamW(model.parameters()), None, None,
                                 {"load_contents": load, "save_contents": load})  # fmt: skip


def test_a_worker_refuses_a_planted_shard_at_its_load(tmp_path, single_process_group):
    marker = tmp_path / "ran"
    role = tmp_path / "global_step_3" / "actor"
    shard = plant(role / "extra_state_world_size_1_rank_0.pt", marker)
    with pytest.raises(ShardError) as err:
        manager(["extra"]).load_checkpoint(str(role))
    assert not marker.exists(), "the planted pickle ran inside verl's load"
    said = str(err.value)
    assert said.startswith(f"checked load: refused to load {shard}: its pickle names the global ")
    assert "system" in said and "\n" not in said
    assert torch.load is not None and not hasattr(torch.load, "_gsm8k_checked")  # only inside


def test_a_worker_loads_a_whole_checkpoint_of_any_world_size_as_before(
    tmp_path, single_process_group
):
    role = tmp_path / "global_step_3" / "actor"
    role.mkdir(parents=True)
    saved = manager(["model", "optimizer", "extra"])
    torch.nn.init.constant_(saved.model.weight, 0.5)
    torch.save(saved.model.state_dict(), role / "model_world_size_1_rank_0.pt")
    torch.save(saved.optimizer.state_dict(), role / "optim_world_size_1_rank_0.pt")
    rng = {"cpu": torch.get_rng_state(), "numpy": __import__("numpy").random.get_state(),
           "random": __import__("random").getstate()}  # fmt: skip
    torch.save({"rng": rng, "lr_scheduler": None}, role / "extra_state_world_size_1_rank_0.pt")
    loaded = manager(["model", "optimizer", "extra"])
    loaded.load_checkpoint(str(role))
    assert torch.equal(loaded.model.weight, saved.model.weight)
    # a truncated shard is refused at the load by name, not with torch's traceback
    shard = role / "optim_world_size_1_rank_0.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ShardError, match=f"checked load: shard {shard} is truncated"):
        manager(["model", "optimizer", "extra"]).load_checkpoint(str(role))


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_refuses_each_crafted_shard_at_its_load(tmp_path, single_process_group, kind):
    """verl's own FSDPCheckpointManager.load_checkpoint on a real model shard made into each
    crafted kind (tests/crafted_shards.py: two archives glued, one prepended or appended, a
    pickle payload): refused at the load in one line, nothing run."""
    marker = tmp_path / "ran"
    role = tmp_path / "global_step_3" / "actor"
    role.mkdir(parents=True)
    shard = role / "model_world_size_1_rank_0.pt"
    torch.save(manager(["model"]).model.state_dict(), shard)
    plant_crafted(kind, shard, marker)
    with pytest.raises(ShardError) as err:
        manager(["model"]).load_checkpoint(str(role))
    said = str(err.value)
    assert said.startswith("checked load: ") and str(shard) in said and "\n" not in said, said
    assert not marker.exists(), "the crafted shard ran inside verl's load"


class _Loader:
    def __init__(self) -> None:
        self.state = None

    def load_state_dict(self, state) -> None:
        self.state = state


class _Group:
    def __init__(self) -> None:
        self.loaded: list[str] = []

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self.loaded.append(local_path)


def trainer_resuming(step_dir: Path):
    """verl's v1 sync trainer (the recipes' trainer inherits its _load_checkpoint), resuming from
    trainer.resume_from_path, which the launcher never reads; its worker groups stood in for."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    trainer = PPOTrainerSync.__new__(PPOTrainerSync)
    trainer.config = OmegaConf.create({"trainer": {
        "resume_mode": "resume_path", "resume_from_path": str(step_dir),
        "del_local_ckpt_after_load": False}})  # fmt: skip
    trainer.actor_rollout_wg, trainer.use_critic = _Group(), False
    trainer.train_dataloader, trainer.trainer_mode = _Loader(), "sync"
    return trainer


def test_the_trainer_refuses_a_planted_data_pt_on_resume_from_path(tmp_path):
    marker = tmp_path / "ran"
    step_dir = tmp_path / "elsewhere" / "global_step_5"
    plant(step_dir / "data.pt", marker)
    trainer = trainer_resuming(step_dir)
    with pytest.raises(ShardError, match=f"checked load: refused to load {step_dir / 'data.pt'}"):
        trainer._load_checkpoint()
    assert not marker.exists() and trainer.train_dataloader.state is None
    # a whole one: loaded as verl loads it
    torch.save({"epoch": 0, "batch": 3}, step_dir / "data.pt")
    trainer = trainer_resuming(step_dir)
    trainer._load_checkpoint()
    assert trainer.train_dataloader.state == {"epoch": 0, "batch": 3}
    assert trainer.global_steps == 5
    assert trainer.actor_rollout_wg.loaded == [str(step_dir / "actor")]


def test_every_loader_verl_runs_is_wrapped_where_it_is_imported():
    """The legacy trainer (the LoRA recipe) and the SFT trainer's handler: wrapped the same way,
    in a fresh process that imports the plugin first, as verl's processes do."""
    code = (
        "import verl_gsm8k.verl_plugins.checked_load\n"
        "from verl.trainer.ppo.ray_trainer import RayPPOTrainer\n"
        "from verl.utils.checkpoint.checkpoint_handler import CheckpointHandler\n"
        "from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager\n"
        "from verl.trainer.ppo.v1.trainer_base import PPOTrainer\n"
        "for f in (RayPPOTrainer._load_checkpoint, CheckpointHandler.load_checkpoint,\n"
        "          FSDPCheckpointManager.load_checkpoint, PPOTrainer._load_checkpoint):\n"
        "    print(f.__qualname__, getattr(f, '_gsm8k_checking', False))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    wrapped = dict(line.rsplit(" ", 1) for line in out.stdout.splitlines())
    assert set(wrapped.values()) == {"True"}, wrapped


def test_the_launcher_names_the_refused_file_in_one_line(tmp_path):
    stamp = "20261126T000000Z"
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"console-{stamp}.log").write_text(
        "ray.exceptions.RayTaskError(ShardError): ray::WorkerDict.actor_rollout_load_checkpoint()\n"
        "verl_gsm8k.common.checkpoint_files.ShardError: checked load: refused to load "
        "/r/global_step_8/actor/model_world_size_1_rank_0.pt: its pickle names the global "
        "posix.system, which no verl checkpoint holds\n"
    )
    status, lines = verdict(tmp_path, stamp, 1, stopped=False)
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith("recipe: verl stopped at its checkpoint load: refused to load /r/")
    assert "posix.system" in lines[0] and "\n" not in lines[0]
    assert refused_load("Training from scratch\n") is None

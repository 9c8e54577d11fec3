"""A step's FSDP shards rewritten for another world size (verl loads only its own:
fsdp_checkpoint_manager.py ~213-240): each DTensor joined into its full tensor, cut for W' ranks on
the 1-D mesh verl builds; the rest from rank 0, new rank r gets old rank r % W's RNG. New files
under a temporary name, then renamed, fsdp_config.json last: a stop at any moment leaves the W
checkpoint whole."""

import os
import time
from pathlib import Path
from typing import Any

from verl_gsm8k.common import run_dir as rd
from verl_gsm8k.common.checkpoint_files import ShardError, load

PROG = "reshard"  # how its lines start, from the launch or its own command
_PARTIAL = ".reshard-"  # a new shard being written: .<name>.reshard-<pid>


class ReshardError(Exception):
    """A role directory that cannot be resharded; the message is the one line to say."""


def shard_path(role_dir: Path, kind: str, world_size: int, rank: int) -> Path:
    return role_dir / rd.shard_name(kind, world_size, rank)


def world_size_of(role_dir: Path) -> int:
    """The world size ``fsdp_config.json`` names (the files that are the checkpoint)."""
    try:
        return rd.read_world_size(role_dir)
    except rd.FsdpConfigError as error:
        raise ReshardError(str(error)) from None


def _new_mesh(saved: Any, world: int, rank: int) -> Any:
    """Rank ``rank``'s mesh of a W'-rank FSDP run, built without a process group; the saved
    mesh's group name kept (a 1-D mesh over every rank uses the default group, whatever W)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    if saved.ndim != 1:
        raise ReshardError(f"a {saved.ndim}-D device mesh: only FSDP's 1-D mesh is resharded")
    mesh = DeviceMesh(saved.device_type, torch.arange(world), mesh_dim_names=saved.mesh_dim_names,
                      _init_backend=False, _rank=rank)  # fmt: skip
    if hasattr(saved, "_dim_group_names"):
        mesh._dim_group_names = list(saved._dim_group_names)
    return mesh


def _where(shape: Any, mesh: Any, placements: Any) -> tuple[slice, ...]:
    """The part of the full tensor that ``mesh``'s rank holds (DTensor's own rule)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    sizes, offsets = compute_local_shape_and_global_offset(shape, mesh, placements)
    return tuple(slice(o, o + n) for n, o in zip(sizes, offsets, strict=True))


def _full(parts: list[Any], name: str) -> Any:
    """The full tensor from the old ranks' DTensors of one entry."""
    import torch
    from torch.distributed.tensor import Replicate, Shard

    first = parts[0]
    if len(first.placements) != 1 or not isinstance(first.placements[0], (Shard, Replicate)):
        raise ReshardError(f"{name}: placement {first.placements} is not FSDP's Shard(dim)")
    full = torch.empty(first.shape, dtype=first.dtype)
    covered = torch.zeros(first.shape, dtype=torch.bool)
    for part in parts:
        if part.shape != first.shape or part.placements != first.placements:
            raise ReshardError(f"{name}: the ranks disagree on its shape or placement")
        where = _where(part.shape, part.device_mesh, part.placements)
        full[where] = part.to_local().to("cpu")
        covered[where] = True
    if not bool(covered.all()):
        raise ReshardError(f"{name}: the ranks' shards do not cover the whole tensor")
    return full


def _cut(value: Any, olds: list[Any], rank: int, meshes: list[Any], name: str) -> Any:
    """Entry ``name`` of new rank ``rank``'s state dict, from the old ranks' ``olds``."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    if isinstance(value, dict):
        return {key: _cut(item, [old[key] for old in olds], rank, meshes, f"{name}.{key}")
                for key, item in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_cut(item, [old[i] for old in olds], rank, meshes, f"{name}[{i}]")
                for i, item in enumerate(value)]  # fmt: skip
    if isinstance(value, DTensor):
        full = _full(olds, name)
        mesh = meshes[rank]
        local = full[_where(full.shape, mesh, value.placements)].clone()  # its own storage
        meta = TensorMeta(full.shape, full.stride(), full.dtype)
        spec = DTensorSpec(mesh, value.placements, tensor_meta=meta)
        return DTensor(local, spec, requires_grad=value.requires_grad)
    if isinstance(value, torch.Tensor):
        return value.clone()  # AdamW's step: the same on every rank
    return value  # param_groups' numbers and names, the scheduler's state


def _write(path: Path, state: Any) -> None:
    """``torch.save`` to a temporary name, then renamed to ``path``."""
    import torch

    partial = path.with_name(f".{path.name}{_PARTIAL}{os.getpid()}")
    try:
        torch.save(state, partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_shards(role_dir: Path, new_world: int) -> int:
    """``role_dir`` written for ``new_world`` ranks beside its own; its old world size."""
    old_world = world_size_of(role_dir)
    if new_world < 1:
        raise ReshardError(f"world size {new_world}: not a number of ranks")
    for leftover in role_dir.glob(f".*{_PARTIAL}*"):  # a reshard stopped mid-write
        leftover.unlink(missing_ok=True)
    if old_world == new_world:
        return old_world
    from torch.distributed.tensor import DTensor

    meshes: list[Any] = []
    for kind in ("model", "optim", "extra_state"):
        if kind != "model" and not shard_path(role_dir, kind, old_world, 0).exists():
            continue  # saved without it (checkpoint.save_contents)
        olds = [load(shard_path(role_dir, kind, old_world, r), mmap=True) for r in range(old_world)]
        if not meshes:  # the new ranks' meshes, modelled on the model's first DTensor
            values = olds[0].values() if isinstance(olds[0], dict) else []
            first = next((v for v in values if isinstance(v, DTensor)), None)
            if first is None:
                raise ReshardError(f"{shard_path(role_dir, kind, old_world, 0)} holds no DTensor")
            meshes = [_new_mesh(first.device_mesh, new_world, r) for r in range(new_world)]
        for rank in range(new_world):  # one new rank's shard in memory at a time
            if kind == "extra_state":  # the scheduler: the same on every rank; r % W's RNG
                new = dict(olds[0])
                new.update((k, v) for k, v in olds[rank % old_world].items() if k == "rng")
            else:
                new = _cut(olds[0], olds, rank, meshes, kind)
            _write(shard_path(role_dir, kind, new_world, rank), new)
        del olds
    return old_world


def reshard_step(folder: Path, new_world: int) -> list[str]:
    """Every role of step directory ``folder`` resharded for ``new_world`` ranks; the lines to
    say. Every role is written before any is named: a failure leaves the step as saved."""
    started = time.monotonic()
    try:
        moved = {role: write_shards(folder / role, new_world) for role in rd.ROLES
                 if (folder / role).is_dir()}  # fmt: skip
    except ShardError as error:
        raise ReshardError(str(error)) from None
    said = []
    for role, old in moved.items():
        if old == new_world:
            continue
        rd.write_world_size(folder / role, new_world)  # names the new files the checkpoint
        said.append(f"{PROG}: {folder.name}/{role} was saved at world size {old}: rewritten for "
                    f"{new_world} (weights, optimizer, scheduler and RNG states; the files of "
                    f"world size {old} kept beside)")  # fmt: skip
    if said:
        said.append(f"{PROG}: {folder.name} resharded in {time.monotonic() - started:.0f} s")
    return said

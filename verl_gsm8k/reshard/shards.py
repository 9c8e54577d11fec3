"""A step's FSDP shards rewritten for another world size: each role's (``actor/``, ``critic/``)
new files written beside its own (``write_shards``), then named the checkpoint (``commit``) once
every role's are written (``reshard_step``, which the launch and ``python -m verl_gsm8k.reshard``
call).

verl 0.9.1's FSDPCheckpointManager saves, on every rank r of W, ``torch.save`` of that rank's
sharded state dicts: ``model_world_size_W_rank_r.pt`` (parameter name -> DTensor),
``optim_world_size_W_rank_r.pt`` (AdamW's ``state``, exp_avg and exp_avg_sq as DTensors, and
``param_groups``) and ``extra_state_world_size_W_rank_r.pt`` (the lr scheduler and the rank's RNG
states); its loader opens only the files of its own world size
(utils/checkpoint/fsdp_checkpoint_manager.py, ``load_checkpoint``, ~213-240).

Every DTensor of the W files is joined into its full tensor (each rank's local tensor placed
where DTensor's own rule puts it, ``compute_local_shape_and_global_offset``: ``torch.chunk``
along the sharded dim, trailing ranks possibly empty), then cut the same way for W' ranks and
saved as a DTensor on the device mesh verl builds at W' (a 1-D mesh named as the saved one,
``init_device_mesh(device, (W',))``). Everything else (AdamW's ``step``, ``param_groups``, the
scheduler) is the same on every rank and is taken from rank 0; new rank r gets the RNG states of
old rank ``r % W``. The result loads with verl's own loader at W' and holds the same full tensors,
bit for bit (tests/test_reshard.py).

The old files are only read (memory-mapped); the new ones are written one rank at a time (one
new rank's shard in memory), each to a temporary name and renamed into place, and
``fsdp_config.json``, whose ``world_size`` says which files are the checkpoint (verl's merger and
this repository's checks read it), is rewritten last: a reshard stopped at any moment leaves the
checkpoint of world size W whole and named, and running it again finishes it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from verl_gsm8k.common.checkpoint_files import ShardError, load
from verl_gsm8k.common.run_dir import (
    ROLES,
    SHARD_NAME,
    FsdpConfigError,
    read_world_size,
    shard_name,
    write_world_size,
)

PROG = "reshard"  # how its lines start, from the launch or its own command
_PARTIAL = ".reshard-"  # a new shard being written: .<name>.reshard-<pid>


class ReshardError(Exception):
    """A role directory that cannot be resharded; the message is the one line to say."""


def shard_path(role_dir: Path, kind: str, world_size: int, rank: int) -> Path:
    return Path(role_dir) / shard_name(kind, world_size, rank)


def world_size_of(role_dir: Path) -> int:
    """The world size ``fsdp_config.json`` names (the files that are the checkpoint)."""
    try:
        return read_world_size(Path(role_dir))
    except FsdpConfigError as error:
        raise ReshardError(str(error)) from None


def _load(path: Path) -> Any:
    if not path.is_file():
        raise ReshardError(f"missing {path.name} in {path.parent}")
    try:  # checked, then loaded memory-mapped by torch's weights-only unpickler
        return load(path, mmap=True)
    except ShardError as error:
        raise ReshardError(str(error)) from None
    except Exception as error:  # torch raises several types on what the checks let through
        raise ReshardError(f"{path} does not load ({type(error).__name__}: {error})") from None


def _new_mesh(saved: Any, world: int, rank: int) -> Any:
    """The device mesh rank ``rank`` of a W'-rank FSDP run holds, built without a process group
    (``_init_backend=False``). A 1-D mesh over every rank uses the default group, whose name does
    not depend on the world size: the saved mesh's group name is kept so that the DTensors still
    find their group once loaded."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    if saved.ndim != 1:
        raise ReshardError(
            f"a {saved.ndim}-D device mesh ({saved}): only FSDP's 1-D mesh is resharded"
        )
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


def _meshes(state: Any, world: int) -> list[Any] | None:
    """The new ranks' meshes, modelled on the first DTensor of ``state`` (None: it has none)."""
    from torch.distributed.tensor import DTensor

    stack = [state]
    while stack:
        item = stack.pop()
        if isinstance(item, DTensor):
            return [_new_mesh(item.device_mesh, world, rank) for rank in range(world)]
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


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
    """Write ``role_dir``'s checkpoint for ``new_world`` ranks beside its own (see the module
    docstring; ``commit`` then names them); the world size it has. ReshardError names the first
    file that fails."""

    role_dir = Path(role_dir)
    old_world = world_size_of(role_dir)
    if new_world < 1:
        raise ReshardError(f"world size {new_world}: not a number of ranks")
    for leftover in role_dir.glob(f".*{_PARTIAL}*"):  # a reshard stopped mid-write
        leftover.unlink(missing_ok=True)
    if old_world == new_world:
        return old_world
    quiet = logging.getLogger("torch.distributed.device_mesh")
    level = quiet.level  # its warning on every load is about torch.compile's group lookup
    quiet.setLevel(logging.ERROR)
    try:
        meshes: list[Any] | None = None
        for kind in ("model", "optim"):
            if kind == "optim" and not shard_path(role_dir, kind, old_world, 0).exists():
                continue  # saved without the optimizer (checkpoint.save_contents)
            olds = [_load(shard_path(role_dir, kind, old_world, r)) for r in range(old_world)]
            meshes = meshes or _meshes(olds[0], new_world)
            if meshes is None:
                raise ReshardError(f"{shard_path(role_dir, kind, old_world, 0)} holds no DTensor")
            for rank in range(new_world):
                state = _cut(olds[0], olds, rank, meshes, kind)
                _write(shard_path(role_dir, kind, new_world, rank), state)
                del state
            del olds
        if shard_path(role_dir, "extra_state", old_world, 0).exists():
            extras = [_load(shard_path(role_dir, "extra_state", old_world, r))
                      for r in range(old_world)]  # fmt: skip
            for rank in range(new_world):
                extra = dict(extras[0])  # the scheduler: the same on every rank
                if "rng" in extras[rank % old_world]:
                    extra["rng"] = extras[rank % old_world]["rng"]
                _write(shard_path(role_dir, "extra_state", new_world, rank), extra)
    finally:
        quiet.setLevel(level)
    return old_world


def commit(role_dir: Path, new_world: int) -> None:
    """Name the files of ``new_world`` the checkpoint: ``fsdp_config.json`` rewritten atomically."""
    write_world_size(Path(role_dir), new_world)


def shard_files(role_dir: Path) -> dict[int, list[Path]]:
    """world size -> the shard files of that world size in ``role_dir``."""
    found: dict[int, list[Path]] = {}
    for path in sorted(Path(role_dir).iterdir()):
        match = SHARD_NAME.fullmatch(path.name)
        if match:
            found.setdefault(int(match.group(2)), []).append(path)
    return found


def reshard_step(folder: Path, new_world: int) -> list[str]:
    """Reshard every role of the step directory ``folder`` for ``new_world`` ranks; the lines
    to say (none when every role is at ``new_world`` already). Every role's new files are
    written before any is named the checkpoint: a failure leaves the step as it was saved.
    ReshardError as shards.py."""
    started = time.monotonic()
    moved = {}
    for role in ROLES:
        if (folder / role).is_dir():
            old = write_shards(folder / role, new_world)
            if old != new_world:
                moved[role] = old
    said = []
    for role, old in moved.items():
        commit(folder / role, new_world)
        kept = ", ".join(str(w) for w in sorted(shard_files(folder / role)) if w != new_world)
        said.append(
            f"{PROG}: {folder.name}/{role} was saved at world size {old}: rewritten for "
            f"{new_world} (weights, optimizer, scheduler and RNG states; the files of world size "
            f"{kept} kept beside)"
        )
    if said:
        said.append(f"{PROG}: {folder.name} resharded in {time.monotonic() - started:.0f} s")
    return said

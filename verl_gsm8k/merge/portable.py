"""A verl FSDP checkpoint written by another torch: read version-independently, then merged.

verl's FSDP2 checkpoints ``torch.save`` each rank's state dict of DTensors, and a DTensor pickles
its device mesh with torch's private layout classes (``torch.distributed._mesh_layout``), which
change between releases: a checkpoint of the GPU stack (torch 2.11) fails under the CPU stack
(torch 2.13) with ``Can't get attribute '_FlatLayout'``, and the other way round with
``'_MeshLayout' object has no attribute 'axes'``. Nothing of the mesh is needed to merge: each
rank's local tensor and its placement (``Shard(dim)`` or ``Replicate``) are enough.

So, when the torch that wrote a checkpoint (the run's launch record, ``RUN_DIR/launches/``) is not
this environment's, or when rank 0 does not load here, the shards are read with ``torch.load`` and
an unpickler that stands simple records in for exactly the DTensor and device-mesh classes
(``DTENSOR_GLOBALS``) and refuses every global the one allow-list does not hold (both in
common/checkpoint_files.py, which checks each file before it is read; every other class is
torch's own, and storages load as usual). The full tensors (shards joined
along their placement's dim, in rank order) are written as one plain world-size-1 shard in a
temporary copy of the checkpoint, which verl's own merger then merges like any other. torch
itself is not patched. A layout this cannot read (a 2-D mesh, a partial placement) stops before
verl's merger with one line naming both torch versions and where to merge instead.
"""

from __future__ import annotations

import pickle
import shutil
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_gsm8k.common import json_read
from verl_gsm8k.common.checkpoint_files import (
    DTENSOR_GLOBALS,
    CheckedUnpickler,
    ShardError,
    UnsafeGlobal,
    allowed,
    load,
    load_standing_in,
)
from verl_gsm8k.common.run_dir import metrics_path, shard_name, step_of, write_world_size


class PortableError(Exception):
    """A checkpoint this reader cannot turn into plain tensors: one line for the user."""


def _as_dict(state: Any) -> dict[str, Any]:
    """A pickled object state as one dict: a dict, or a (dict, slots) pair, or anything else."""
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict | type(None)):
        return {**(state[0] or {}), **(state[1] or {})}
    return state if isinstance(state, dict) else {"value": state}


class Record:
    """Whatever a stood-in class was built from: constructor arguments and pickled state.
    (Pickle builds most of them with ``cls.__new__`` and ``__setstate__``, never ``__init__``.)"""

    kind = "record"
    args: tuple = ()
    state: dict[str, Any] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.state = args, dict(kwargs)

    def __setstate__(self, state: Any) -> None:
        self.state = _as_dict(state)

    def get(self, name: str, default: Any = None) -> Any:
        return self.state.get(name, default)


def _record_type(name: str) -> type[Record]:
    return type(name, (Record,), {"kind": name})


class LocalShard:
    """One rank's piece of a DTensor: its local tensor and its placements."""

    def __init__(self, local: Any, spec: Any) -> None:
        self.local = local
        placements = spec.get("placements") if isinstance(spec, Record) else None
        self.placements = tuple(placements or ())


def _rebuild_from_type(func: Callable, new_type: Any, args: tuple, state: Any) -> Any:
    """torch._tensor._rebuild_from_type_v2, for a stood-in DTensor: its local shard."""
    if isinstance(new_type, type) and issubclass(new_type, Record):
        fields = _as_dict(state)
        return LocalShard(fields.get("_local_tensor"), fields.get("_spec"))
    import torch._tensor

    return torch._tensor._rebuild_from_type_v2(func, new_type, args, state)


def _rebuild_wrapper(cls: Any, *args: Any) -> Any:
    """torch._utils._rebuild_wrapper_subclass, for a stood-in class: nothing to build yet."""
    if isinstance(cls, type) and issubclass(cls, Record):
        return None
    import torch._utils

    return torch._utils._rebuild_wrapper_subclass(cls, *args)


class _Unpickler(CheckedUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not allowed(module, name):
            raise UnsafeGlobal(f"{module}.{name}")
        if (module, name) in DTENSOR_GLOBALS:
            return _record_type(name)
        if (module, name) == ("torch._tensor", "_rebuild_from_type_v2"):
            return _rebuild_from_type
        if (module, name) == ("torch._utils", "_rebuild_wrapper_subclass"):
            return _rebuild_wrapper
        return super().find_class(module, name)


# torch.load(pickle_module=...) asks the module for Unpickler (and load); nothing else changes.
PICKLE_MODULE = types.SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="portable")


def load_shard(path: Path) -> dict[str, Any]:
    try:
        return load_standing_in(path, PICKLE_MODULE)
    except ShardError as err:
        raise PortableError(str(err)) from None
    except UnsafeGlobal as err:
        raise PortableError(f"{path}: refused to load, its pickle names the global {err}") from None


def _placement(shard: LocalShard, key: str) -> int | None:
    """The dim a 1-D FSDP placement shards along, or None for Replicate."""
    if len(shard.placements) != 1:
        raise PortableError(f"{key}: a {len(shard.placements)}-D device mesh (only FSDP's 1-D)")
    placement = shard.placements[0]
    kind = getattr(placement, "kind", "")
    if kind == "Replicate":
        return None
    if kind == "Shard":
        return int(placement.get("dim", 0))
    raise PortableError(
        f"{key}: placement {kind or type(placement).__name__} (Shard/Replicate only)"
    )


def full_state_dict(role_dir: Path, world_size: int) -> dict[str, Any]:
    """Every rank's shards joined into full tensors (the merger's own rule: rank order)."""
    import torch

    ranks = [load_shard(role_dir / shard_name("model", world_size, r)) for r in range(world_size)]
    full: dict[str, Any] = {}
    for key in ranks[0]:
        pieces = [rank[key] for rank in ranks]
        if not all(isinstance(p, LocalShard) for p in pieces):
            full[key] = pieces[0]  # a plain tensor (a buffer): the same on every rank
            continue
        dim = _placement(pieces[0], key)
        locals_ = [p.local for p in pieces]
        full[key] = locals_[0] if dim is None else torch.cat(locals_, dim=dim).contiguous()
    return full


def rewrite_as_one_rank(role_dir: Path, world_size: int, out_dir: Path) -> Path:
    """A copy of the checkpoint in ``out_dir`` that any torch reads: one plain rank-0 shard
    (fsdp_config.json world_size 1) beside the original ``huggingface/`` and LoRA metadata."""
    import torch

    state = full_state_dict(role_dir, world_size)
    out_dir.mkdir(parents=True)
    torch.save(state, out_dir / shard_name("model", 1, 0))
    write_world_size(out_dir, 1, source=role_dir)
    shutil.copytree(role_dir / "huggingface", out_dir / "huggingface")
    for extra in role_dir.glob("lora_*.json"):
        shutil.copy2(extra, out_dir / extra.name)
    return out_dir


def _minor(version: str) -> tuple[int, ...]:
    """'2.11.0+cu130' -> (2, 11): the releases whose pickles agree."""
    parts = version.split("+")[0].split(".")[:2]
    return tuple(int(p) for p in parts if p.isdigit())


def torch_here() -> str:
    import torch

    return str(torch.__version__)


def written_by(run_dir: Path | None, step_dir: Path) -> str | None:
    """The torch version of the launch that wrote ``step_dir`` (the step directory of step N): the
    latest launch record whose metrics file (``metrics/metrics-<stamp>.jsonl``) logged a step at or
    before N, the only record when none did; None without records. Not folder modification times,
    which a copied run directory resets."""
    if run_dir is None:
        return None
    from verl_gsm8k.common.launch_record import RecordError, read_records

    try:
        records = read_records(run_dir)
    except RecordError:
        return None
    step = step_of(step_dir)

    def first_step(record: dict) -> int | None:
        path = metrics_path(run_dir, str(record.get("stamp")))
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            try:
                row = json_read.parse(line, str(path))
            except json_read.JsonError:
                continue
            value = row.get("step") if isinstance(row, dict) else None
            if isinstance(value, int):
                return value
        return None

    starts = [(first_step(r), r) for r in records]
    before = [r for first, r in starts if step is not None and first is not None and first <= step]
    if before:
        chosen = before[-1]
    elif len(records) == 1:
        chosen = records[0]
    else:
        return None
    version = (chosen.get("versions") or {}).get("torch")
    return str(version) if version else None


def loads_here(shard: Path) -> bool:
    """Whether this torch unpickles ``shard`` with the checked weights-only load
    (common/checkpoint_files.py), which takes DTensors and their mesh (torch 2.11 and 2.13)."""
    import logging

    # unpickling a DeviceMesh outside its process group warns on every load (harmless here)
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)
    try:
        load(shard, mmap=True)
    except Exception:  # any unpickling failure: a class or attribute this torch does not have
        return False
    finally:
        mesh_log.setLevel(level)
    return True


def needs_rewrite(
    role_dir: Path, world_size: int, run_dir: Path | None, step_dir: Path
) -> tuple[bool, str]:
    """(whether to read the checkpoint version-independently, why), by the recorded torch
    version, or without a record by trying rank 0 with this torch."""
    here = torch_here()
    wrote = written_by(run_dir, step_dir)
    if wrote is not None:
        if _minor(wrote) == _minor(here):
            return False, f"written by torch {wrote}, read by torch {here}"
        return True, f"written by torch {wrote} (launch record), this environment has torch {here}"
    if loads_here(role_dir / shard_name("model", world_size, 0)):
        return False, f"loads with torch {here} (no launch record names the torch that wrote it)"
    return True, f"does not load with torch {here} (no launch record names the torch that wrote it)"

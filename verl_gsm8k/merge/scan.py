"""The shards a merge will load, checked before anything loads them: whole, and safe to unpickle.

Whole: a torch.save file is a zip archive whose every record's CRC must match (``check_intact``).
Safe: every global its pickles name is one of ``portable.ALLOWED`` (``scan_shard``).

verl 0.9.1's merger reads each ``model_world_size_<W>_rank_<r>.pt`` of the role directory with
``torch.load(..., weights_only=False)`` (verl/model_merger/fsdp_model_merger.py ~108 rank 0 and
~168 every rank; it opens no other ``.pt``: the optimizer and extra-state shards and the
dataloader's ``data.pt`` are never read by a merge). That load imports and calls whatever a pickle
names, so a crafted shard in a shared run directory would run code at ``merge.sh`` or
``eval.sh --run``. So before verl's merger, and before any ``torch.load`` of ours
(merge/portable.py), every such shard is scanned here, and one global outside
``portable.ALLOWED`` (the one allow-list) refuses the merge with one line naming the file and the
global, nothing written.

The scan runs the standard library's own unpickler (the C one, which ``torch.load`` subclasses)
over the archive's pickles, with a ``find_class`` that checks each name and hands back an inert
stand-in instead of importing anything, and a ``persistent_load`` that reads no storage: every
GLOBAL, STACK_GLOBAL and INST is resolved by the same machine as in the real load, and nothing
real is ever called. A global whose name is not a literal of the pickle (a STACK_GLOBAL whose
operands come from a call) gets a stand-in where a string is needed and fails the scan: refused
too. The file must also be what ``torch.load`` reads as a zip (its first bytes, not only a zip
directory at its end, which a legacy pickle in front of it would pass) and not a TorchScript
archive (``constants.pkl``), which ``torch.load`` hands to ``torch.jit.load``.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

from verl_gsm8k.merge.portable import UnsafeGlobal, allowed

ZIP_MAGIC = b"PK\x03\x04"  # torch.serialization._is_zipfile: a torch.save file starts with it


class ShardError(Exception):
    """A shard that must not be loaded (damaged, or naming a global not allowed): one line
    naming the file and why."""


class _StandIn:
    """Whatever an allowed global would have built: accepts every call, item and state."""

    def __new__(cls, *_args: Any, **_kwargs: Any) -> _StandIn:
        return super().__new__(cls)

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def __call__(self, *_args: Any, **_kwargs: Any) -> _StandIn:
        return _StandIn()

    def __setstate__(self, _state: Any) -> None:
        pass

    def __setitem__(self, _key: Any, _value: Any) -> None:
        pass

    def append(self, _value: Any) -> None:
        pass

    def extend(self, _values: Any) -> None:
        pass


class _Scanner(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not allowed(module, name):
            raise UnsafeGlobal(f"{module}.{name}")
        return _StandIn  # a class, so that NEWOBJ (cls.__new__) works as on the real one

    def persistent_load(self, pid: Any) -> Any:
        return _StandIn()


def scan_shard(path: Path) -> None:
    """Raise ShardError unless every pickle of the torch.save file ``path`` names only allowed
    globals (reads its pickles, a few kB, never its tensors)."""
    with path.open("rb") as handle:
        scan_open(handle, path)


def scan_open(handle: BinaryIO, path: Path) -> None:
    """``scan_shard`` of the file open as ``handle`` (``path`` names it in the error): what a
    caller then loads from the same handle is what was scanned, whatever the path names by then."""
    handle.seek(0)
    if handle.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
        raise ShardError(f"refused to load {path}: it does not start as a torch zip archive "
                         "(torch.load would unpickle it as a legacy file)")  # fmt: skip
    try:
        with zipfile.ZipFile(handle) as archive:
            records = [(info.filename, archive.read(info)) for info in archive.infolist()
                       if info.filename.lower().endswith(".pkl")]  # fmt: skip
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise ShardError(f"refused to load {path}: not a readable zip archive ({err})") from None
    names = [name.lower().rsplit("/", 1)[-1] for name, _ in records]
    if "constants.pkl" in names:
        raise ShardError(f"refused to load {path}: a TorchScript archive, not a checkpoint")
    if "data.pkl" not in names:
        raise ShardError(f"refused to load {path}: it holds no data.pkl (not a torch.save file)")
    for name, data in records:
        try:
            _Scanner(io.BytesIO(data)).load()
        except UnsafeGlobal as err:
            raise ShardError(
                f"refused to load {path}: its pickle names the global {_shown(err)}, which no "
                "verl checkpoint holds"
            ) from None
        except Exception as err:  # anything the scan cannot follow is refused
            raise ShardError(
                f"refused to load {path}: its pickle {_shown(name)} cannot be checked "
                f"({_shown(err)})"
            ) from None


def _shown(value: object) -> str:
    """A name from the file, on one line and without terminal control characters."""
    text = str(value)
    return text if text.isprintable() else ascii(text)


def check_intact(shard: Path) -> None:
    """A torch.save file is a zip archive: its directory and every record's CRC must be intact
    (reads the shard once; a truncated or garbled one would stop verl's merger with a traceback)."""
    try:
        with shard.open("rb") as handle:
            intact_open(handle, shard)
    except OSError as err:
        raise ShardError(f"shard {shard} cannot be read ({err})") from None


def intact_open(handle: BinaryIO, shard: Path) -> None:
    """``check_intact`` of the file open as ``handle`` (``shard`` names it in the error)."""
    handle.seek(0)
    try:
        with zipfile.ZipFile(handle) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as err:
        raise ShardError(f"shard {shard} is truncated or not a torch checkpoint ({err})") from None
    if bad is not None:
        raise ShardError(f"shard {shard} is corrupt: its record {bad} fails its checksum")


def check_shards(role_dir: Path, world_size: int) -> None:
    """The ranks' shards whole, then every model shard of ``role_dir`` scanned: of any world size,
    as verl's merger takes their count from rank 0's device mesh, not only from fsdp_config.json
    (ShardError at the first one that fails)."""
    for rank in range(world_size):
        check_intact(role_dir / f"model_world_size_{world_size}_rank_{rank}.pt")
    for shard in sorted(role_dir.glob("model_world_size_*_rank_*.pt")):
        scan_shard(shard)

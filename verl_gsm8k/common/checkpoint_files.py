"""Every checkpoint file of a run directory is checked and loaded here, and nowhere else.

A run directory may come from a shared folder, and verl 0.9.1 loads every file of a checkpoint
with ``torch.load(..., weights_only=False)``, which imports and calls whatever a pickle names.
The one policy, for the merge, the resume, the reshard and verl's own loaders alike:

1. **One archive from byte 0** (``archive_records``): a ``torch.save`` file is a zip archive whose
   records start at byte 0 and follow each other, then its central directory, then its end
   records, which end the file. Every byte is accounted for, so there is no room for a second
   archive in front of it, behind it or inside its directory: Python's ``zipfile`` and torch's
   own reader (miniz, which ignores the offset shift that ``zipfile`` corrects for) then read the
   same records. A file glued from two archives, with data prepended or appended, or whose
   directory is not where its end record says, is refused.
2. **Whole**: every record's CRC-32 matches (torch's reader checks none of them), so a truncated
   or garbled file is one line, not a traceback at the load.
3. **Naming only allowed globals** (``scan``): every pickle of the archive, read through torch's own
   reader (the bytes ``torch.load`` unpickles), is run through the standard library's unpickler
   with a ``find_class`` that checks each name against ``ALLOWED`` and hands back an inert stand-in
   instead of importing anything; only the functions and value types of ``CALLED`` may be
   called (a DeviceMesh built by a call would start torch.distributed, a storage class called
   allocate what the file says). A global whose name is not a literal of the pickle gets a
   stand-in where a string is needed and fails the scan: refused too. A TorchScript archive
   (``constants.pkl``), which ``torch.load`` hands to ``torch.jit.load``, is refused, and so are
   an entry miniz would read no data for (a directory), names that differ only in case (miniz
   ignores it) and a pickle larger than ``MAX_PICKLE``.
4. **Loaded by torch's restricted unpickler** (``load``): ``torch.load(..., weights_only=True)``
   from the handle that was checked, with exactly the entries of ``ALLOWED`` that torch does not
   allow by default registered, numpy's names as the stand-ins of common/numpy_state.py, which
   rebuild numeric arrays only (numpy's own would take an object dtype's bytes as pointers).
   This is the enforcement: a file changed in place after its check still cannot run code.
   ``restricted_torch_load`` makes verl's own ``torch.load`` calls this load
   (verl_plugins/checked_load.py in verl's processes, merge/verl_merger.py in verl's merger).

Any failure is a ``ShardError`` with one line naming the file and why.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import stat
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from verl_gsm8k.common.numpy_state import NUMPY, CheckedArray, CheckedDtype, plain_arrays
from verl_gsm8k.common.pause import pause_point
from verl_gsm8k.common.terminal import clean as shown

# The classes a DTensor's pickle names (torch registers them for weights_only itself once
# torch.distributed.tensor is imported); merge/portable.py stands records in for them.
DTENSOR_GLOBALS = frozenset({
    ("torch.distributed.tensor", "DTensor"),
    ("torch.distributed._tensor.api", "DTensor"),
    ("torch.distributed.tensor._api", "DTensor"),
    ("torch.distributed.device_mesh", "DeviceMesh"),
    ("torch.distributed._mesh_layout", "_MeshLayout"),
    ("torch.distributed._mesh_layout", "_FlatLayout"),
    ("torch.distributed.tensor._dtensor_spec", "DTensorSpec"),
    ("torch.distributed.tensor._dtensor_spec", "TensorMeta"),
    ("torch.distributed.tensor._dtensor_spec", "ShardOrderEntry"),
    ("torch.distributed.tensor.placement_types", "Shard"),
    ("torch.distributed.tensor.placement_types", "_StridedShard"),
    ("torch.distributed.tensor.placement_types", "Replicate"),
    ("torch.distributed.tensor.placement_types", "Partial"),
})  # fmt: skip

# The globals a pickle may call (REDUCE, INST, OBJ): functions and value types. A class of
# DTENSOR_GLOBALS is only ever rebuilt (NEWOBJ, its state set), and a storage class only named:
# calling DeviceMesh(...) would start torch.distributed, torch.FloatStorage(n) allocate n floats.
CALLED = frozenset({
    ("collections", "OrderedDict"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_wrapper_subclass"),
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch.serialization", "_get_layout"),
    ("_codecs", "encode"),  # numpy arrays' bytes in extra_state (RNG states)
    ("numpy", "dtype"),  # numpy's names: read by NUMPY's checked stand-ins, never numpy's own
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
})  # fmt: skip

# Every global a verl checkpoint file names (read from the model, optim and extra_state shards
# and data.pt of real PPO, GRPO, LoRA, SFT and resharded runs under torch 2.13, and of shards the
# GPU stack's torch 2.11 wrote; each trainer's test loads its run's files through ``load``:
# tests/helpers.py, assert_loads_as_torch): anything else is refused.
ALLOWED = CALLED | {("numpy", "ndarray")} | DTENSOR_GLOBALS
MAX_PICKLE = 64 << 20  # a checkpoint's data.pkl holds its structure, not its tensors: megabytes

MAX_DIRECTORY = 64 << 20  # a central directory larger than this is not a checkpoint's
_CHUNK = 1 << 20

# zip structures (APPNOTE.TXT): signatures and fixed sizes
_LOCAL, _CENTRAL, _DESCRIPTOR = b"PK\x03\x04", b"PK\x01\x02", b"PK\x07\x08"
_END, _END64, _LOCATOR = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"
_END_SIZE, _LOCATOR_SIZE, _END64_SIZE = 22, 20, 56
_U32, _U16 = 0xFFFFFFFF, 0xFFFF


class ShardError(Exception):
    """A checkpoint file that must not be loaded: one line naming the file and why."""


class UnsafeGlobal(Exception):
    """A pickle names a global no verl checkpoint holds: refused before it is imported."""


def allowed(module: str, name: str) -> bool:
    """True for the globals of ``ALLOWED``, a tensor storage class or a dtype of ``torch``."""
    if (module, name) in ALLOWED:
        return True
    if module == "torch" and name.endswith("Storage") and name.isidentifier():
        return True
    if module == "torch" and name.isidentifier() and not name.startswith("_"):
        import torch

        return isinstance(getattr(torch, name, None), torch.dtype)
    return False


# --- 1. one archive from byte 0 ------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    name: str
    start: int  # first byte of its data
    size: int
    crc: int


class _Truncated(ValueError):
    """No zip end record where the file ends: cut short (a kill mid-save), or not a zip."""


def _read_at(handle: BinaryIO, offset: int, size: int) -> bytes:
    handle.seek(offset)
    data = handle.read(size)
    if len(data) != size:
        raise _Truncated(f"it ends at byte {offset + len(data)}, inside a zip structure")
    return data


def _zip64_sizes(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    """The sizes and offset a central entry stores as 0xFFFFFFFF, from its zip64 extra field."""
    at = 0
    while at + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, at)
        body = extra[at + 4 : at + 4 + length]
        if kind == 1:
            values = [usize, csize, offset]
            fields = iter(struct.unpack_from(f"<{len(body) // 8}Q", body))
            for i, value in enumerate(values):
                if value == _U32:
                    values[i] = next(fields, -1)
            if -1 in values:
                raise ValueError("a zip64 field is missing")
            return values[0], values[1], values[2]
        at += 4 + length
    if _U32 in (usize, csize, offset):
        raise ValueError("a zip64 size without its extra field")
    return usize, csize, offset


def _end_records(handle: BinaryIO, size: int) -> tuple[int, int, int]:
    """(entries, directory offset, directory end) from the end records, which must end the file."""
    if size < _END_SIZE:
        raise _Truncated(f"{size} bytes, too short for a zip archive")
    end = _read_at(handle, size - _END_SIZE, _END_SIZE)
    sig, disk, cd_disk, here, entries, cd_size, cd_offset, comment = struct.unpack("<4s4H2LH", end)
    if sig != _END or comment != 0:
        raise _Truncated("its last 22 bytes are no zip end record")
    directory_end = size - _END_SIZE
    locator_at = size - _END_SIZE - _LOCATOR_SIZE
    if locator_at >= 0 and _read_at(handle, locator_at, 4) == _LOCATOR:
        _, disk64, end64_at, disks = struct.unpack("<4sLQL", _read_at(handle, locator_at, 20))
        if disk64 != 0 or disks != 1 or end64_at + _END64_SIZE != locator_at:
            raise ValueError("its zip64 end record is not right before its locator")
        fields = struct.unpack("<4sQ2H2L4Q", _read_at(handle, end64_at, _END64_SIZE))
        sig64, rest, _, _, disk, cd_disk, here, entries, cd_size, cd_offset = fields
        if sig64 != _END64 or rest != _END64_SIZE - 12:
            raise ValueError("its zip64 end record is malformed")
        directory_end = end64_at
    if disk != 0 or cd_disk != 0 or here != entries:
        raise ValueError("a multi-disk zip archive")
    if cd_offset + cd_size != directory_end:
        raise ValueError(
            f"its central directory ends at byte {cd_offset + cd_size}, not at its end record "
            f"(byte {directory_end}): another archive or data is glued to it"
        )
    if cd_size > MAX_DIRECTORY or entries * 46 > cd_size:
        raise ValueError(f"a central directory of {cd_size} bytes for {entries} records")
    return entries, cd_offset, directory_end


def _central(handle: BinaryIO, entries: int, cd_offset: int, cd_end: int) -> list[tuple]:
    directory = _read_at(handle, cd_offset, cd_end - cd_offset)
    found, at = [], 0
    for _ in range(entries):
        if directory[at : at + 4] != _CENTRAL or at + 46 > len(directory):
            raise ValueError("its central directory is malformed")
        (flags, method, crc, csize, usize, name_len, extra_len, comment_len, disk, attrs,
         offset) = struct.unpack_from("<8xHH4xLLLHHHH2xLL", directory, at)  # fmt: skip
        name = directory[at + 46 : at + 46 + name_len]
        extra = directory[at + 46 + name_len : at + 46 + name_len + extra_len]
        at += 46 + name_len + extra_len + comment_len
        usize, csize, offset = _zip64_sizes(extra, usize, csize, offset)
        if attrs & 0x10 or name.endswith(b"/") or not 0 < len(name) <= 255:
            raise ValueError(f"record {name[:60]!r} is a directory (miniz would read no data for "
                             "it), or its name is empty or over 255 bytes")  # fmt: skip
        if method != 0 or flags & 0x01 or csize != usize or disk not in (0, _U16):
            raise ValueError(f"record {name!r} is compressed, encrypted or split (torch.save "
                             "stores)")  # fmt: skip
        found.append((offset, name, flags, crc, usize))
    if at != len(directory):
        raise ValueError("its central directory holds more than its records")
    return sorted(found)


def archive_records(handle: BinaryIO, path: Path) -> list[Record]:
    """The records of the torch.save file open as ``handle``, proven to be one zip archive that
    fills the file from byte 0 to its end record (ShardError naming ``path`` otherwise)."""
    try:
        size = os.fstat(handle.fileno()).st_size
        entries, cd_offset, cd_end = _end_records(handle, size)
        records, names, at = [], set(), 0
        for offset, raw, flags, crc, length in _central(handle, entries, cd_offset, cd_end):
            if offset != at:
                raise ValueError(f"bytes {at}-{offset} belong to no record")
            head = _read_at(handle, offset, 30)
            sig, lflags, method, name_len, extra_len = struct.unpack("<4s2xHH16xHH", head)
            if sig != _LOCAL or lflags != flags or method != 0:
                raise ValueError(f"the local header at byte {offset} does not match its entry")
            if _read_at(handle, offset + 30, name_len) != raw or raw.lower() in names:
                raise ValueError(f"record {raw!r} is named twice (torch's reader ignores case) "
                                 "or differently")  # fmt: skip
            names.add(raw.lower())
            start = offset + 30 + name_len + extra_len
            at = start + length
            if flags & 0x08:  # a data descriptor follows the data
                at += _descriptor(handle, at, crc, length)
            records.append(Record(raw.decode("utf-8"), start, length, crc))
        if at != cd_offset:
            raise ValueError(f"bytes {at}-{cd_offset} before its central directory belong to no "
                             "record")  # fmt: skip
    except _Truncated as err:
        raise ShardError(f"shard {path} is truncated or not a torch checkpoint ({err})") from None
    except (ValueError, UnicodeDecodeError, struct.error, OSError) as err:
        raise ShardError(f"refused to load {path}: not one torch zip archive ({err})") from None
    if not records:
        raise ShardError(f"refused to load {path}: an empty zip archive")
    return records


def _descriptor(handle: BinaryIO, at: int, crc: int, length: int) -> int:
    """The size of the data descriptor at ``at`` (signature, CRC, 4- or 8-byte sizes)."""
    data = _read_at(handle, at, 16)
    if data[:4] == _DESCRIPTOR and data[4:16] == struct.pack("<3L", crc, length, length):
        return 16
    data = _read_at(handle, at, 24)
    if data[:4] == _DESCRIPTOR and data[4:24] == struct.pack("<L2Q", crc, length, length):
        return 24
    raise ValueError(f"the data descriptor at byte {at} does not match its entry")


# --- 2. whole ------------------------------------------------------------------------------


def check_crcs(handle: BinaryIO, path: Path, records: list[Record]) -> None:
    """Every record's CRC-32 (reads the whole file once, a MiB at a time)."""
    for record in records:
        handle.seek(record.start)
        crc, left = 0, record.size
        while left:
            chunk = handle.read(min(_CHUNK, left))
            if not chunk:
                raise ShardError(f"shard {path} is truncated (record {shown(record.name)})")
            crc, left = zlib.crc32(chunk, crc), left - len(chunk)
        if crc != record.crc:
            raise ShardError(
                f"shard {path} is corrupt: its record {shown(record.name)} fails its checksum"
            )


# --- 3. naming only allowed globals --------------------------------------------------------


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


class _Called(Exception):
    """A pickle calls a class that real checkpoints only rebuild or name."""


class _NotCalled(_StandIn):
    """A stand-in for a class a pickle may rebuild (NEWOBJ: ``__new__`` only) but not call."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        raise _Called(type(self).__name__)


class _Scanner(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not allowed(module, name):
            raise UnsafeGlobal(f"{module}.{name}")
        if (module, name) in CALLED:
            return _StandIn  # a class, so that NEWOBJ (cls.__new__) works as on the real one
        return type(f"{module}.{name}", (_NotCalled,), {})

    def persistent_load(self, pid: Any) -> Any:
        return _StandIn()


class CheckedUnpickler(pickle.Unpickler):
    """The default unpickler, refusing every global :func:`allowed` does not accept (for a reader
    that must stand its own classes in, as merge/portable.py does for another torch's files)."""

    def find_class(self, module: str, name: str) -> Any:
        if not allowed(module, name):
            raise UnsafeGlobal(f"{module}.{name}")
        if f"{module}.{name}" in NUMPY:
            return NUMPY[f"{module}.{name}"]
        return super().find_class(module, name)


def scan(handle: BinaryIO, path: Path, records: list[Record]) -> None:
    """Every pickle of the archive, read through torch's own zip reader, names only allowed
    globals; the records torch sees are the ones ``archive_records`` proved."""
    from torch.serialization import _open_zipfile_reader

    handle.seek(0)
    try:
        with _open_zipfile_reader(handle) as reader:
            names = reader.get_all_records()
            pickles = [(n, reader.get_record(n)) for n in names if n.lower().endswith(".pkl")]
    except (RuntimeError, UnicodeDecodeError) as err:
        raise ShardError(f"refused to load {path}: torch cannot read it ({shown(err)})") from None
    prefix = records[0].name.split("/", 1)[0] + "/"
    if sorted(names) != sorted(r.name.removeprefix(prefix) for r in records):
        raise ShardError(f"refused to load {path}: torch's reader sees other records than its "
                         "zip directory names")  # fmt: skip
    if "constants.pkl" in names:
        raise ShardError(f"refused to load {path}: a TorchScript archive, not a checkpoint")
    if "data.pkl" not in names:
        raise ShardError(f"refused to load {path}: it holds no data.pkl (not a torch.save file)")
    for name, data in pickles:
        try:
            _Scanner(io.BytesIO(data)).load()
        except UnsafeGlobal as err:
            raise ShardError(
                f"refused to load {path}: its pickle names the global {shown(err)}, which no "
                "verl checkpoint holds"
            ) from None
        except _Called as err:
            raise ShardError(
                f"refused to load {path}: its pickle calls {shown(err)}, which a verl checkpoint "
                "only rebuilds or names"
            ) from None
        except Exception as err:  # anything the scan cannot follow is refused
            raise ShardError(
                f"refused to load {path}: its pickle {shown(name)} cannot be checked ({shown(err)})"
            ) from None


def check_open(handle: BinaryIO, path: Path) -> None:
    """Steps 1-3 on the file open as ``handle``: what a caller then loads from the same handle is
    what was checked, whatever ``path`` names by then."""
    records = archive_records(handle, path)
    big = [r.name for r in records if r.name.lower().endswith(".pkl") and r.size > MAX_PICKLE]
    if big:
        raise ShardError(f"refused to load {path}: its pickle {shown(big[0])} is larger than "
                         f"{MAX_PICKLE} bytes, more than a checkpoint's structure")  # fmt: skip
    check_crcs(handle, path, records)
    scan(handle, path, records)


def check_file(path: Path) -> None:
    """``check_open`` of the file at ``path`` (ShardError, one line, when it cannot be read)."""
    try:
        with open_file(path) as handle:
            check_open(handle, path)
    except OSError as err:
        raise ShardError(f"shard {path} cannot be read ({shown(err)})") from None


@contextmanager
def open_file(path: Path) -> Iterator[BinaryIO]:
    """``path`` opened for reading: a regular file, never a directory, FIFO or device (opened
    without blocking, so that a FIFO cannot hold the reader)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except ValueError as err:  # a NUL byte in the path
        raise ShardError(f"refused to load {shown(path)}: {err}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ShardError(f"refused to load {path}: not a regular file")
    with os.fdopen(fd, "rb") as handle:
        yield handle


# --- 4. loaded by torch's restricted unpickler ---------------------------------------------


_REGISTERING = threading.Lock()


@functools.cache
def _register() -> None:
    """Register, for torch's weights-only unpickler in this process, the entries of ``ALLOWED``
    that it does not allow by default: numpy's names as the checked stand-ins of ``NUMPY``
    (once, for every thread: a ``safe_globals`` block per load would race between verl's
    merger's loading threads); the DTensor classes register themselves on import."""
    import torch
    import torch.distributed.tensor  # noqa: F401  (registers DTensor and the mesh classes)
    from torch import _weights_only_unpickler as restricted

    default = set(restricted._get_allowed_globals())
    missing = {f"{m}.{n}" for m, n in ALLOWED - DTENSOR_GLOBALS} - default - set(NUMPY)
    assert not missing, f"ALLOWED names no object for torch's loader: {sorted(missing)}"
    pairs: list[Any] = [(value, name) for name, value in NUMPY.items()]
    pairs += [CheckedDtype, CheckedArray]  # their state is set by the pickle (BUILD)
    torch.serialization.add_safe_globals(pairs)


def load(path: Path, *, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """The checkpoint file at ``path``, checked (``check_open``) and loaded from the same open
    file by ``torch.load(weights_only=True)`` with ``ALLOWED`` registered; ``mmap``: its tensors
    mapped from that file, not read (torch maps a path: the handle's own, /proc/self/fd/N)."""
    import torch

    try:
        with open_file(path) as handle:
            check_open(handle, path)
            handle.seek(0)
            source = f"/proc/self/fd/{handle.fileno()}" if mmap else handle
            with _REGISTERING:
                _register()
            loaded = torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)
    except ShardError:
        raise
    except pickle.UnpicklingError as err:
        raise ShardError(f"refused to load {path}: torch's weights-only loader refused it "
                         f"({_first_line(err)})") from None  # fmt: skip
    except OSError as err:
        raise ShardError(f"shard {path} cannot be read ({shown(err)})") from None
    except Exception as err:  # what torch raises on a file the checks let through
        raise ShardError(f"refused to load {path}: torch could not load it ({_first_line(err)})"
                         ) from None  # fmt: skip
    return plain_arrays(loaded)


def _first_line(err: BaseException) -> str:
    """The line of torch's message that says why (its weights-only error opens with advice)."""
    text = str(err).split("WeightsUnpickler error:", 1)[-1]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return shown((lines or [type(err).__name__])[0][:300])


def load_standing_in(path: Path, pickle_module: Any) -> Any:
    """The checkpoint file at ``path``, checked, then unpickled by ``pickle_module``'s Unpickler,
    which must be a ``CheckedUnpickler`` (a reader that stands its own classes in for torch's)."""
    import torch

    if not issubclass(pickle_module.Unpickler, CheckedUnpickler):
        raise TypeError("load_standing_in takes a CheckedUnpickler, which refuses what ALLOWED "
                        "does not hold")  # fmt: skip
    with open_file(path) as handle:
        check_open(handle, path)
        handle.seek(0)
        return plain_arrays(torch.load(handle, map_location="cpu", weights_only=False,
                                       pickle_module=pickle_module))  # fmt: skip


def restricted_torch_load(original: Callable[..., Any]) -> Callable[..., Any]:
    """A ``torch.load`` for code that is not ours (verl's loaders and merger): a path is loaded by
    ``load`` whatever ``weights_only`` the caller passed; a buffer the caller made itself goes
    to ``original``."""

    @functools.wraps(original)
    def checked_load(f: Any, map_location: Any = None, *_args: Any, **kwargs: Any) -> Any:
        if not isinstance(f, (str, os.PathLike)):
            return original(f, map_location, *_args, **kwargs)
        pause_point("load:before_open")  # tests: a file swapped after the launcher's check
        return load(Path(f), map_location=map_location, mmap=bool(kwargs.get("mmap")))

    checked_load._gsm8k_checked = True  # type: ignore[attr-defined]
    return checked_load

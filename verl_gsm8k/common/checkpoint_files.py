"""Every checkpoint file is loaded here, torch.load(weights_only=True) with numpy's RNG state
allowed: the load is the check. _check_zip adds every record's CRC, one archive from byte 0, no
directory record, no link."""

import errno
import functools
import logging
import os
import re
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from verl_gsm8k.common.terminal import clean as shown


class ShardError(Exception):
    """A checkpoint file that must not be loaded: one line naming the file and why."""


@functools.cache
def _register() -> None:
    """numpy's RNG state (what verl's checkpoints hold beyond torch's defaults), once per process:
    a safe_globals block per load would take them from other threads' loads on leaving."""
    import numpy as np
    import torch.distributed.tensor

    allowed = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, np.dtypes.UInt32DType]
    torch.serialization.add_safe_globals(allowed)
    # its warning on each mesh loaded outside a process group is about torch.compile
    logging.getLogger("torch.distributed.device_mesh").setLevel(logging.ERROR)


def _check_zip(handle: BinaryIO, path: Path) -> None:
    try:
        with zipfile.ZipFile(handle) as archive:
            written = zipfile._EndRecData(handle)[zipfile._ECD_OFFSET]
            if archive.start_dir != written:
                raise ShardError(f"refused to load {path}: not one zip archive from byte 0 (two "
                                 "archives glued, or data before or after it)")  # fmt: skip
            for info in archive.infolist():
                if info.is_dir() or info.external_attr & 0x10:
                    raise ShardError(f"refused to load {path}: its record "
                                     f"{shown(info.filename)} is marked a directory")  # fmt: skip
                with archive.open(info) as record:  # its CRC, checked at its end
                    while record.read(1 << 20):
                        pass
    except ShardError:
        raise
    except Exception as err:  # whatever zipfile raises on a damaged file
        raise ShardError(f"shard {path} is truncated or damaged ({shown(err)})") from None


def load(path: Path, *, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """The checkpoint file at ``path``, checked and loaded from one open file."""
    import torch

    _register()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ShardError(f"shard {path} is a symbolic link (verl writes none)") from None
        raise ShardError(f"shard {path} cannot be read ({err.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ShardError(f"refused to load {path}: not a regular file")
        _check_zip(handle, path)
        handle.seek(0)
        source = f"/proc/self/fd/{fd}" if mmap else handle  # torch maps a path: this file's
        try:
            return torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)
        except Exception as err:  # torch's refusal, or what a damaged file raises
            raise ShardError(f"refused to load {path}: {_why(err)}") from None


def _why(err: Exception) -> str:
    """torch's reason in one line, without its advice to load the file all the same."""
    lines = [line.strip() for line in str(err).splitlines()
             if line.strip() and not line.startswith("Check the documentation")]  # fmt: skip
    line = (lines or [type(err).__name__])[-1].split("WeightsUnpickler error:")[-1].strip()
    return shown(re.split(r"\. (?:In PyTorch 2\.6|Please use)", line)[0][:300])


def restricted_torch_load(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.load`` for verl's code: a path goes to ``load``, a buffer to ``original``."""

    @functools.wraps(original)
    def restricted(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(f, (str, os.PathLike)):
            return original(f, map_location, *args, **kwargs)
        return load(Path(f), map_location=map_location, mmap=bool(kwargs.get("mmap")))

    restricted._gsm8k_checked = True  # type: ignore[attr-defined]
    return restricted

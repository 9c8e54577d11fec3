"""Write files atomically: each to a temporary file beside it, flushed to disk, then renamed over
it; several files all together or none.

A reader sees the old file or the new one, never half of one, and a failure (or Ctrl-C) leaves
the old ones and no temporary file. ``replace_all`` checks every target before creating anything
and renames only once every temporary file is complete, with Ctrl-C held back during the renames;
``write_atomic`` is the one-text-file case. Standard library only (and the stdlib-only test
hook of common/pause.py): used in .venv (the trainer, the pages, ``python -m data_prep.*``) and
.venv-eval (verl_gsm8k/evaluate/).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from verl_gsm8k.common.pause import pause_point

Writers = dict[Path, Callable[[Path], None]]  # output path -> function writing it to a given path


class NotWritable(OSError):
    """A target that cannot be written, found before anything was created."""


def check_writable(targets: Iterable[Path]) -> None:
    """NotWritable naming the first target that cannot be written: its directory (or the nearest
    existing ancestor, when it must be created) is not a writable directory, or a directory
    stands where the file goes. Creates nothing."""
    for target in targets:
        if target.is_dir():
            raise NotWritable(f"cannot write {target}: it is a directory")
        folder = target.parent
        while not os.path.lexists(folder) and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise NotWritable(f"cannot write {target}: {folder} is not a directory")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise NotWritable(f"cannot write {target}: {folder} is not writable")


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold back SIGINT (Ctrl-C) inside the block; it is delivered when the block ends."""
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX: nothing to hold it with
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def replace_all(targets: Mapping[Path, Callable[[Path], None]]) -> None:
    """Write every target to a temp file in its own directory, then move them all into place.

    Every target location is checked before anything is created. Each temp file
    (``.<name>.<pid>.<random>.tmp``) is flushed to disk; nothing replaces a target until every
    temp file is complete, Ctrl-C cannot split the renames, and temp files never outlive a
    failure (or Ctrl-C).
    """
    check_writable(targets)
    temps: dict[Path, Path] = {}
    try:
        for target, write in targets.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(
                dir=target.parent, prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp"
            )
            os.close(fd)
            temps[target] = temp = Path(name)
            write(temp)
            with open(temp, "rb") as handle:
                os.fsync(handle.fileno())
            os.chmod(temp, 0o644)  # mkstemp's 0600 would hide the file from other users
            pause_point(f"replace_all:wrote:{target.name}")  # tests: Ctrl-C between two writes
        with sigint_deferred():
            for target, temp in temps.items():
                os.replace(temp, target)
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to a temporary file beside ``path``, then rename it over ``path``."""
    replace_all({Path(path): lambda temp: temp.write_text(text, encoding="utf-8")})

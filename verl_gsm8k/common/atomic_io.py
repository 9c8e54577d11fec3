"""Files written whole: a temporary file beside each, then renamed over it; several all or none."""

import os
import signal
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

Writers = dict[Path, Callable[[Path], None]]  # target -> a function writing it at a path


class NotWritable(OSError):
    """A target that cannot be written, found before anything was created."""


def _check(target: Path) -> None:
    folder = target.parent  # or its nearest ancestor that exists
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if target.is_dir():
        raise NotWritable(f"cannot write {target}: it is a directory")
    if not folder.is_dir():
        raise NotWritable(f"cannot write {target}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise NotWritable(f"cannot write {target}: {folder} is not writable")


def replace_all(targets: Mapping[Path, Callable[[Path], None]]) -> None:
    """Each target written to a temporary file beside it; once all are, renamed (Ctrl-C held)."""
    for target in targets:
        _check(target)
    temps: dict[Path, Path] = {}
    try:
        for target, write in targets.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp",
                                        dir=target.parent)  # fmt: skip
            os.close(fd)
            temps[target] = Path(name)
            write(temps[target])
            with open(name, "rb") as handle:
                os.fsync(handle.fileno())
            os.chmod(name, 0o644)  # mkstemp's 0600 would hide the file from other users
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for target, temp in temps.items():
                os.replace(temp, target)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    replace_all({Path(path): lambda temp: temp.write_text(text, encoding="utf-8")})

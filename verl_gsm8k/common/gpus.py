"""The NVIDIA GPUs of this node, asked of ``nvidia-smi`` once per process: each card's name,
memory and compute capability, from one query. The launcher's plan, its GPU check, the attention
choice, the preflight and the launch record all read this answer, so a launch runs nvidia-smi
once (no CUDA context is created: the launcher, the preflight and Ray's driver can ask without
taking GPU memory). A machine without nvidia-smi, or whose nvidia-smi fails (no driver loaded),
has no GPU here.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass

QUERY = "name,memory.total,compute_cap"
# Drivers older than the compute_cap field refuse the whole query; they are asked without it.
QUERY_WITHOUT_CAPABILITY = "name,memory.total"
TIMEOUT_S = 20


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float | None  # None: not reported ([N/A] on a card with unified memory)
    capability: tuple[int, int] | None  # None: the driver does not report it


def listed(path: str | None = None) -> tuple[Gpu, ...]:
    """The GPUs the ``nvidia-smi`` found on ``path`` (default: this process's PATH) reports;
    () without one. Asked once per nvidia-smi (its path and modification time)."""
    smi = shutil.which("nvidia-smi", path=path if path is not None else os.environ.get("PATH"))
    if smi is None:
        return ()
    try:
        changed = os.stat(smi).st_mtime_ns
    except OSError:
        return ()
    return _ask(os.path.realpath(smi), changed)


def capabilities(gpus: tuple[Gpu, ...]) -> list[tuple[int, int]] | None:
    """The compute capability of each GPU; [] without a GPU; None where the driver cannot say."""
    caps = [gpu.capability for gpu in gpus]
    if any(cap is None for cap in caps):
        return None
    return [cap for cap in caps if cap is not None]


@functools.lru_cache(maxsize=16)
def _ask(smi: str, changed: int) -> tuple[Gpu, ...]:
    del changed  # part of the cache key only: a replaced nvidia-smi is asked again
    rows = _query(smi, QUERY)
    if rows is None:
        rows = _query(smi, QUERY_WITHOUT_CAPABILITY)
    gpus = []
    for fields in rows or []:
        name, mib = fields[0], fields[1] if len(fields) > 1 else ""
        if not name:
            continue
        memory = int(mib) / 1024 if mib.isdigit() else None
        gpus.append(Gpu(name, memory, _capability(fields[2] if len(fields) > 2 else "")))
    return tuple(gpus)


def _query(smi: str, fields: str) -> list[list[str]] | None:
    """Each line of ``nvidia-smi --query-gpu=fields`` split into its fields (from the right: the
    name comes first); None when nvidia-smi refuses the query (worth asking without a field),
    [] when it cannot run or hangs (not asked again)."""
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=TIMEOUT_S, check=True,
        ).stdout  # fmt: skip
    except subprocess.CalledProcessError:
        return None
    except (subprocess.SubprocessError, OSError):
        return []
    cut = fields.count(",")
    return [[part.strip() for part in line.rsplit(",", cut)] for line in out.strip().splitlines()]


def _capability(text: str) -> tuple[int, int] | None:
    major, dot, minor = text.partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        return None
    return int(major), int(minor)

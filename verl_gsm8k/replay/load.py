"""Reading ``RUN_DIR/trace/<step>.jsonl`` (written by ``verl_gsm8k.trace``), defensively.

Each problem is one line in ``Trace.issues`` and the rest is still read: a run without a trace, a
file that is not JSON (cut short by a crash or a full disk), a file without its step line, a file
whose step line names another run (another experiment, or a metrics file this run does not have),
a line with a field of the wrong type (``schema.py``: a trace in a shared folder is untrusted), a
step left behind by an earlier launch into the same directory (``_drop_superseded``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_gsm8k.common import json_read
from verl_gsm8k.common.launch_record import RecordError, lookup, read_records
from verl_gsm8k.common.run_dir import TRACE_DIR, metrics_paths
from verl_gsm8k.replay.schema import problem

STEP_FILE = re.compile(r"^(\d+)\.jsonl$")


@dataclass
class TraceStep:
    step: int
    head: dict[str, Any]  # the step line: run settings, batch statistics, metrics
    samples: list[dict[str, Any]]


@dataclass
class Trace:
    steps: dict[int, TraceStep] = field(default_factory=dict)
    issues: list[str] = field(default_factory=list)

    @property
    def run(self) -> dict[str, Any]:
        """The run settings of the latest traced step ({} without a trace)."""
        return self.steps[max(self.steps)].head.get("run", {}) if self.steps else {}


def run_identity(run_dir: Path) -> tuple[set[str], set[str]]:
    """(experiment names, metrics file names) a trace of this run may carry: from the launch
    records (verl_gsm8k.resume) and the metrics files (verl_gsm8k/launch/) of ``run_dir``."""
    try:
        records = read_records(run_dir)
    except RecordError:
        records = []  # the report names a broken record; the trace is still checked by metrics
    names = {str(lookup(r["config"], "trainer.experiment_name")) for r in records} - {"None"}
    metrics = {p.name for p in metrics_paths(run_dir)}
    return names, metrics


def _foreign(head: dict[str, Any], names: set[str], metrics: set[str]) -> str | None:
    run = head.get("run") or {}
    experiment, metrics_file = run.get("experiment"), run.get("metrics_file")
    if names and experiment and experiment not in names:
        return f"experiment {experiment!r}, not {' or '.join(sorted(names))!r}"
    if metrics and metrics_file and metrics_file not in metrics:
        return f"its metrics file {metrics_file} is not one of this run's"
    return None


def read_step(path: Path, names: set[str], metrics: set[str]) -> TraceStep | str:
    """The step of one trace file, or the one line that says why it is skipped."""
    rel = f"{TRACE_DIR}/{path.name}"
    head: dict[str, Any] | None = None
    samples: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        try:
            item = json_read.parse(line, rel)
        except json_read.JsonError:
            return f"{rel}: line {number} is not JSON (a file cut short?); step skipped"
        if not isinstance(item, dict):
            return f"{rel}: line {number} is not a JSON object; step skipped"
        wrong = problem(item) if item.get("kind") in ("step", "sample") else None
        if wrong:
            return f"{rel}: line {number}: {wrong}; step skipped"
        if item.get("kind") == "step":
            head = item
        elif item.get("kind") == "sample":
            samples.append(item)
    if head is None:
        return f"{rel}: no step line; step skipped"
    foreign = _foreign(head, names, metrics)
    if foreign:
        return f"{rel}: a trace of another run ({foreign}); step skipped"
    return TraceStep(int(head.get("step", -1)), head, samples)


def load_trace(run_dir: Path) -> Trace:
    """Every readable traced step of ``run_dir``; a run without a trace has one issue."""
    trace = Trace()
    folder = Path(run_dir) / TRACE_DIR
    files = sorted(
        (p for p in folder.glob("*.jsonl") if STEP_FILE.match(p.name)),
        key=lambda p: int(STEP_FILE.match(p.name).group(1)),  # type: ignore[union-attr]
    ) if folder.is_dir() else []  # fmt: skip
    if not files:
        trace.issues.append(
            f"no per-token trace in {folder} (TRACE_SAMPLES=0, a trainer.v1.trainer_mode other "
            "than gsm8k, or a run from before the trace): no replay page"
        )
        return trace
    names, metrics = run_identity(Path(run_dir))
    for path in files:
        try:
            got = read_step(path, names, metrics)
        except OSError as err:
            got = f"{TRACE_DIR}/{path.name}: unreadable ({err.strerror}); step skipped"
        if isinstance(got, str):
            trace.issues.append(got)
        else:
            trace.steps[got.step] = got
    _drop_superseded(trace)
    return trace


def _launch(ts: TraceStep) -> str:
    """The launch that wrote a step: its metrics file (``metrics-<stamp>.jsonl``, one per launch,
    the launcher (verl_gsm8k/launch/)), "" when the trace does not say."""
    return str((ts.head.get("run") or {}).get("metrics_file") or "")


def _drop_superseded(trace: Trace) -> None:
    """Keep a step of an earlier launch only below the first step a later launch traced: a later
    launch that started over (``RESUME=disable``) or resumed from an earlier checkpoint replaced
    every step from there on, and the old files left beyond its last step belong to another run."""
    launches = sorted({_launch(ts) for ts in trace.steps.values()} - {""})
    for later_index, later in enumerate(launches[1:], start=1):
        first = min(step for step, ts in trace.steps.items() if _launch(ts) == later)
        for earlier in launches[:later_index]:
            gone = sorted(step for step, ts in trace.steps.items()
                          if _launch(ts) == earlier and step >= first)  # fmt: skip
            if not gone:
                continue
            for step in gone:
                del trace.steps[step]
            trace.issues.append(
                f"{TRACE_DIR}/: steps {gone[0]}-{gone[-1]} ({len(gone)} files) were written by "
                f"an earlier launch ({earlier}), replaced from step {first} by a later one "
                f"({later}); not replayed"
            )

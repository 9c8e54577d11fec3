"""Reading ``RUN_DIR/trace/<step>.jsonl``, untrusted: a bad field or file, another launch's step:
one issue, skipped."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_gsm8k.common import json_read
from verl_gsm8k.common import run_dir as rd
from verl_gsm8k.common.launch_record import RecordError, lookup, read_records

# Each field's type by dotted path (KIND? items may be null); any field may be absent or null.
STEP = {"run": "map", "run.kl": "map", "batch": "map", "step": "int", "traced": "int",
        "of": "int", "run.experiment": "str", "run.metrics_file": "str",
        "run.adv_estimator": "str", "run.gamma": "num", "run.lam": "num",
        "run.norm_adv_by_std_in_grpo": "scalar", "run.rollout_n": "int",
        "run.max_response_length": "int", "run.kl.in": "str", "run.kl.estimator": "str",
        "run.kl.coef": "num", "run.kl.controller": "str", "metrics": "map:num",
        "batch.groups": "map:num", "batch.response_lengths": "map:int",
        "batch.advantage_whitening": "map:num"}  # fmt: skip
SAMPLE = {"prompt": "map", "response": "map", "per_token": "map", "step": "int", "key": "str",
          "uid": "str", "session": "int", "score": "num", "data_source": "scalar",
          "ground_truth": "scalar", "reward_extra": "map:scalar", "absent": "map:str",
          "prompt.tokens": "list:str", "prompt.ids": "list:int", "response.tokens": "list:str",
          "response.ids": "list:int", "response.mask": "list:int"}  # fmt: skip
TYPES = {"int": (int,), "num": (int, float), "str": (str,), "scalar": (str, int, float, bool),
         "map": (dict,), "list": (list,)}  # fmt: skip
NAMES = {"map": "mapping", dict: "dict", type(None): "null"}


def _wrong(path: str, kind: str, value: Any) -> str | None:
    if value is None or type(value) in TYPES[kind]:
        return None
    got = NAMES.get(type(value), type(value).__name__)
    return f"field {path} is a {got}, not a {NAMES.get(kind, kind)}"


def problem(line: dict[str, Any]) -> str | None:
    spec = dict(STEP if line.get("kind") == "step" else SAMPLE)
    if isinstance(line.get("per_token"), dict) and line.get("kind") != "step":
        spec.update({f"per_token.{name}": "list:num?" for name in line["per_token"]})
    for path, kind in spec.items():
        value: Any = line
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else value
        kind, _, item = kind.partition(":")
        if why := _wrong(path, kind, value):
            return why
        if not item or value is None:
            continue
        pairs = value.items() if kind == "map" else enumerate(value)
        for key, each in pairs:
            where = f"{path}.{key}" if kind == "map" else f"{path}[{key}]"
            if each is None and kind == "list" and not item.endswith("?"):
                return f"field {where} is a null, not a {item}"
            if why := _wrong(where, item.rstrip("?"), each):
                return why
    return None


@dataclass
class TraceStep:
    step: int
    head: dict[str, Any]
    samples: list[dict[str, Any]]


@dataclass
class Trace:
    steps: dict[int, TraceStep] = field(default_factory=dict)
    issues: list[str] = field(default_factory=list)

    @property
    def run(self) -> dict[str, Any]:
        return self.steps[max(self.steps)].head.get("run") or {} if self.steps else {}


def run_identity(run_dir: Path) -> tuple[set[str], set[str]]:
    try:
        records = read_records(run_dir)
    except RecordError:
        records = []
    names = {str(lookup(r["config"], "trainer.experiment_name")) for r in records} - {"None"}
    return names, {p.name for p in rd.metrics_paths(run_dir)}


def read_step(path: Path, step: int, names: set[str], metrics: set[str]) -> TraceStep | str:
    rel, head, samples = f"{rd.TRACE_DIR}/{path.name}", None, []
    for number, item in rd.jsonl(path):
        if isinstance(item, json_read.JsonError):
            return f"{rel}: line {number} is not JSON (a file cut short?); step skipped"
        if not isinstance(item, dict):
            return f"{rel}: line {number} is not a JSON object; step skipped"
        if item.get("kind") in ("step", "sample") and (wrong := problem(item)):
            return f"{rel}: line {number}: {wrong}; step skipped"
        if item.get("kind") == "step":
            head = item
        elif item.get("kind") == "sample":
            samples.append(item)
    if head is None:
        return f"{rel}: no step line; step skipped"
    run = head.get("run") or {}
    experiment, metrics_file = run.get("experiment"), run.get("metrics_file")
    if names and experiment and experiment not in names:
        return (f"{rel}: a trace of another run (experiment {experiment!r}, not "
                f"{' or '.join(sorted(names))!r}); step skipped")  # fmt: skip
    if metrics and metrics_file and metrics_file not in metrics:
        return (f"{rel}: a trace of another run (its metrics file {metrics_file} is not one of "
                "this run's); step skipped")  # fmt: skip
    return TraceStep(step, head, samples)


def load_trace(run_dir: Path) -> Trace:
    trace, files = Trace(), rd.dump_files(run_dir, rd.TRACE_DIR)
    if not files:
        trace.issues.append(f"no per-token trace in {Path(run_dir) / rd.TRACE_DIR} "
                            "(TRACE_SAMPLES=0, a trainer.v1.trainer_mode other than gsm8k, or a "
                            "run from before the trace): no replay page")  # fmt: skip
        return trace
    names, metrics = run_identity(Path(run_dir))
    for step, path in files.items():
        try:
            got = read_step(path, step, names, metrics)
        except OSError as err:
            got = f"{rd.TRACE_DIR}/{path.name}: unreadable ({err.strerror}); step skipped"
        if isinstance(got, str):
            trace.issues.append(got)
        else:
            trace.steps[step] = got
    _drop_superseded(trace)
    return trace


def _launch(ts: TraceStep) -> str:
    return str((ts.head.get("run") or {}).get("metrics_file") or "")


def _drop_superseded(trace: Trace) -> None:
    launches = sorted({_launch(ts) for ts in trace.steps.values()} - {""})
    for index, later in enumerate(launches[1:], start=1):
        first = min(step for step, ts in trace.steps.items() if _launch(ts) == later)
        for earlier in launches[:index]:
            gone = [s for s, ts in trace.steps.items() if _launch(ts) == earlier and s >= first]
            for step in gone:
                del trace.steps[step]
            if gone:
                trace.issues.append(
                    f"{rd.TRACE_DIR}/: steps {gone[0]}-{gone[-1]} ({len(gone)} files) were "
                    f"written by an earlier launch ({earlier}), replaced from step {first} by "
                    f"a later one ({later}); not replayed")  # fmt: skip

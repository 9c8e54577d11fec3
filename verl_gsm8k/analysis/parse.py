"""verl's metrics (a run directory, one .jsonl, or a console log's ``step:N - key:value``
lines) mapped onto the names of guard/vocab.py."""

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_gsm8k.common import run_dir as rd
from verl_gsm8k.common.launch_record import RecordError, lookup, read_records
from verl_gsm8k.guard import vocab

Series = list[tuple[int, float]]


@dataclass
class RunData:
    sources: list[str] = field(default_factory=list)
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    issues: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    config: dict[str, int] = field(default_factory=dict)
    val_problems: int | None = None
    val_problems_from: str | None = None

    def merge(self, step: int, values: dict[str, float]) -> None:
        self.steps.setdefault(step, {}).update(values)


class InputError(Exception):
    pass


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RAY_PREFIX = r"\([^()]*\bpid=\d+[^()]*\)"  # "(TaskRunner pid=12)" before a worker's line
_LINE = re.compile(rf"^\s*(?:{RAY_PREFIX}\s*)?step:(?P<step>\d+)(?P<rest> - .*)$")
_FIELD = re.compile(r"^([^\s:]\S*?):(\S+)$")
_NP = re.compile(r"^np\.\w+\((.*)\)$")  # pprint's np.float64(0.5)
KEYS = {"train_batch_size": "data.train_batch_size", "rollout_n": "actor_rollout_ref.rollout.n",
        "max_response_length": "data.max_response_length"}  # fmt: skip
_CONFIG = {  # in a console log's config dump
    "train_batch_size": re.compile(r"['\"]?train_batch_size['\"]?\s*[:=]\s*(\d+)"),
    "rollout_n": re.compile(r"actor_rollout_ref\.rollout\.n=(\d+)"),
    "max_response_length": re.compile(r"\bmax_response_length['\"]?\s*[:=]\s*(\d+)"),
}


def strip_ansi(line: str) -> str:
    return ANSI.sub("", line) if "\x1b" in line else line


def to_float(value: Any) -> float | None:
    """A logged value as a float (null: NaN, a huge integer: inf); None if no number."""
    if value is None:
        return math.nan
    if isinstance(value, str) and value[:3] in ("np.", "Tru", "Fal"):
        value = _NP.sub(r"\1", value.strip())
        value = {"True": 1, "False": 0}.get(value, value)
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        return None


def _add(data: RunData, where: str, step: int, pairs: Any) -> None:
    values, bad = {}, []
    for key, raw in pairs:
        number = to_float(raw)
        if number is None:
            bad.append(f"{key}={raw!r}"[:80])
        else:
            values[sys.intern(str(key))] = number  # one string per key name, not per step
    if bad:
        data.issues.append(f"{where}: non-numeric value ignored: {', '.join(bad)}")
    data.merge(step, values)


def _fields(rest: str, unfinished: bool) -> tuple[list[tuple[str, str]], str | None] | None:
    parts = rest.rstrip().split(" - ")[1:]
    found = [_FIELD.match(part) for part in parts]
    cut = None
    if len(parts) > 1 and not found[-1] and not any(c.isspace() for c in parts[-1]):
        cut, found = parts[-1], found[:-1]  # a line cut mid-write
    if not found or not all(found):
        return None
    pairs = [m.groups() for m in found if m]
    if unfinished and cut is None:  # the writer may be inside the last value
        cut = ":".join(pairs.pop())
    return pairs, cut


def parse_console(path: Path, data: RunData) -> None:
    kept = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            line = strip_ansi(raw.decode("utf-8", "replace").replace("\x00", "").rstrip("\r\n"))
            match = _LINE.match(line)
            if match is None:
                for name, pattern in _CONFIG.items():
                    found = pattern.search(line) if name not in data.config else None
                    if found:
                        data.config[name] = int(found.group(1))
                continue
            parsed = _fields(match.group("rest"), not raw.endswith(b"\n"))
            if parsed is None:
                continue
            if len(match.group("step")) > 12:
                data.issues.append(f"{path}:{number}: step out of range, skipped")
                continue
            pairs, cut = parsed
            if cut is not None:
                data.issues.append(f"{path}:{number}: line cut off after {len(pairs)} fields, "
                                   f"dropped {cut!r}")  # fmt: skip
            if pairs:
                kept += 1
                _add(data, f"{path}:{number}", int(match.group("step")), pairs)
    if not kept:
        data.issues.append(f"{path}: no 'step:N - key:value' lines found")


def _is_jsonl(path: Path) -> bool:
    if path.suffix in (".jsonl", ".json"):
        return True
    with open(path, "rb") as handle:
        head = handle.read(4096).decode("utf-8", "replace").split()
    return bool(head) and head[0].startswith("{")


def count_val_problems(run: Path) -> tuple[int, str] | None:
    """Distinct prompts of the larger of the two newest validation dumps, and that dump."""
    best = None
    for path in reversed(list(rd.dump_files(run, rd.VALIDATION_DIR).values())[-2:]):
        try:
            rows = [row for _, row in rd.jsonl(path) if isinstance(row, dict)]
        except OSError:
            continue
        inputs = {row["input"] for row in rows if isinstance(row.get("input"), str)}
        if inputs and (best is None or len(inputs) > best[0]):
            best = (len(inputs), str(path))
    return best


def read_launch_config(run: Path, data: RunData) -> None:
    try:
        records = read_records(run)
    except RecordError as err:
        data.issues.append(str(err))
        return
    config = records[-1].get("config") if records else None
    for name, key in KEYS.items() if isinstance(config, dict) else ():
        if type(value := lookup(config, key)) is int:
            data.config[name] = value


def load_run(path: Path) -> RunData:
    """A run directory, a metrics .jsonl or a console log; bad lines are issues."""
    if not path.exists():
        raise InputError(f"input not found: {path}")
    data = RunData()
    files = rd.metrics_paths(path) if path.is_dir() else [path]
    if not files:
        raise InputError(f"no {rd.METRICS_DIR}/*.jsonl in directory {path}")
    for file in files:
        data.sources.append(str(file))
        try:
            console = not _is_jsonl(file)
            data.formats.append("console" if console else "jsonl")
            if console:
                parse_console(file, data)
                continue
        except OSError as err:
            data.issues.append(f"{file}: cannot read ({err.strerror or err})")
            continue
        for number, step, row in rd.metric_lines(file, data.issues):
            _add(data, f"{file}:{number}", step, row.items())
    data.steps = dict(sorted(data.steps.items()))
    if path.is_dir():
        read_launch_config(path, data)
        data.val_problems, data.val_problems_from = count_val_problems(path) or (None, None)
    return data


@dataclass
class Canonical:
    series: dict[str, Series]  # finite values only
    source_keys: dict[str, str]  # canonical name -> the key it was read from
    phases: dict[str, Series]  # phase -> seconds per step
    step_time_derived: bool  # no step timer logged (older verl): the phases' sum
    val_key: str | None
    throughput_estimated: bool
    all_steps: list[int]
    val_problems: int | None = None


def _val_key(keys: set[str]) -> str | None:
    ranked = []
    for key in keys:
        new = vocab.VAL_CORE_KEY.match(key)
        if match := new or vocab.VAL_OLD_KEY.match(key):
            kind = (new["var"] != "acc") if new else 2
            ranked.append((kind, "gsm8k" not in match["src"], key))
    return min(ranked)[2] if ranked else None


def _aux_keys(val_key: str | None, keys: set[str]) -> dict[str, str]:
    core = vocab.VAL_CORE_KEY.match(val_key or "")
    aux = [m for m in map(vocab.VAL_AUX_KEY.match, sorted(keys)) if m and m["var"] != "acc"]
    same = [m for m in aux if core and (m["src"], m["n"]) == (core["src"], core["n"])]
    return {vocab.VAL_AUX_PREFIX + m["var"]: m.string for m in same}


def canonicalize(data: RunData) -> Canonical:
    keys = {key for values in data.steps.values() for key in values}
    val_key = _val_key(keys)
    named = {name: [(key, 1.0)] for name, key in _aux_keys(val_key, keys).items()}
    named.update({"val_acc": [(val_key, 1.0)]} if val_key else {})
    specs = [(m.name, m.keys) for m in vocab.METRICS] + list(named.items())
    phases = sorted({m["phase"] for m in map(vocab.PHASE_KEY.match, keys) if m} - {"step"})
    timed = any(key in keys for key, _ in vocab.METRICS_BY_NAME["step_time"].keys)
    series: dict[str, Series] = {}
    source: dict[str, str] = {}
    by_phase: dict[str, Series] = {}
    for step, values in data.steps.items():
        for name, spec_keys in specs:
            for key, scale in spec_keys:  # the first key logged
                if key in values:
                    if math.isfinite(value := values[key] * scale):
                        series.setdefault(name, []).append((step, value))
                        source.setdefault(name, key)
                    break
        inside = None
        for phase in phases:
            value = values.get(f"timing_s/{phase}", values.get(f"timing/{phase}"))
            if value is not None and math.isfinite(value):
                by_phase.setdefault(phase, []).append((step, value))
                if phase not in vocab.OUTSIDE_STEP_PHASES:
                    inside = (inside or 0.0) + value
        if not timed and inside is not None:
            series.setdefault("step_time", []).append((step, inside))
    if not timed and "step_time" in series:
        source["step_time"] = "sum of the timing/* phases (no step timer logged)"
    limit = data.config.get("max_response_length")
    if cut := _cut_share(series, limit):
        series[vocab.CUT_SHARE] = cut
        source[vocab.CUT_SHARE] = ("response_length/clip_ratio at steps whose response_length/max "
                                   f"reached data.max_response_length={limit}, else 0")  # fmt: skip
    estimate = [] if "throughput" in series else _throughput(series, data.config)
    if estimate:
        series["throughput"] = estimate
        source["throughput"] = "estimated from train_batch_size, lengths and step time"
    by_phase = {phase: by_phase[phase] for phase in phases if phase in by_phase}
    return Canonical(series, source, by_phase, not timed, val_key, bool(estimate),
                     list(data.steps), data.val_problems)  # fmt: skip


def _cut_share(series: dict[str, Series], limit: int | None) -> Series:
    """verl's clip_ratio (as long as the step's longest) where that reached the limit."""
    if not limit:
        return []
    longest = dict(series.get("response_length_max", []))
    ratios = series.get("response_length_clip_ratio", [])
    return [(s, r if longest[s] >= limit else 0.0) for s, r in ratios if s in longest]


def _throughput(series: dict[str, Series], config: dict[str, int]) -> Series:
    batch = config.get("train_batch_size", 0) * config.get("rollout_n", 1)
    prompt = dict(series.get("prompt_length_mean", []))
    response = dict(series.get("response_length_mean", []))
    return [(s, batch * (prompt[s] + response[s]) / t) for s, t in series.get("step_time", [])
            if batch and s in prompt and s in response and t > 0]  # fmt: skip

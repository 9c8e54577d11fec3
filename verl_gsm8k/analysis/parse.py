"""Reading verl training metrics: parsing, merging, and mapping onto the canonical vocabulary of
``vocab``.

Standard library only. ``checks`` runs the health checks on what this module reads,
``summary`` summarises it, and ``cli`` (``python -m verl_gsm8k.report``) is the command line on top.

Inputs understood
-----------------
* verl's ``file`` logger: one JSON object a line, ``{"step": N, "data": {metric: value}}``.
  orjson writes NaN/inf as ``null``, so ``null`` is read as NaN.
* verl's ``console`` logger: lines ``step:N - key:value - key:value ...``, possibly behind ANSI
  colour codes and a Ray prefix such as ``(TaskRunner pid=1234)``. Only lines that are entirely of
  that form are metrics; model outputs that merely contain "step:" are ignored.
* A run directory: every ``metrics/*.jsonl`` (or ``*.jsonl`` directly inside it), in name order.
  verl's file logger truncates its file on start, so the recipes write one file per launch; on
  overlapping steps the later segment wins, key by key. Its ``validation/<step>.jsonl`` dumps
  tell how many problems a validation has (``count_val_problems``), its
  ``launches/launch-<UTC>.yaml`` records the config (``read_launch_config``: the response length
  limit, for the share of responses cut at it).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.vocab import (
    CUT_SHARE,
    METRICS,
    METRICS_BY_NAME,
    OUTSIDE_STEP_PHASES,
    PHASE_KEY,
    VAL_AUX_KEY,
    VAL_AUX_PREFIX,
    VAL_CORE_KEY,
    VAL_OLD_KEY,
)
from verl_gsm8k.common import json_read
from verl_gsm8k.common.run_dir import (
    LAUNCHES_DIR,
    METRICS_DIR,
    VALIDATION_DIR,
    launch_record_paths,
)

# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


@dataclass
class ParseIssue:
    """A problem found while reading an input; the rest of the file is still used."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.message}"


@dataclass
class RunData:
    """Merged raw metrics of one run, keyed by step then by the metric key as logged."""

    sources: list[str] = field(default_factory=list)
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    issues: list[ParseIssue] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    # Facts of the run's config (train_batch_size, rollout_n, max_response_length): from a console
    # log's config dump, or a run directory's launch records (launches/launch-<UTC>.yaml).
    config: dict[str, int] = field(default_factory=dict)
    # Number of validation problems, counted in a run directory's validation/<step>.jsonl dumps
    # (verl logs no count), and the dump it was counted in; None when the run does not tell.
    val_problems: int | None = None
    val_problems_from: str | None = None

    def merge(self, step: int, values: dict[str, float]) -> None:
        """Add one record; a later record for the same step overrides key by key."""
        self.steps.setdefault(step, {}).update(values)


class InputError(Exception):
    """The input path cannot be used at all (missing, or a directory without metrics)."""


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# A Ray prefix, "(Name pid=123)" or "(Name pid=123, ip=...)", before a worker's console line.
RAY_PREFIX = r"\([^()]*\bpid=\d+[^()]*\)"
# Optional Ray prefix, then "step:N - key:value".
_CONSOLE_LINE = re.compile(rf"^\s*(?:{RAY_PREFIX}\s*)?step:(?P<step>\d+)(?P<rest>.*)$")
_FIELD = re.compile(r"^(?P<key>[^\s:][^\s]*?):(?P<value>\S+)$")
# Console values go through pprint: plain numbers, nan/inf, True/False or np.float64(0.5).
_NP_WRAPPED = re.compile(r"^np\.\w+\((?P<inner>.*)\)$")
_CONFIG_INT = {
    "train_batch_size": re.compile(r"['\"]?train_batch_size['\"]?\s*[:=]\s*(\d+)"),
    "rollout_n": re.compile(r"actor_rollout_ref\.rollout\.n=(\d+)"),
    "max_response_length": re.compile(r"\bmax_response_length['\"]?\s*[:=]\s*(\d+)"),
}


def strip_ansi(line: str) -> str:
    """A console line without its ANSI colour codes."""
    return _ANSI.sub("", line) if "\x1b" in line else line


def _to_float(value: Any) -> float | None:
    """A metric value as float; None if it is not a number. JSON null is NaN (orjson's NaN)."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        wrapped = _NP_WRAPPED.match(text)
        if wrapped:
            text = wrapped.group("inner")
        if text in ("True", "False"):
            return 1.0 if text == "True" else 0.0
        try:
            return float(text)
        except ValueError:
            return None
    return None


def _read_lines(path: Path, data: RunData) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, unfinished) for each line, read one line at a time.

    ``unfinished`` is True only for a last line without its newline (the writer may still be in
    it). Problems go to ``data.issues``: unreadable file, or no text at all ("empty file").
    Splits on "\n" only, so line numbers match what an editor shows even when model output holds
    other Unicode line separators.
    """
    any_text = False
    lineno = 0
    try:
        with path.open("rb") as handle:
            for raw in handle:
                lineno += 1
                # Real console logs carry stray NUL bytes and partial UTF-8 from interleaved Ray
                # output.
                text = raw.decode("utf-8", errors="replace").replace("\x00", "")
                unfinished = not text.endswith("\n")
                line = text.rstrip("\n").rstrip("\r")
                if not any_text and line.strip():
                    any_text = True
                yield lineno, line, unfinished
    except OSError as exc:
        where = f" at line {lineno + 1}" if lineno else ""
        data.issues.append(
            ParseIssue(str(path), None, f"cannot read{where}: {exc.strerror or exc}")
        )
        return
    if not any_text:
        data.issues.append(ParseIssue(str(path), None, "empty file, no metrics in it"))


def _emptied(data: RunData, issues_before: int) -> bool:
    """Whether reading the file ended in a whole-file problem (unreadable or empty)."""
    return any(issue.line is None for issue in data.issues[issues_before:])


def parse_jsonl(path: Path, data: RunData) -> int:
    """Read a verl file-logger JSONL file into ``data``. Returns the number of records kept."""
    issues_before = len(data.issues)
    kept = 0
    # A line that is not JSON is only known to be "invalid" (rather than the last line, cut off
    # mid-write) once another non-blank line follows it.
    unparsed: tuple[int, str] | None = None
    for lineno, line, _ in _read_lines(path, data):
        if not line.strip():
            continue
        if unparsed is not None:
            data.issues.append(
                ParseIssue(str(path), unparsed[0], f"invalid JSON ({unparsed[1]}), skipped")
            )
            unparsed = None
        try:
            record = json_read.parse(line, str(path))
        except json_read.JsonError as exc:
            unparsed = (lineno, exc.reason)
            continue
        step = record.get("step") if isinstance(record, dict) else None
        metrics = record.get("data") if isinstance(record, dict) else None
        if isinstance(step, bool) or not isinstance(step, int) or not isinstance(metrics, dict):
            data.issues.append(
                ParseIssue(str(path), lineno, 'not a {"step": int, "data": {...}} record, skipped')
            )
            continue
        values: dict[str, float] = {}
        bad: list[str] = []
        for key, value in metrics.items():
            number = _to_float(value)
            if number is None:
                bad.append(f"{key}={value!r}"[:80])
            else:
                # One string object per key name, not one per step: long runs stay small.
                values[sys.intern(str(key))] = number
        if bad:
            data.issues.append(
                ParseIssue(str(path), lineno, f"non-numeric value ignored: {', '.join(bad)}")
            )
        data.merge(step, values)
        kept += 1
    if unparsed is not None:
        data.issues.append(
            ParseIssue(str(path), unparsed[0], f"truncated last line ({unparsed[1]}), skipped")
        )
    if kept == 0 and not _emptied(data, issues_before):
        data.issues.append(ParseIssue(str(path), None, "no metric records found"))
    return kept


def parse_console_fields(rest: str) -> tuple[list[tuple[str, str]], str | None] | None:
    """Split the part after ``step:N`` into (key, raw value) pairs.

    Returns None when the text is not a metrics line. The second element names a cut-off last
    field (a line truncated mid-write), which is dropped.
    """
    if not rest.startswith(" - "):
        return None
    parts = rest.rstrip().split(" - ")[1:]
    pairs: list[tuple[str, str]] = []
    for position, part in enumerate(parts):
        match = _FIELD.match(part)
        if match:
            pairs.append((match.group("key"), match.group("value")))
            continue
        is_last = position == len(parts) - 1
        if is_last and pairs and part and not any(ch.isspace() for ch in part):
            return pairs, part
        return None
    if not pairs:
        return None
    return pairs, None


def parse_console(path: Path, data: RunData) -> int:
    """Read the ``step:N - key:value`` lines of a verl console log into ``data``."""
    issues_before = len(data.issues)
    kept = 0
    for lineno, raw_line, unfinished in _read_lines(path, data):
        line = strip_ansi(raw_line)
        if "step:" not in line:
            for name, pattern in _CONFIG_INT.items():
                found = pattern.search(line)
                if found and name not in data.config:
                    data.config[name] = int(found.group(1))
            continue
        match = _CONSOLE_LINE.match(line)
        if not match:
            continue
        parsed = parse_console_fields(match.group("rest"))
        if parsed is None:
            continue
        pairs, cut = parsed
        if cut is None and unfinished:
            # The writer may still be inside the last value (e.g. "0.5" of "0.5432").
            cut = f"{pairs[-1][0]}:{pairs[-1][1]}"
            pairs = pairs[:-1]
            if not pairs:
                data.issues.append(
                    ParseIssue(str(path), lineno, f"unfinished last line skipped: {cut!r}")
                )
                continue
        values: dict[str, float] = {}
        bad: list[str] = []
        for key, raw_value in pairs:
            number = _to_float(raw_value)
            if number is None:
                bad.append(f"{key}={raw_value}"[:80])
            else:
                values[sys.intern(key)] = number
        if cut is not None:
            data.issues.append(
                ParseIssue(
                    str(path), lineno, f"line cut off after {len(pairs)} fields, dropped {cut!r}"
                )
            )
        if bad:
            data.issues.append(
                ParseIssue(str(path), lineno, f"non-numeric value ignored: {', '.join(bad)}")
            )
        data.merge(int(match.group("step")), values)
        kept += 1
    if kept == 0 and not _emptied(data, issues_before):
        data.issues.append(ParseIssue(str(path), None, "no 'step:N - key:value' lines found"))
    return kept


def _looks_like_jsonl(path: Path) -> bool:
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        return True
    try:
        with path.open("rb") as handle:
            head = handle.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return False
    first = next((line for line in head.splitlines() if line.strip()), "")
    return first.lstrip().startswith("{")


def find_segments(directory: Path) -> list[Path]:
    """The metric files of a run directory, in name (= launch time) order."""
    for candidate in (directory / METRICS_DIR, directory):
        if candidate.is_dir():
            files = sorted(p for p in candidate.glob("*.jsonl") if p.is_file())
            if files:
                return files
    logs = sorted(p for p in directory.glob("*.log") if p.is_file())
    return logs


_DUMPS_READ = 2  # the newest dumps: the last one may still be being written


def count_val_problems(directory: Path) -> tuple[int, str] | None:
    """Distinct validation prompts in a run's newest ``validation/<step>.jsonl`` dumps.

    verl writes one line per validation sample (``input``, ``output``, ``score``, ...) when
    ``trainer.validation_data_dir`` is set, as the recipes do; distinct inputs are the problems
    (with ``val_kwargs.n`` > 1 a problem has several lines). The larger count of the two newest
    dumps is taken, since the newest may be half-written while the run goes on. Returns
    (count, dump path) or None when there is no readable dump.
    """
    folder = directory / VALIDATION_DIR
    if not folder.is_dir():
        return None
    dumps = sorted(
        (p for p in folder.glob("*.jsonl") if p.stem.isdigit() and p.is_file()),
        key=lambda p: int(p.stem),
    )
    best: tuple[int, str] | None = None
    for dump in reversed(dumps[-_DUMPS_READ:]):  # newest first: it names the count on a tie
        inputs: set[str] = set()
        try:
            with dump.open("rb") as handle:
                for raw in handle:
                    try:
                        row = json_read.parse(raw, str(dump))
                    except json_read.JsonError:
                        continue  # a line cut off mid-write
                    if isinstance(row, dict) and isinstance(row.get("input"), str):
                        inputs.add(row["input"])
        except OSError:
            continue
        if inputs and (best is None or len(inputs) > best[0]):
            best = (len(inputs), str(dump))
    return best


def read_launch_config(directory: Path, data: RunData) -> None:
    """The config facts of ``_CONFIG_INT`` from a run directory's launch records (each holds the
    resolved verl config as YAML; read line by line, standard library only). Launches that
    disagree on a value leave it unknown, with an issue."""
    found: dict[str, set[int]] = {}
    for record in launch_record_paths(directory):
        try:
            text = record.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for name, pattern in _CONFIG_INT.items():
            match = pattern.search(text)
            if match:
                found.setdefault(name, set()).add(int(match.group(1)))
    for name, values in found.items():
        if len(values) == 1:
            data.config.setdefault(name, values.pop())
        else:
            data.issues.append(
                ParseIssue(
                    str(directory / LAUNCHES_DIR),
                    None,
                    f"launches differ in {name} ({sorted(values)})",
                )
            )


def load_run(path: Path) -> RunData:
    """Read a run directory, a JSONL metrics file or a console log.

    Raises InputError if the path does not exist or holds no metric files. Unreadable or malformed
    content is recorded in ``RunData.issues`` instead.
    """
    if not path.exists():
        raise InputError(f"input not found: {path}")
    data = RunData()
    if path.is_dir():
        files = find_segments(path)
        if not files:
            raise InputError(f"no metrics/*.jsonl, *.jsonl or *.log files in directory {path}")
    else:
        files = [path]
    for file in files:
        data.sources.append(str(file))
        if _looks_like_jsonl(file):
            data.formats.append("jsonl")
            parse_jsonl(file, data)
        else:
            data.formats.append("console")
            parse_console(file, data)
    data.steps = dict(sorted(data.steps.items()))
    if path.is_dir():
        read_launch_config(path, data)
        counted = count_val_problems(path)
        if counted is not None:
            data.val_problems, data.val_problems_from = counted
    return data


# --------------------------------------------------------------------------------------------
# Canonical series
# --------------------------------------------------------------------------------------------

Series = list[tuple[int, float]]


@dataclass
class Canonical:
    """The run in the canonical vocabulary. Series hold finite values only, ordered by step."""

    series: dict[str, Series]
    source_keys: dict[str, str]  # canonical name -> key it was read from (first one seen)
    phases: dict[str, Series]  # phase -> seconds per step
    step_time_derived: bool  # True when no step timer was logged (older verl)
    val_key: str | None
    throughput_estimated: bool
    all_steps: list[int]
    val_problems: int | None = None  # problems per validation, when the run tells (RunData)


def _pick_val_key(keys: Iterable[str]) -> str | None:
    best: tuple[int, int, str] | None = None
    for key in keys:
        new = VAL_CORE_KEY.match(key)
        old = VAL_OLD_KEY.match(key) if not new else None
        if not new and not old:
            continue
        src = (new or old).group("src")  # type: ignore[union-attr]
        kind = 0 if new and new.group("var") == "acc" else 1 if new else 2
        rank = (kind, 0 if "gsm8k" in src else 1, key)
        if best is None or rank < best:
            best = rank
    return best[2] if best else None


def _val_aux_keys(val_key: str | None, keys: Iterable[str]) -> dict[str, str]:
    """Canonical name -> val-aux key, for the data source and N of a verl 0.9.1 accuracy key."""
    core = VAL_CORE_KEY.match(val_key) if val_key else None
    if core is None:
        return {}
    found: dict[str, str] = {}
    for key in sorted(keys):
        aux = VAL_AUX_KEY.match(key)
        if aux is None or aux.group("var") == "acc":  # the accuracy itself is val_acc
            continue
        if (aux.group("src"), aux.group("n")) == (core.group("src"), core.group("n")):
            found[VAL_AUX_PREFIX + aux.group("var")] = key
    return found


def canonicalize(data: RunData) -> Canonical:
    """Map the raw keys of both verl generations onto the canonical vocabulary."""
    series: dict[str, Series] = {}
    source_keys: dict[str, str] = {}
    all_keys: set[str] = set()
    for values in data.steps.values():
        all_keys.update(values)
    val_key = _pick_val_key(all_keys)
    aux_keys = _val_aux_keys(val_key, all_keys)
    phase_names = sorted(
        {m.group("phase") for k in all_keys if (m := PHASE_KEY.match(k))} - {"step"}
    )
    phases: dict[str, Series] = {name: [] for name in phase_names}
    step_time_logged = any(key in all_keys for key, _ in METRICS_BY_NAME["step_time"].keys)
    for step, values in data.steps.items():
        for spec in METRICS:
            for key, scale in spec.keys:
                if key in values:
                    value = values[key] * scale
                    if math.isfinite(value):
                        series.setdefault(spec.name, []).append((step, value))
                        source_keys.setdefault(spec.name, key)
                    break
        if val_key and val_key in values and math.isfinite(values[val_key]):
            series.setdefault("val_acc", []).append((step, values[val_key]))
            source_keys["val_acc"] = val_key
        for name, key in aux_keys.items():
            if key in values and math.isfinite(values[key]):
                series.setdefault(name, []).append((step, values[key]))
                source_keys[name] = key
        in_step_total = 0.0
        has_phase = False
        for name in phase_names:
            value = values.get(f"timing_s/{name}", values.get(f"timing/{name}"))
            if value is None or not math.isfinite(value):
                continue
            phases[name].append((step, value))
            if name not in OUTSIDE_STEP_PHASES:
                in_step_total += value
                has_phase = True
        if not step_time_logged and has_phase:
            series.setdefault("step_time", []).append((step, in_step_total))
    if not step_time_logged and "step_time" in series:
        source_keys["step_time"] = "sum of the timing/* phases (no step timer logged)"
    cut = _cut_share(series, data.config.get("max_response_length"))
    if cut:
        series[CUT_SHARE] = cut
        source_keys[CUT_SHARE] = (
            "response_length/clip_ratio at steps whose response_length/max reached "
            f"data.max_response_length={data.config['max_response_length']}, else 0"
        )
    throughput_estimated = False
    if "throughput" not in series:
        estimate = _estimate_throughput(series, data.config)
        if estimate:
            series["throughput"] = estimate
            source_keys["throughput"] = "estimated from train_batch_size, lengths and step time"
            throughput_estimated = True
    return Canonical(
        series=series,
        source_keys=source_keys,
        phases={k: v for k, v in phases.items() if v},
        step_time_derived=not step_time_logged,
        val_key=val_key,
        throughput_estimated=throughput_estimated,
        all_steps=list(data.steps),
        val_problems=data.val_problems,
    )


def _cut_share(series: dict[str, Series], limit: int | None) -> Series:
    """The share of a step's responses cut at data.max_response_length.

    verl 0.9.1's response_length/clip_ratio is the share of responses as long as the batch's
    padded length (trainer/ppo/metric_utils.py ~460, ~576); the v1 trainer pads to the longest
    response of the batch (to_padded_tensor, v1/trainer_base.py ~1919), so when none reached the
    limit it is the share of the longest, not of the cut. The padded length is the limit exactly
    when the longest response (response_length/max) reached it: then the ratio is the share cut
    at the limit; otherwise none was cut. Steps without a clip ratio (older verl) are left out.
    """
    if not limit:
        return []
    longest = dict(series.get("response_length_max", []))
    return [
        (step, ratio if longest[step] >= limit else 0.0)
        for step, ratio in series.get("response_length_clip_ratio", [])
        if step in longest
    ]


def _estimate_throughput(series: dict[str, Series], config: dict[str, int]) -> Series:
    """Tokens/s from lengths and the batch size of a console log's config dump (older verl).

    Matches verl's perf/throughput: (prompt + response tokens of the batch) / step time / GPUs,
    assuming one GPU.
    """
    batch = config.get("train_batch_size")
    if not batch:
        return []
    sequences = batch * config.get("rollout_n", 1)
    prompt = dict(series.get("prompt_length_mean", []))
    response = dict(series.get("response_length_mean", []))
    out: Series = []
    for step, seconds in series.get("step_time", []):
        if step in prompt and step in response and seconds > 0:
            out.append((step, sequences * (prompt[step] + response[step]) / seconds))
    return out

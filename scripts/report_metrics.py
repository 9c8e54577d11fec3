"""Reading verl training metrics: parsing, one vocabulary, merging, summary and health checks.

This module has no third-party dependencies. ``scripts/report.py`` is the command line on top of
it (HTML/SVG rendering, atomic writes, ``--follow``).

Inputs understood
-----------------
* verl's ``file`` logger: one JSON object a line, ``{"step": N, "data": {metric: value}}``.
  orjson writes NaN/inf as ``null``, so ``null`` is read as NaN.
* verl's ``console`` logger: lines ``step:N - key:value - key:value ...``, possibly behind ANSI
  colour codes and a Ray prefix such as ``(TaskRunner pid=1234)``. Only lines that are entirely of
  that form are metrics; model outputs that merely contain "step:" are ignored.
* A run directory: every ``metrics/*.jsonl`` (or ``*.jsonl`` directly inside it), in name order.
  verl's file logger truncates its file on start, so the recipes write one file per launch; on
  overlapping steps the later segment wins, key by key.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------------
# Vocabulary: one canonical name per quantity, with the verl 0.9.1 key first and older keys after.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricSpec:
    """A canonical metric: where it comes from and how to describe it."""

    name: str
    label: str
    keys: tuple[tuple[str, float], ...]  # (source key, scale factor); first key present wins
    unit: str = ""


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("score", "train score (mean)", (("critic/score/mean", 1.0),)),
    MetricSpec("reward", "train reward incl. KL penalty (mean)", (("critic/rewards/mean", 1.0),)),
    MetricSpec(
        "kl", "KL to reference (in reward)", (("actor/reward_kl_penalty", 1.0), ("critic/kl", 1.0))
    ),
    MetricSpec(
        "kl_coef",
        "KL coefficient (in reward)",
        (("actor/reward_kl_penalty_coeff", 1.0), ("critic/kl_coeff", 1.0)),
    ),
    MetricSpec("kl_loss", "KL loss (actor, GRPO-style)", (("actor/kl_loss", 1.0),)),
    MetricSpec("ppo_kl", "KL old->new policy in the update", (("actor/ppo_kl", 1.0),)),
    MetricSpec("entropy", "policy entropy", (("actor/entropy", 1.0), ("actor/entropy_loss", 1.0))),
    MetricSpec("pg_loss", "policy-gradient loss", (("actor/pg_loss", 1.0),)),
    MetricSpec("pg_clipfrac", "PPO clip fraction (actor)", (("actor/pg_clipfrac", 1.0),)),
    MetricSpec("vf_loss", "value loss", (("critic/vf_loss", 1.0),)),
    MetricSpec("vf_clipfrac", "value clip fraction", (("critic/vf_clipfrac", 1.0),)),
    MetricSpec("vf_explained_var", "value explained variance", (("critic/vf_explained_var", 1.0),)),
    MetricSpec("actor_grad_norm", "actor grad norm", (("actor/grad_norm", 1.0),)),
    MetricSpec("critic_grad_norm", "critic grad norm", (("critic/grad_norm", 1.0),)),
    MetricSpec("actor_lr", "actor learning rate", (("actor/lr", 1.0), ("actor/lr(1e-4)", 1e-4))),
    MetricSpec(
        "critic_lr", "critic learning rate", (("critic/lr", 1.0), ("critic/lr(1e-4)", 1e-4))
    ),
    MetricSpec(
        "response_length_mean", "response length (mean)", (("response_length/mean", 1.0),), "tok"
    ),
    MetricSpec(
        "response_length_max", "response length (max)", (("response_length/max", 1.0),), "tok"
    ),
    MetricSpec(
        "response_length_clip_ratio",
        "share of responses cut at max length",
        (("response_length/clip_ratio", 1.0),),
    ),
    MetricSpec("prompt_length_mean", "prompt length (mean)", (("prompt_length/mean", 1.0),), "tok"),
    MetricSpec(
        "step_time", "step time", (("timing_s/step", 1.0), ("perf/time_per_step", 1.0)), "s"
    ),
    MetricSpec("throughput", "throughput per GPU", (("perf/throughput", 1.0),), "tok/s"),
    MetricSpec("total_tokens", "tokens per step", (("perf/total_num_tokens", 1.0),), "tok"),
    MetricSpec("max_memory_gb", "peak GPU memory", (("perf/max_memory_allocated_gb", 1.0),), "GiB"),
)
METRICS_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


def metric_label(name: str) -> str:
    """Human-readable meaning of a canonical metric name."""
    if name == "val_acc":
        return "validation accuracy"
    spec = METRICS_BY_NAME.get(name)
    if spec is None:
        return name
    return f"{spec.label} [{spec.unit}]" if spec.unit else spec.label


# Validation accuracy. verl 0.9.1: val-core/<data source>/acc/mean@N (or reward/mean@N when the
# scorer returns no "acc"); older verl: val/test_score/<data source>.
_VAL_NEW = re.compile(r"^val-core/(?P<src>.+)/(?P<var>acc|reward)/mean@(?P<n>\d+)$")
_VAL_OLD = re.compile(r"^val/test_score/(?P<src>.+)$")

# Step-time phases: timing_s/<phase> (0.9.1) or timing/<phase> (older). Nested keys such as
# timing_s/agent_loop/... are parts of "gen" and are not phases of their own.
_PHASE_KEY = re.compile(r"^(?:timing_s|timing)/(?P<phase>[^/]+)$")
# Phases that verl times outside its "step" timer (validation and profiler hooks).
OUTSIDE_STEP_PHASES: frozenset[str] = frozenset({"testing", "start_profile", "stop_profile"})
# Display order of the usual phases; any other phase follows in name order.
PHASE_ORDER: tuple[str, ...] = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "save_checkpoint",
    "other",
    "testing",
)


# --------------------------------------------------------------------------------------------
# Health-check thresholds: the one place where they are defined. docs/reading-a-ppo-run.md
# repeats this table; keep both in step.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """Constants of the health checks, each with the reason for its value.

    Windows count logged steps. The two real 435-step GSM8K PPO logs (Qwen2.5-0.5B, batch 256)
    were used to make sure none of the warning-level checks fires on a healthy run; the margins
    are noted next to each value.
    """

    # Rolling-median window (steps). Ten steps hide a single noisy batch (a median needs 6 of 10
    # bad points to move) but still localise a change to within about five steps.
    window: int = 10

    # KL growing without bound: the KL series is cut into blocks of max(kl_block_min,
    # steps // kl_blocks) steps; an alarm needs kl_growth_blocks consecutive block-to-block
    # ratios of at least kl_growth_ratio, ending above kl_min_level. Block 0 is not used as a
    # base: KL starts at exactly 0, so any growth out of it is an infinite ratio. Real runs
    # (36-step blocks): one ratio of 1.6-1.7 right after block 0, then <= 1.26, so a single
    # fast block is normal and three in a row is not.
    kl_block_min: int = 10
    kl_blocks: int = 12
    kl_growth_ratio: float = 1.5
    kl_growth_blocks: int = 3
    kl_min_level: float = 0.05

    # KL jump: median of the next kl_jump_after steps above kl_jump_factor x the median of the
    # previous kl_jump_before steps plus kl_jump_abs. The absolute term keeps the normal early
    # rise quiet: the real 256-token run goes from a median of 0.011 to 0.067 around step 33,
    # which stays under 3 x 0.011 + 0.1 = 0.13 (the closest call in either run). Healthy KL on
    # these runs never exceeds 0.35, so +0.1 within 5 steps is a large move.
    kl_jump_before: int = 20
    kl_jump_after: int = 5
    kl_jump_factor: float = 3.0
    kl_jump_abs: float = 0.10

    # Entropy collapse: rolling median below entropy_collapse_frac of the starting level (median
    # of the first window) or below entropy_floor nats/token. The real runs fall from ~0.45 to
    # ~0.055 (12% of the start) while accuracy improves, so the relative bar sits well below that.
    entropy_collapse_frac: float = 0.05
    entropy_floor: float = 0.01

    # Length hacking: the trailing 10-step median response length rises by len_rise (30%) above
    # where it started to climb, while the trailing median score gains at least len_score_gain
    # (5 points of a 0/1 score) over the same span. "Where it started to climb" is the last point
    # of the previous len_lookback steps within len_base_tol (5%, about twice the noise of a
    # 10-step median) of their lowest median, so an earlier, unrelated score gain does not count.
    # Measured this way the real runs' length never rises more than ~5% (it falls by ~30% early
    # while the score climbs); a run creeping up 2-3 points in 100 steps is not "together".
    len_rise: float = 0.30
    len_lookback: int = 100
    len_base_tol: float = 0.05
    len_score_gain: float = 0.05

    # Value loss exploding: rolling median above vf_explode_factor x the lowest rolling median seen
    # so far (ignoring the first window, where a fresh critic's loss is 10-100x its later level).
    # Real runs reach 4.4x (256-token run): while every reward is 0 the critic has nothing to
    # predict and its loss dips to 0.036, then settles near 0.15 once rewards vary. An explosion
    # is an order of magnitude, hence 10x.
    vf_explode_factor: float = 10.0
    # Value loss not decreasing: median of the last quarter >= vf_flat_ratio x median of the
    # first quarter (needs vf_min_steps). Real runs: about 0.6.
    vf_flat_ratio: float = 0.95
    vf_min_steps: int = 40

    # Accuracy flat: the smoothed accuracy (median of 3 validations, or the rolling-median train
    # score when there are fewer than acc_min_val_points validations) has not beaten its best by
    # acc_min_gain (one point of accuracy) for acc_flat_steps steps at the end of the run. A
    # warning if it never rose at all (nothing is being learnt), otherwise a note: a plateau is
    # worth knowing (more steps buy little) but is no fault. The real runs slow down after step
    # ~190 yet still make their last one-point gains at steps 379 (256 tokens) and 339 (512
    # tokens), 50 and 90 steps before their last validation, so neither gets the note.
    acc_min_gain: float = 0.01
    acc_flat_steps: int = 100
    acc_min_val_points: int = 4

    # Clip fraction: rolling median (clip_window steps) at or below clip_low for at least
    # clip_window steps means the ratio never leaves the trust region (update too small, or a
    # single on-policy mini-batch per step); at or above clip_high means each update goes far past
    # it. The real runs' 20-step medians stay within 0.001-0.005 (logged with three decimals);
    # clip_low = 0.0002 is below that resolution, so only a true ~0 fires. clip_high: with the
    # default clip range 0.2, a fifth of all tokens clipped means most of the update is cut off.
    clip_window: int = 20
    clip_low: float = 0.0002
    clip_high: float = 0.20


THRESHOLDS = Thresholds()


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
    # Facts found in a console log's config dump (train_batch_size, rollout_n), for estimates.
    config: dict[str, int] = field(default_factory=dict)

    def merge(self, step: int, values: dict[str, float]) -> None:
        """Add one record; a later record for the same step overrides key by key."""
        self.steps.setdefault(step, {}).update(values)


class InputError(Exception):
    """The input path cannot be used at all (missing, or a directory without metrics)."""


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Optional Ray prefix "(Name pid=123)" or "(Name pid=123, ip=...)", then "step:N - key:value".
_CONSOLE_LINE = re.compile(r"^\s*(?:\([^()]*\bpid=\d+[^()]*\)\s*)?step:(?P<step>\d+)(?P<rest>.*)$")
_FIELD = re.compile(r"^(?P<key>[^\s:][^\s]*?):(?P<value>\S+)$")
# Console values go through pprint: plain numbers, nan/inf, True/False or np.float64(0.5).
_NP_WRAPPED = re.compile(r"^np\.\w+\((?P<inner>.*)\)$")
_CONFIG_INT = {
    "train_batch_size": re.compile(r"['\"]?train_batch_size['\"]?\s*[:=]\s*(\d+)"),
    "rollout_n": re.compile(r"actor_rollout_ref\.rollout\.n=(\d+)"),
}


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


def _read_text(path: Path, data: RunData) -> tuple[list[str], bool] | None:
    """The file's lines, and whether its last line is complete (ends with a newline)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        data.issues.append(ParseIssue(str(path), None, f"cannot read: {exc.strerror or exc}"))
        return None
    # Real console logs carry stray NUL bytes and partial UTF-8 from interleaved Ray output.
    text = raw.decode("utf-8", errors="replace").replace("\x00", "")
    if not text.strip():
        data.issues.append(ParseIssue(str(path), None, "empty file, no metrics in it"))
        return None
    # Split on "\n" only, so line numbers match what an editor shows even when model output
    # holds other Unicode line separators.
    lines = [line.rstrip("\r") for line in text.split("\n")]
    complete = lines[-1] == ""
    if complete:
        lines.pop()
    return lines, complete


def parse_jsonl(path: Path, data: RunData) -> int:
    """Read a verl file-logger JSONL file into ``data``. Returns the number of records kept."""
    read = _read_text(path, data)
    if read is None:
        return 0
    lines, _ = read
    kept = 0
    last_nonblank = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for index, line in enumerate(lines):
        lineno = index + 1
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            what = "truncated last line" if index == last_nonblank else "invalid JSON"
            data.issues.append(
                ParseIssue(str(path), lineno, f"{what} ({exc.msg}, column {exc.colno}), skipped")
            )
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
                values[str(key)] = number
        if bad:
            data.issues.append(
                ParseIssue(str(path), lineno, f"non-numeric value ignored: {', '.join(bad)}")
            )
        data.merge(step, values)
        kept += 1
    if kept == 0:
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
    read = _read_text(path, data)
    if read is None:
        return 0
    lines, complete = read
    kept = 0
    for index, raw_line in enumerate(lines):
        line = _ANSI.sub("", raw_line)
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
        lineno = index + 1
        if cut is None and not complete and index == len(lines) - 1:
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
                values[key] = number
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
    if kept == 0:
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
    for candidate in (directory / "metrics", directory):
        if candidate.is_dir():
            files = sorted(p for p in candidate.glob("*.jsonl") if p.is_file())
            if files:
                return files
    logs = sorted(p for p in directory.glob("*.log") if p.is_file())
    return logs


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


def _pick_val_key(keys: Iterable[str]) -> str | None:
    best: tuple[int, int, str] | None = None
    for key in keys:
        new = _VAL_NEW.match(key)
        old = _VAL_OLD.match(key) if not new else None
        if not new and not old:
            continue
        src = (new or old).group("src")  # type: ignore[union-attr]
        kind = 0 if new and new.group("var") == "acc" else 1 if new else 2
        rank = (kind, 0 if "gsm8k" in src else 1, key)
        if best is None or rank < best:
            best = rank
    return best[2] if best else None


def canonicalize(data: RunData) -> Canonical:
    """Map the raw keys of both verl generations onto the canonical vocabulary."""
    series: dict[str, Series] = {}
    source_keys: dict[str, str] = {}
    all_keys: set[str] = set()
    for values in data.steps.values():
        all_keys.update(values)
    val_key = _pick_val_key(all_keys)
    phase_names = sorted(
        {m.group("phase") for k in all_keys if (m := _PHASE_KEY.match(k))} - {"step"}
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
    )


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


# --------------------------------------------------------------------------------------------
# Robust statistics
# --------------------------------------------------------------------------------------------


def rolling_median(values: Sequence[float], window: int, centered: bool = True) -> list[float]:
    """Median over a sliding window (truncated at the ends)."""
    out: list[float] = []
    n = len(values)
    half = window // 2
    for i in range(n):
        if centered:
            lo, hi = max(0, i - half), min(n, i - half + window)
        else:
            lo, hi = max(0, i - window + 1), i + 1
        out.append(statistics.median(values[lo:hi]))
    return out


def _ranges(steps: Sequence[int], flags: Sequence[bool], min_len: int = 1) -> list[tuple[int, int]]:
    """Runs of consecutive flagged points as (first step, last step), at least min_len long."""
    found: list[tuple[int, int]] = []
    start: int | None = None
    count = 0
    for i, flag in enumerate(flags):
        if flag:
            if start is None:
                start, count = i, 0
            count += 1
        if start is not None and (not flag or i == len(flags) - 1):
            end = i if flag else i - 1
            if count >= min_len:
                found.append((steps[start], steps[end]))
            start = None
    return found


# --------------------------------------------------------------------------------------------
# Health checks
# --------------------------------------------------------------------------------------------


@dataclass
class Finding:
    """One health-check result: what fired, where, and the numbers behind it."""

    check: str
    severity: str  # "error", "warning" or "note"
    metric: str
    start_step: int
    end_step: int
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"[{self.severity}] {self.check} ({self.metric}) steps {self.start_step}-"
            f"{self.end_step}: {self.message}"
        )


def _fmt(value: float) -> str:
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}"
    return f"{value:.3e}"


def check_non_finite(data: RunData) -> list[Finding]:
    """NaN or inf in any logged metric, grouped into runs of consecutive steps."""
    steps = list(data.steps)
    bad_keys = [sorted(k for k, v in data.steps[s].items() if not math.isfinite(v)) for s in steps]
    findings: list[Finding] = []
    for start, end in _ranges(steps, [bool(k) for k in bad_keys]):
        keys: set[str] = set()
        count = 0
        for step, names in zip(steps, bad_keys, strict=True):
            if start <= step <= end:
                keys.update(names)
                count += 1
        shown = sorted(keys)
        listed = ", ".join(shown[:6]) + (f" and {len(shown) - 6} more" if len(shown) > 6 else "")
        findings.append(
            Finding(
                "nan_inf",
                "error",
                shown[0],
                start,
                end,
                f"NaN/inf (or null) in {len(shown)} metric(s) on {count} step(s): {listed}",
                {"keys": shown, "steps": count},
            )
        )
    return findings


def check_kl(canon: Canonical, t: Thresholds) -> list[Finding]:
    """KL growing without bound (consecutive block medians multiplying) or jumping."""
    name = "kl" if "kl" in canon.series else "kl_loss" if "kl_loss" in canon.series else None
    if name is None:
        return []
    points = canon.series[name]
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    findings: list[Finding] = []
    block = max(t.kl_block_min, len(values) // t.kl_blocks)
    blocks = [
        (steps[i], steps[min(i + block, len(steps)) - 1], statistics.median(values[i : i + block]))
        for i in range(0, len(values), block)
        if len(values[i : i + block]) >= max(3, block // 2)
    ]
    growth_run: list[int] = []
    reported_until = -1
    for i in range(2, len(blocks)):  # skip block 0: KL starts at exactly 0
        prev, cur = blocks[i - 1][2], blocks[i][2]
        growing = prev > 0 and cur >= t.kl_growth_ratio * prev
        if growing:
            growth_run.append(i)
        if growth_run and (not growing or i == len(blocks) - 1):
            last = growth_run[-1]
            if len(growth_run) >= t.kl_growth_blocks and blocks[last][2] >= t.kl_min_level:
                first = growth_run[0] - 1
                meds = [round(b[2], 6) for b in blocks[first : last + 1]]
                findings.append(
                    Finding(
                        "kl_unbounded",
                        "warning",
                        name,
                        blocks[first][0],
                        blocks[last][1],
                        f"block medians of {block} steps grew {len(growth_run)} times in a row by "
                        f">= {t.kl_growth_ratio}x: " + " -> ".join(_fmt(m) for m in meds),
                        {"block_steps": block, "block_medians": meds},
                    )
                )
                reported_until = blocks[last][1]
            growth_run = []
    # Jumps: compare the median of the next few steps with the median of the steps before.
    flags: list[bool] = []
    detail: dict[int, tuple[float, float]] = {}
    for i in range(len(values)):
        if i < t.kl_jump_before or i + t.kl_jump_after > len(values):
            flags.append(False)
            continue
        before = statistics.median(values[i - t.kl_jump_before : i])
        after = statistics.median(values[i : i + t.kl_jump_after])
        jump = after > t.kl_jump_factor * max(before, 0.0) + t.kl_jump_abs
        flags.append(jump)
        if jump:
            detail[steps[i]] = (before, after)
    for start, end in _ranges(steps, flags):
        if start <= reported_until and end <= reported_until:
            continue
        before, after = detail[start]
        findings.append(
            Finding(
                "kl_jump",
                "warning",
                name,
                start,
                end,
                f"jump at step {start}: median KL of the next {t.kl_jump_after} steps "
                f"{_fmt(after)} vs {_fmt(before)} over the previous {t.kl_jump_before} "
                f"(> {t.kl_jump_factor}x + {t.kl_jump_abs})",
                {"before": before, "after": after},
            )
        )
    return findings


def check_entropy(canon: Canonical, t: Thresholds) -> list[Finding]:
    """Entropy collapsing towards zero relative to where it started."""
    points = canon.series.get("entropy", [])
    if len(points) < 2 * t.window:
        return []
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    start_level = statistics.median(values[: t.window])
    bar = max(t.entropy_collapse_frac * start_level, t.entropy_floor)
    smooth = rolling_median(values, t.window)
    findings: list[Finding] = []
    for start, end in _ranges(steps, [m < bar for m in smooth], min_len=t.window // 2):
        low = min(m for s, m in zip(steps, smooth, strict=True) if start <= s <= end)
        findings.append(
            Finding(
                "entropy_collapse",
                "warning",
                "entropy",
                start,
                end,
                f"rolling median entropy fell to {_fmt(low)} (start {_fmt(start_level)}; bar "
                f"{_fmt(bar)} = max({t.entropy_collapse_frac} x start, {t.entropy_floor}))",
                {"start_level": start_level, "lowest": low, "bar": bar},
            )
        )
    return findings


def _aligned(canon: Canonical, a: str, b: str) -> tuple[list[int], list[float], list[float]]:
    other = dict(canon.series.get(b, []))
    steps, xs, ys = [], [], []
    for step, value in canon.series.get(a, []):
        if step in other:
            steps.append(step)
            xs.append(value)
            ys.append(other[step])
    return steps, xs, ys


def check_length_hacking(canon: Canonical, t: Thresholds) -> list[Finding]:
    """Response length rising well above its recent low while the score rises with it."""
    steps, lengths, scores = _aligned(canon, "response_length_mean", "score")
    if len(steps) < 3 * t.window:
        return []
    len_med = rolling_median(lengths, t.window, centered=False)
    score_med = rolling_median(scores, t.window, centered=False)
    flags: list[bool] = []
    detail: dict[int, dict[str, float]] = {}
    for i in range(len(steps)):
        # Earlier points of the lookback whose trailing window is full and ends before i's starts.
        candidates = [
            j
            for j in range(t.window - 1, i - t.window + 1)
            if steps[i] - steps[j] <= t.len_lookback
        ]
        if not candidates or min(len_med[j] for j in candidates) <= 0:
            flags.append(False)
            continue
        # The rise starts at the last point still near the low: compare the score from there, so
        # that an earlier, unrelated score gain (e.g. the first learning phase) does not count.
        low = min(len_med[j] for j in candidates)
        lo_index = max(j for j in candidates if len_med[j] <= low * (1 + t.len_base_tol))
        rise = len_med[i] / len_med[lo_index] - 1.0
        gain = score_med[i] - score_med[lo_index]
        hit = rise >= t.len_rise and gain >= t.len_score_gain
        flags.append(hit)
        if hit:
            detail[steps[i]] = {
                "low_step": steps[lo_index],
                "low_length": len_med[lo_index],
                "length": len_med[i],
                "score_then": score_med[lo_index],
                "score": score_med[i],
            }
    findings: list[Finding] = []
    for start, end in _ranges(steps, flags, min_len=max(2, t.window // 2)):
        worst = max(
            (d for s, d in detail.items() if start <= s <= end),
            key=lambda d: d["length"] / d["low_length"],
        )
        first_step = int(worst["low_step"])
        findings.append(
            Finding(
                "length_hacking",
                "warning",
                "response_length_mean",
                min(first_step, start),
                end,
                f"rolling median length {_fmt(worst['low_length'])} -> {_fmt(worst['length'])} "
                f"(+{(worst['length'] / worst['low_length'] - 1) * 100:.0f}%) while score "
                f"{_fmt(worst['score_then'])} -> {_fmt(worst['score'])}",
                worst,
            )
        )
    return findings


def check_value_loss(canon: Canonical, t: Thresholds) -> list[Finding]:
    """Value loss exploding after warm-up, or not decreasing over the run."""
    points = canon.series.get("vf_loss", [])
    if len(points) < 2 * t.window:
        return []
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    smooth = rolling_median(values, t.window)
    findings: list[Finding] = []
    flags: list[bool] = []
    lows: list[float] = []
    low = math.inf
    for i, med in enumerate(smooth):
        if i >= t.window:
            low = min(low, med)
        lows.append(low)
        flags.append(i > t.window and low > 0 and med > t.vf_explode_factor * low)
    for start, end in _ranges(steps, flags, min_len=t.window // 2):
        span = [(m, lo) for s, m, lo in zip(steps, smooth, lows, strict=True) if start <= s <= end]
        peak, base = max(span)
        findings.append(
            Finding(
                "value_loss_explosion",
                "warning",
                "vf_loss",
                start,
                end,
                f"rolling median value loss {_fmt(peak)} = {peak / base:.1f}x its earlier low "
                f"{_fmt(base)} (bar {t.vf_explode_factor}x)",
                {"peak": peak, "earlier_low": base},
            )
        )
    if len(values) >= t.vf_min_steps:
        quarter = len(values) // 4
        first = statistics.median(values[:quarter])
        last = statistics.median(values[-quarter:])
        if first > 0 and last >= t.vf_flat_ratio * first:
            findings.append(
                Finding(
                    "value_loss_not_decreasing",
                    "warning",
                    "vf_loss",
                    steps[0],
                    steps[-1],
                    f"median value loss of the last quarter {_fmt(last)} vs the first quarter "
                    f"{_fmt(first)} (ratio {last / first:.2f} >= {t.vf_flat_ratio})",
                    {"first_quarter": first, "last_quarter": last},
                )
            )
    return findings


def check_accuracy_flat(canon: Canonical, t: Thresholds) -> list[Finding]:
    """Smoothed accuracy not improving for a long stretch at the end of the run."""
    val = canon.series.get("val_acc", [])
    if len(val) >= t.acc_min_val_points:
        name, points, window = "val_acc", val, 3
    else:
        name, points, window = "score", canon.series.get("score", []), t.window
    if len(points) < 2:
        return []
    steps = [s for s, _ in points]
    smooth = rolling_median([v for _, v in points], window)
    best, best_step = smooth[0], steps[0]
    for step, value in zip(steps, smooth, strict=True):
        if value >= best + t.acc_min_gain:
            best, best_step = value, step
    flat_for = steps[-1] - best_step
    if flat_for < t.acc_flat_steps:
        return []
    never = best_step == steps[0]
    lo = min(m for s, m in zip(steps, smooth, strict=True) if s >= best_step)
    hi = max(m for s, m in zip(steps, smooth, strict=True) if s >= best_step)
    if never:
        message = (
            f"smoothed {name} never rose {t.acc_min_gain} above its start {_fmt(smooth[0])} "
            f"in {flat_for} steps (range {_fmt(lo)}-{_fmt(hi)}): nothing is being learnt"
        )
    else:
        message = (
            f"plateau: smoothed {name} has stayed within {_fmt(lo)}-{_fmt(hi)} for {flat_for} "
            f"steps without beating {_fmt(best)} (reached at step {best_step}) by "
            f"{t.acc_min_gain}"
        )
    return [
        Finding(
            "accuracy_flat",
            "warning" if never else "note",
            name,
            best_step,
            steps[-1],
            message,
            {"best_smoothed": best, "since_step": best_step, "flat_steps": flat_for},
        )
    ]


def check_clip_fraction(canon: Canonical, t: Thresholds) -> list[Finding]:
    """PPO clip fraction stuck at ~0 or persistently very high."""
    points = canon.series.get("pg_clipfrac", [])
    if len(points) < t.clip_window:
        return []
    steps = [s for s, _ in points]
    smooth = rolling_median([v for _, v in points], t.clip_window)
    findings: list[Finding] = []
    for check, flags, why in (
        (
            "clip_fraction_zero",
            [m <= t.clip_low for m in smooth],
            f"<= {t.clip_low}: the probability ratio never leaves the clip range (updates too "
            "small, or a single on-policy mini-batch per step)",
        ),
        (
            "clip_fraction_high",
            [m >= t.clip_high for m in smooth],
            f">= {t.clip_high}: updates push far past the trust region",
        ),
    ):
        for start, end in _ranges(steps, flags, min_len=t.clip_window):
            span = [m for s, m in zip(steps, smooth, strict=True) if start <= s <= end]
            findings.append(
                Finding(
                    check,
                    "warning",
                    "pg_clipfrac",
                    start,
                    end,
                    f"rolling median clip fraction {_fmt(min(span))}-{_fmt(max(span))} "
                    f"over {len(span)} steps, {why}",
                    {"min": min(span), "max": max(span), "steps": len(span)},
                )
            )
    return findings


def health_checks(data: RunData, canon: Canonical, t: Thresholds = THRESHOLDS) -> list[Finding]:
    """Run every check; findings are ordered by severity, then step."""
    findings = (
        check_non_finite(data)
        + check_kl(canon, t)
        + check_entropy(canon, t)
        + check_length_hacking(canon, t)
        + check_value_loss(canon, t)
        + check_accuracy_flat(canon, t)
        + check_clip_fraction(canon, t)
    )
    order = {"error": 0, "warning": 1, "note": 2}
    return sorted(findings, key=lambda f: (order[f.severity], f.start_step, f.check))


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def time_breakdown(canon: Canonical) -> dict[str, Any]:
    """Seconds per phase over the run, with "other" = step time not covered by a phase.

    Wall-clock is the sum of step times plus the phases verl times outside its step timer
    (validation). For older logs without a step timer the step time is the sum of the phases.
    """
    step_time = dict(canon.series.get("step_time", []))
    totals: dict[str, float] = {}
    other_by_step: Series = []
    overrun = 0.0
    per_step_in: dict[int, float] = {}
    for phase, points in canon.phases.items():
        totals[phase] = sum(v for _, v in points)
        if phase not in OUTSIDE_STEP_PHASES:
            for step, value in points:
                per_step_in[step] = per_step_in.get(step, 0.0) + value
    for step, seconds in step_time.items():
        rest = seconds - per_step_in.get(step, 0.0)
        overrun = max(overrun, -rest)
        other_by_step.append((step, max(rest, 0.0)))
    other_total = sum(v for _, v in other_by_step)
    if other_total > 0:
        totals["other"] = other_total
    steps_total = sum(step_time.values())
    outside = sum(v for k, v in totals.items() if k in OUTSIDE_STEP_PHASES)
    wall = steps_total + outside
    ordered = sorted(totals, key=lambda k: (PHASE_ORDER.index(k) if k in PHASE_ORDER else 99, k))
    denom = sum(totals.values())
    return {
        "wall_clock_s": wall,
        "step_time_total_s": steps_total,
        "step_time_derived": canon.step_time_derived,
        "max_phase_overrun_s": overrun,
        "phases": {
            k: {
                "total_s": totals[k],
                "share": totals[k] / denom if denom else 0.0,
                "inside_step": k not in OUTSIDE_STEP_PHASES,
            }
            for k in ordered
        },
        "other_by_step": other_by_step,
    }


def _median_or_none(points: Series) -> float | None:
    return statistics.median(v for _, v in points) if points else None


def summarize(
    data: RunData,
    canon: Canonical,
    findings: list[Finding],
    thresholds: Thresholds = THRESHOLDS,
) -> dict[str, Any]:
    """Everything a reader (or a script) needs, as plain JSON-able values."""
    steps = canon.all_steps
    val = canon.series.get("val_acc", [])
    best = final = None
    if val:
        top = max(v for _, v in val)
        at = [s for s, v in val if v == top]
        best = {"value": top, "step": at[0], "also_at": at[1:]}
        final = {"value": val[-1][1], "step": val[-1][0]}
    score = canon.series.get("score", [])
    breakdown = time_breakdown(canon)
    breakdown.pop("other_by_step")
    throughput = canon.series.get("throughput", [])
    tokens = canon.series.get("total_tokens", [])
    step_time = dict(canon.series.get("step_time", []))
    # Overall rate = tokens of all steps / time of those steps (a time-weighted mean).
    if tokens and step_time:
        total_tok = sum(v for s, v in tokens if s in step_time)
        secs = sum(step_time[s] for s, _ in tokens if s in step_time)
    else:
        total_tok = sum(v * step_time[s] for s, v in throughput if s in step_time)
        secs = sum(step_time[s] for s, _ in throughput if s in step_time)
    tokens_per_s = total_tok / secs if secs else None
    gaps = [b for a, b in zip(steps, steps[1:], strict=False) if b != a + 1]
    return {
        "sources": data.sources,
        "formats": sorted(set(data.formats)),
        "steps": {
            "count": len(steps),
            "first": steps[0] if steps else None,
            "last": steps[-1] if steps else None,
            "gaps_before": gaps,
        },
        "validation": {
            "key": canon.val_key,
            "points": len(val),
            "best": best,
            "final": final,
            "first": {"value": val[0][1], "step": val[0][0]} if val else None,
        },
        "train_score": {
            "first": score[0][1] if score else None,
            "final": score[-1][1] if score else None,
            "final_median_10": _median_or_none(score[-10:]) if score else None,
        },
        "time": breakdown,
        "throughput": {
            "tokens_per_s": tokens_per_s,
            "median_tokens_per_s_per_gpu": _median_or_none(throughput),
            "estimated": canon.throughput_estimated,
            "basis": (
                f"estimated: train_batch_size={data.config.get('train_batch_size')} x "
                f"rollout.n={data.config.get('rollout_n', 1)} x (prompt + response length) / "
                "step time, one GPU"
                if canon.throughput_estimated
                else "perf/throughput and perf/total_num_tokens as logged"
                if throughput
                else "not logged"
            ),
        },
        "metrics": {
            name: {
                "label": metric_label(name),
                "key": canon.source_keys.get(name),
                "points": len(points),
                "first": points[0][1],
                "last": points[-1][1],
                "min": min(v for _, v in points),
                "median": statistics.median(v for _, v in points),
                "max": max(v for _, v in points),
            }
            for name, points in sorted(canon.series.items())
        },
        "health": [f.as_dict() for f in findings],
        "health_counts": {
            sev: sum(f.severity == sev for f in findings) for sev in ("error", "warning", "note")
        },
        "parse_issues": [str(issue) for issue in data.issues],
        "thresholds": asdict(thresholds),
    }


def analyse(
    path: Path, thresholds: Thresholds = THRESHOLDS
) -> tuple[RunData, Canonical, list[Finding], dict[str, Any]]:
    """Load, canonicalise, check and summarise one input."""
    data = load_run(path)
    canon = canonicalize(data)
    findings = health_checks(data, canon, thresholds)
    return data, canon, findings, summarize(data, canon, findings, thresholds)

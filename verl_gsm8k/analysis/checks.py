"""The report's health checks: the watchdog's rules over every step, and the whole-run trends."""

import bisect
import math
import statistics
from typing import Any

from verl_gsm8k.analysis.finding import Finding, aligned, fmt, rolling_median, spans
from verl_gsm8k.analysis.parse import Canonical, RunData
from verl_gsm8k.guard.rules import judge_run, trained_steps
from verl_gsm8k.guard.thresholds import THRESHOLDS, Thresholds
from verl_gsm8k.guard.vocab import NAME_OF_KEY

DOCS = "what to change: docs/reading-a-ppo-run.md"
_EPS = 1e-9  # a drop of exactly the bar counts (0.5 - 0.4 is 0.0999... in floating point)
DROPPED_SUFFIXES = ("/filter_groups/evicted_samples", "/filter_groups/discarded_surplus_samples")
STEP_KEY = "timing_s/step"  # logged by a training step, not by a validation-only one


def step_findings(data: RunData, t: Thresholds) -> list[Finding]:
    """A finding per run of trained steps tripping one rule."""
    steps = trained_steps(data.steps)
    index, by_rule = {step: i for i, step in enumerate(steps)}, {}
    for step, trip in judge_run(data.steps, t, data.config.get("max_response_length")):
        by_rule.setdefault(trip.rule, {})[index[step]] = trip
    findings = []
    for at in by_rule.values():
        for a, b in spans([i in at for i in range(len(steps))]):
            trip, first = at[a], max(0, a - at[a].span + 1)
            before = steps[first - 1] if first else None
            more = f" and the {b - a} trained steps to {steps[b]}" if b > a else ""
            since = "its first trained step" if before is None else f"the step before: {before}"
            findings.append(Finding(
                trip.rule, "error" if trip.stops else "warning",
                NAME_OF_KEY.get(trip.metric, trip.metric), steps[first], steps[b],
                f"{trip.rule} at step {steps[a]}{more}: {trip.metric} = {trip.value:.4g} "
                f"({trip.threshold}); {since}",
                {"key": trip.metric, "value": trip.value, "threshold": trip.threshold,
                 "weights": trip.weights, "steps": b - a + 1, "step_before": before},
            ))  # fmt: skip
    return findings


def check_accuracy_flat(canon: Canonical, t: Thresholds) -> list[Finding]:
    val = canon.series.get("val_acc", [])
    name, points, window = ("val_acc", val, 3) if len(val) >= t.acc_min_val_points else (
        "score", canon.series.get("score", []), t.window)  # fmt: skip
    if len(points) < 2:
        return []
    steps, smooth = [s for s, _ in points], rolling_median([v for _, v in points], window)
    best, best_step = smooth[0], steps[0]
    for step, value in zip(steps, smooth, strict=True):
        if value >= best + t.acc_min_gain:
            best, best_step = value, step
    flat_for = steps[-1] - best_step
    if flat_for < t.acc_flat_steps:
        return []
    after = [m for s, m in zip(steps, smooth, strict=True) if s >= best_step]
    lo, hi, never = fmt(min(after)), fmt(max(after)), best_step == steps[0]
    message = (f"smoothed {name} never rose {t.acc_min_gain} above its start {fmt(smooth[0])} "
               f"in {flat_for} steps (range {lo}-{hi}): nothing is being learnt" if never else
               f"plateau: smoothed {name} has stayed within {lo}-{hi} for {flat_for} steps "
               f"without beating {fmt(best)} (reached at step {best_step}) by "
               f"{t.acc_min_gain}")  # fmt: skip
    return [Finding("accuracy_flat", "warning" if never else "note", name, best_step, steps[-1],
                    message, {"best_smoothed": best, "since_step": best_step,
                              "flat_steps": flat_for})]  # fmt: skip


def accuracy_drop_bar(best: float, later: float, problems: int | None,
                      t: Thresholds) -> tuple[float, str]:  # fmt: skip
    """How far below ``best`` is clearly below, and why."""
    bar = max(t.acc_drop_floor, min(t.acc_drop_abs, t.acc_drop_rel * best))
    why = f"max({t.acc_drop_floor}, min({t.acc_drop_abs}, {t.acc_drop_rel} x best))"
    if problems:
        p = min(max((best + later) / 2, 0.0), 1.0)
        noise = t.acc_drop_z * math.sqrt(2 * p * (1 - p) / problems)
        if noise > bar:
            bar, why = noise, f"{t.acc_drop_z} standard errors of a difference of two evaluations"
    return bar, why + (f" on {problems} problems" if problems else ", number of problems not known")


def check_accuracy_below_best(canon: Canonical, t: Thresholds) -> list[Finding]:
    val = canon.series.get("val_acc", [])
    if len(val) < 2:
        return []
    best = max(v for _, v in val)
    best_step = next(s for s, v in val if v == best)
    last_step, last = val[-1]
    bar, why = accuracy_drop_bar(best, last, canon.val_problems, t)
    if last_step == best_step or best - last < bar - _EPS:
        return []
    below = next(i for i, (_, v) in enumerate(reversed(val)) if best - v < bar - _EPS)
    since, start = val[-below][0], best_step == val[0][0] == 0
    keep = ("the model before training was better" if start else
            f"the step-{best_step} model was better: keep its checkpoint")  # fmt: skip
    message = (f"validation accuracy ended at {last:.3g} (step {last_step}), {best - last:.3g} "
               f"below its best {best:.3g} (step {best_step}{', before training' * start}), at "
               f"least {bar:.3g} below it for its last {below} evaluation(s), since step "
               f"{since} (bar: {why}); {keep} ({DOCS})")  # fmt: skip
    evidence = {"best_step": best_step, "best": best, "last_step": last_step, "last": last,
                "drop": best - last, "bar": bar, "problems": canon.val_problems,
                "evaluations_below": below, "below_since_step": since}  # fmt: skip
    return [Finding("accuracy_below_best", "warning", "val_acc", best_step, last_step, message,
                    evidence)]  # fmt: skip


def score_range(canon: Canonical, score: str) -> tuple[float, float] | None:
    lows = [v for _, v in canon.series.get(f"{score}_min", [])]
    highs = [v for _, v in canon.series.get(f"{score}_max", [])]
    return (min(lows), max(highs)) if lows and highs and max(highs) > min(lows) else None


def _converged(bounds: tuple[float, float] | None, value: float, t: Thresholds) -> bool:
    return bounds is not None and bounds[1] - value <= t.kl_gain_headroom * (bounds[1] - bounds[0])


def _thirds(values: list[float]) -> tuple[float, float, float]:
    k = len(values) // 3
    return (statistics.median(values[:k]), statistics.median(values[k : len(values) - k]),
            statistics.median(values[len(values) - k :]))  # fmt: skip


def check_kl_without_score_gain(canon: Canonical, t: Thresholds) -> list[Finding]:
    s = canon.series
    kl = next((n for n in ("kl", "kl_loss") if n in s), None)
    score = next((n for n in ("score", "reward") if n in s), None)
    if kl is None or score is None:
        return []
    steps, scores, kls = aligned(canon, score, kl)
    size = int(len(steps) * t.kl_gain_frac)
    if size < max(t.kl_gain_min_steps, 3):
        return []
    steps, (s0, _, s2), (k0, k1, k2) = steps[-size:], _thirds(scores[-size:]), _thirds(kls[-size:])
    growing = (k0 < k1 < k2 and k2 - k1 >= t.kl_gain_late_share * (k2 - k0)
               and k2 >= t.kl_gain_ratio * k0 and k2 - k0 >= t.kl_gain_abs)  # fmt: skip
    if not growing or s2 - s0 >= t.kl_gain_score_min:
        return []
    ratio = f", {k2 / k0:.1f}x" if k0 > 0 else ""
    evidence: dict[str, Any] = {"window_steps": size, "score_metric": score, "score_start": s0,
                                "score_end": s2, "kl_start": k0, "kl_middle": k1,
                                "kl_end": k2}  # fmt: skip
    message = (f"over steps {steps[0]}-{steps[-1]} (the last {size} steps) the train score "
               f"({canon.source_keys.get(score, score)}) went {fmt(s0)} -> {fmt(s2)} while the "
               f"KL to the reference ({canon.source_keys.get(kl, kl)}) kept growing {fmt(k0)} -> "
               f"{fmt(k1)} -> {fmt(k2)} (medians of its thirds{ratio})")  # fmt: skip
    bounds, severity = score_range(canon, score), "warning"
    if bounds is not None and _converged(bounds, s0, t):
        severity = "note"
        evidence.update(score_floor=bounds[0], score_ceiling=bounds[1], converged=True)
        message += (f": the score sits near the best a response scores (range "
                    f"{fmt(bounds[0])}..{fmt(bounds[1])}), the run has converged; a shorter run "
                    f"scores the same ({DOCS})")  # fmt: skip
    else:
        message += f": the policy drifts and buys no reward ({DOCS})"
    return [Finding("kl_without_score_gain", severity, kl, steps[0], steps[-1], message, evidence)]


def check_length_hacking(canon: Canonical, t: Thresholds) -> list[Finding]:
    steps, lengths, scores = aligned(canon, "response_length_mean", "score")
    if len(steps) < 3 * t.window:
        return []
    length = rolling_median(lengths, t.window, centered=False)
    score = rolling_median(scores, t.window, centered=False)
    first, flags, detail = 0, [], []
    for i in range(len(steps)):
        while steps[i] - steps[first] > t.len_lookback:
            first += 1
        # the climb starts at the last point near the low within len_lookback before i's window
        near = range(max(first, t.window - 1), i - t.window + 1)
        bottom, hit = min((length[j] for j in near), default=0.0), None
        if bottom > 0:
            low = max(j for j in near if length[j] <= bottom * (1 + t.len_base_tol))
            if (length[i] / length[low] - 1 >= t.len_rise
                    and score[i] - score[low] >= t.len_score_gain):  # fmt: skip
                hit = {"low_step": steps[low], "low_length": length[low], "length": length[i],
                       "score_then": score[low], "score": score[i]}  # fmt: skip
        flags.append(hit is not None)
        detail.append(hit)
    findings = []
    for a, b in spans(flags, min_len=max(2, t.window // 2)):
        worst = max((d for d in detail[a : b + 1] if d),
                    key=lambda d: d["length"] / d["low_length"])  # fmt: skip
        rise = (worst["length"] / worst["low_length"] - 1) * 100
        findings.append(Finding(
            "length_hacking", "warning", "response_length_mean",
            min(int(worst["low_step"]), steps[a]), steps[b],
            f"rolling median length {fmt(worst['low_length'])} -> {fmt(worst['length'])} "
            f"(+{rise:.0f}%) while score {fmt(worst['score_then'])} -> {fmt(worst['score'])}",
            worst,
        ))  # fmt: skip
    return findings


def check_value_loss_not_decreasing(canon: Canonical, t: Thresholds) -> list[Finding]:
    points = canon.series.get("vf_loss", [])
    values, quarter = [v for _, v in points], len(points) // 4
    if len(values) < t.vf_min_steps:
        return []
    first, last = statistics.median(values[:quarter]), statistics.median(values[-quarter:])
    if not first > 0 or last < t.vf_flat_ratio * first:
        return []
    return [Finding("value_loss_not_decreasing", "warning", "vf_loss", points[0][0],
                    points[-1][0], f"median value loss of the last quarter {fmt(last)} vs the "
                    f"first quarter {fmt(first)} (ratio {last / first:.2f} >= {t.vf_flat_ratio})",
                    {"first_quarter": first, "last_quarter": last})]  # fmt: skip


def check_clip_fraction_zero(canon: Canonical, t: Thresholds) -> list[Finding]:
    points, bounds = canon.series.get("pg_clipfrac", []), score_range(canon, "score")
    smooth, findings = rolling_median([v for _, v in points], t.clip_window), []
    score = canon.series.get("score", [])
    steps, values = [s for s, _ in score], [v for _, v in score]
    for a, b in spans([m <= t.clip_low for m in smooth], min_len=t.clip_window):
        start, end, span = points[a][0], points[b][0], smooth[a : b + 1]
        scores = values[bisect.bisect_left(steps, start) : bisect.bisect_right(steps, end)]
        median = statistics.median(scores) if scores else math.nan
        near = _converged(bounds, median, t)
        message = (f"rolling median clip fraction {fmt(min(span))}-{fmt(max(span))} over "
                   f"{len(span)} steps, <= {t.clip_low}: the ratio never leaves the clip range "
                   "(updates too small, or one on-policy mini-batch a step)")  # fmt: skip
        if near:
            message += (f"; but the train score sits at {fmt(median)}, near the best a "
                        "response scores: converged")  # fmt: skip
        findings.append(Finding("clip_fraction_zero", "note" if near else "warning",
                                "pg_clipfrac", start, end, message,
                                {"min": min(span), "max": max(span), "steps": len(span),
                                 "converged": near, "train_score": median}))  # fmt: skip
    return findings


def check_rollout_gap(data: RunData, canon: Canonical, t: Thresholds) -> list[Finding]:
    points = canon.series.get("rollout_probs_diff_mean", [])
    window = min(t.window, len(points))
    smooth = rolling_median([v for _, v in points], window)
    corrected = any(key.startswith(("rollout_corr/rollout_is", "rollout_corr/rollout_rs"))
                    for values in data.steps.values() for key in values)  # fmt: skip
    fix = ("the rollout correction is on (rollout_corr/rollout_is* logged): look for the cause"
           if corrected else "verl's correction: algorithm.rollout_correction.rollout_is=token "
           "or rollout_rs (verl docs/algo/rollout_corr.md)")  # fmt: skip
    findings = []
    levels = (("warning", t.mismatch_mean_harmful, math.inf),
              ("note", t.mismatch_mean_normal, t.mismatch_mean_harmful))  # fmt: skip
    for severity, low, high in levels:
        for a, b in spans([low < m <= high for m in smooth], min_len=max(1, window // 2)):
            peak = max(smooth[a : b + 1])
            findings.append(Finding(
                "rollout_gap", severity, "rollout_probs_diff_mean", points[a][0], points[b][0],
                f"mean |p_rollout - p_training| per token ({window}-step median) up to "
                f"{fmt(peak)} > {low} (verl's FAQ: a precision problem of the inference engine "
                f"above {t.mismatch_mean_harmful}); {fix}",
                {"peak_median": peak, "bar": low, "correction_on": corrected},
            ))  # fmt: skip
    return findings


def dropped_groups(metrics: dict[str, float]) -> float:
    """Prompt groups DAPO's dynamic sampling dropped at a step (0: none logged)."""
    return sum(v for k, v in metrics.items() if k.endswith(DROPPED_SUFFIXES))


def check_dropped_groups(data: RunData, t: Thresholds) -> list[Finding]:
    batch = data.config.get("train_batch_size")
    if not batch or not any(k.endswith(DROPPED_SUFFIXES) for m in data.steps.values() for k in m):
        return []
    steps = [s for s, m in data.steps.items() if STEP_KEY in m]
    dropped = [dropped_groups(data.steps[s]) for s in steps]
    window = min(t.window, len(steps))
    smooth = rolling_median([d / (d + batch) for d in dropped], window)
    findings = []
    for a, b in spans([m > t.dropped_groups_share for m in smooth], min_len=max(1, window // 2)):
        peak, share = max(range(a, b + 1), key=lambda i: dropped[i]), max(smooth[a : b + 1])
        findings.append(Finding(
            "dropped_groups", "warning", "filter_groups/evicted_samples", steps[a], steps[b],
            f"dynamic sampling dropped {share:.0%} of the prompt groups the steps generated "
            f"({window}-step median; bar {t.dropped_groups_share:.0%}), up to "
            f"{dropped[peak]:.0f} groups for {batch} kept at step {steps[peak]}: most prompts "
            "are answered all right or all wrong, and verl 0.9.1 ignores "
            "filter_groups.max_num_gen_batches (docs/algorithms.md)",
            {"peak_share": share, "batch": batch},
        ))  # fmt: skip
    return findings


def health_checks(data: RunData, canon: Canonical, t: Thresholds = THRESHOLDS,
                  more: list[Finding] | None = None) -> list[Finding]:  # fmt: skip
    findings = [
        *(more or []), *step_findings(data, t), *check_accuracy_flat(canon, t),
        *check_accuracy_below_best(canon, t), *check_kl_without_score_gain(canon, t),
        *check_length_hacking(canon, t), *check_value_loss_not_decreasing(canon, t),
        *check_clip_fraction_zero(canon, t),
        *check_rollout_gap(data, canon, t), *check_dropped_groups(data, t),
    ]  # fmt: skip
    order = {"error": 0, "warning": 1, "note": 2}
    return sorted(findings, key=lambda f: (order[f.severity], f.start_step, f.check))

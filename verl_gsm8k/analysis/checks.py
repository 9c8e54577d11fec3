"""Health checks of a PPO/GRPO run, on the canonical series that ``parse`` builds: NaN/inf and
where a sick run turned, KL, entropy, length, value loss, the critic diverging from its start,
flat accuracy, clip fraction, rollout/training mismatch (its trend; its level against verl's
FAQ); and ``health_checks``, which runs every check of the report, those of ``learning``
(accuracy below its best, KL growing without a score gain) and ``sampling`` (DAPO's dropped
groups) included.

Standard library only. Every constant lives in ``thresholds.Thresholds``;
docs/reading-a-ppo-run.md repeats them with what to change when a check fires.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from verl_gsm8k.analysis.finding import Finding, aligned, fmt, rolling_median, spans
from verl_gsm8k.analysis.learning import (
    check_accuracy_below_best,
    check_kl_without_score_gain,
    score_range,
)
from verl_gsm8k.analysis.parse import Canonical, RunData
from verl_gsm8k.analysis.sampling import check_dropped_groups
from verl_gsm8k.analysis.thresholds import THRESHOLDS, Thresholds
from verl_gsm8k.analysis.vocab import METRICS_BY_NAME

# The metrics whose first NaN/inf/null marks where a sick run turned
# (check_first_non_finite).
TURN_METRICS = ("score", "reward", "pg_loss", "vf_loss", "kl_loss", "actor_grad_norm",
                "critic_grad_norm")  # fmt: skip


def check_non_finite(data: RunData) -> list[Finding]:
    """NaN or inf in any logged metric, grouped into runs of consecutive steps."""
    steps = list(data.steps)
    bad_keys = [sorted(k for k, v in data.steps[s].items() if not math.isfinite(v)) for s in steps]
    findings: list[Finding] = []
    for a, b in spans([bool(k) for k in bad_keys]):
        start, end, count = steps[a], steps[b], b - a + 1
        shown = sorted(set().union(*bad_keys[a : b + 1]))
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


def check_first_non_finite(data: RunData, canon: Canonical) -> list[Finding]:
    """Where a sick run turned: the first step whose loss, grad norm, score or validation accuracy
    is NaN, inf or null (verl's file logger writes NaN as null), and the last step before it."""
    keys = {key for name in TURN_METRICS for key, _ in METRICS_BY_NAME[name].keys}
    keys |= {canon.val_key} if canon.val_key else set()
    logged = [(step, values) for step, values in data.steps.items() if keys & values.keys()]
    bad = [sorted(k for k in keys & values.keys() if not math.isfinite(values[k]))
           for _, values in logged]  # fmt: skip
    sick = [i for i, keys_bad in enumerate(bad) if keys_bad]
    if not sick:
        return []
    first, last = sick[0], sick[-1]
    turned, shown = logged[first][0], bad[first]
    listed = ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
    before = logged[first - 1][0] if first else None
    message = (
        f"the run turned at step {turned}: {listed} NaN, inf or null; {len(sick)} of the "
        f"{len(logged) - first} steps logged from there are not finite; "
        + ("from its first logged step" if before is None else f"last finite step: {before}")
        + (f"; finite again from step {logged[last + 1][0]}" if last + 1 < len(logged) else "")
    )
    evidence = {"first_step": turned, "keys": shown, "last_finite_step": before,
                "steps_not_finite": len(sick)}  # fmt: skip
    return [Finding("first_non_finite", "error", shown[0], turned, logged[last][0], message,
                    evidence)]  # fmt: skip


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
                        f">= {t.kl_growth_ratio}x: " + " -> ".join(fmt(m) for m in meds),
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
    for a, b in spans(flags):
        start, end = steps[a], steps[b]
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
                f"{fmt(after)} vs {fmt(before)} over the previous {t.kl_jump_before} "
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
    for a, b in spans([m < bar for m in smooth], min_len=t.window // 2):
        start, end, low = steps[a], steps[b], min(smooth[a : b + 1])
        findings.append(
            Finding(
                "entropy_collapse",
                "warning",
                "entropy",
                start,
                end,
                f"rolling median entropy fell to {fmt(low)} (start {fmt(start_level)}; bar "
                f"{fmt(bar)} = max({t.entropy_collapse_frac} x start, {t.entropy_floor}))",
                {"start_level": start_level, "lowest": low, "bar": bar},
            )
        )
    return findings


def check_length_hacking(canon: Canonical, t: Thresholds) -> list[Finding]:
    """Response length rising well above its recent low while the score rises with it."""
    steps, lengths, scores = aligned(canon, "response_length_mean", "score")
    if len(steps) < 3 * t.window:
        return []
    len_med = rolling_median(lengths, t.window, centered=False)
    score_med = rolling_median(scores, t.window, centered=False)
    flags: list[bool] = []
    detail: list[dict[str, float] | None] = []
    # Candidates for point i: earlier points within len_lookback steps whose trailing window is
    # full and ends before i's starts, i.e. indices first..i-window. ``lows`` holds the
    # candidates whose median is below every later candidate's (a sliding minimum: indices and
    # medians both increasing), so the lowest is lows[0], and the last candidate near the low is
    # the last entry of lows near it. Each index enters and leaves lows once: linear time.
    lows: deque[int] = deque()
    first = 0
    for i in range(len(steps)):
        newest = i - t.window
        if newest >= t.window - 1:
            while lows and len_med[lows[-1]] >= len_med[newest]:
                lows.pop()
            lows.append(newest)
        while steps[i] - steps[first] > t.len_lookback:
            first += 1
        while lows and lows[0] < max(first, t.window - 1):
            lows.popleft()
        if not lows or len_med[lows[0]] <= 0:
            flags.append(False)
            detail.append(None)
            continue
        # The rise starts at the last point still near the low: compare the score from there, so
        # that an earlier, unrelated score gain (e.g. the first learning phase) does not count.
        near = len_med[lows[0]] * (1 + t.len_base_tol)
        lo_index = lows[0]
        for j in lows:
            if len_med[j] > near:
                break
            lo_index = j
        rise = len_med[i] / len_med[lo_index] - 1.0
        gain = score_med[i] - score_med[lo_index]
        hit = rise >= t.len_rise and gain >= t.len_score_gain
        flags.append(hit)
        detail.append(
            {
                "low_step": steps[lo_index],
                "low_length": len_med[lo_index],
                "length": len_med[i],
                "score_then": score_med[lo_index],
                "score": score_med[i],
            }
            if hit
            else None
        )
    findings: list[Finding] = []
    for a, b in spans(flags, min_len=max(2, t.window // 2)):
        start, end = steps[a], steps[b]
        worst = max(
            (d for d in detail[a : b + 1] if d is not None),
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
                f"rolling median length {fmt(worst['low_length'])} -> {fmt(worst['length'])} "
                f"(+{(worst['length'] / worst['low_length'] - 1) * 100:.0f}%) while score "
                f"{fmt(worst['score_then'])} -> {fmt(worst['score'])}",
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
    for a, b in spans(flags, min_len=t.window // 2):
        start, end = steps[a], steps[b]
        peak, base = max(zip(smooth[a : b + 1], lows[a : b + 1], strict=True))
        findings.append(
            Finding(
                "value_loss_explosion",
                "warning",
                "vf_loss",
                start,
                end,
                f"rolling median value loss {fmt(peak)} = {peak / base:.1f}x its earlier low "
                f"{fmt(base)} (bar {t.vf_explode_factor}x)",
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
                    f"median value loss of the last quarter {fmt(last)} vs the first quarter "
                    f"{fmt(first)} (ratio {last / first:.2f} >= {t.vf_flat_ratio})",
                    {"first_quarter": first, "last_quarter": last},
                )
            )
    return findings


def check_critic_divergence(canon: Canonical, t: Thresholds) -> list[Finding]:
    """The critic diverging: value loss far above the run's first logged one and above a floor
    that a critic whose values stay within 0/1 returns never reaches, from the second step on;
    the critic's grad norm at the worst step against its own first value is in the message and
    the evidence."""
    points = [(s, v) for s, v in canon.series.get("vf_loss", []) if math.isfinite(v)]
    if len(points) < 2:
        return []
    start_step, start = points[0]
    bar = max(t.critic_start_factor * start, t.critic_loss_floor)
    flags = [False] + [v > bar for _, v in points[1:]]
    norms = [(s, v) for s, v in canon.series.get("critic_grad_norm", []) if math.isfinite(v)]
    norm_at = dict(norms)
    findings: list[Finding] = []
    for a, b in spans(flags):
        peak_step, peak = max(points[a : b + 1], key=lambda p: p[1])
        times = f" = {peak / start:.0f}x" if start > 0 else ""
        message = (
            f"critic/vf_loss up to {fmt(peak)} at step {peak_step}{times} its start {fmt(start)} "
            f"(step {start_step}; bar {fmt(bar)} = max({t.critic_start_factor:g} x start, "
            f"{t.critic_loss_floor:g})): the critic diverges"
        )
        evidence: dict[str, Any] = {"start": start, "peak": peak, "peak_step": peak_step,
                                    "bar": bar}  # fmt: skip
        if norms and peak_step in norm_at and norms[0][1] > 0:
            first_norm, norm = norms[0][1], norm_at[peak_step]
            message += (
                f"; critic/grad_norm there {fmt(norm)} = {norm / first_norm:.1f}x its start "
                f"{fmt(first_norm)}"
            )
            evidence |= {"grad_norm": norm, "grad_norm_start": first_norm}
        findings.append(Finding("critic_divergence", "warning", "vf_loss", points[a][0],
                                points[b][0], message, evidence))  # fmt: skip
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
            f"smoothed {name} never rose {t.acc_min_gain} above its start {fmt(smooth[0])} "
            f"in {flat_for} steps (range {fmt(lo)}-{fmt(hi)}): nothing is being learnt"
        )
    else:
        message = (
            f"plateau: smoothed {name} has stayed within {fmt(lo)}-{fmt(hi)} for {flat_for} "
            f"steps without beating {fmt(best)} (reached at step {best_step}) by "
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
        for a, b in spans(flags, min_len=t.clip_window):
            start, end, span = steps[a], steps[b], smooth[a : b + 1]
            evidence: dict[str, Any] = {"min": min(span), "max": max(span), "steps": len(span)}
            severity, message = (
                "warning",
                (
                    f"rolling median clip fraction {fmt(min(span))}-{fmt(max(span))} "
                    f"over {len(span)} steps, {why}"
                ),
            )
            converged = _converged(canon, start, end, t) if check == "clip_fraction_zero" else None
            if converged is not None:
                severity = "note"
                evidence.update(converged=True, train_score=converged)
                message += (
                    f"; but the train score sits at {fmt(converged)}, within "
                    f"{t.kl_gain_headroom} of the best a response scores: nearly every "
                    "response already earns the top score, so the updates are tiny (converged)"
                )
            findings.append(Finding(check, severity, "pg_clipfrac", start, end, message, evidence))
    return findings


def _converged(canon: Canonical, start: int, end: int, t: Thresholds) -> float | None:
    """The median train score over steps start..end when it is within kl_gain_headroom of the
    top of the run's score range (a converged run), else None."""
    bounds = score_range(canon, "score")
    scores = [v for s, v in canon.series.get("score", []) if start <= s <= end]
    if bounds is None or not scores:
        return None
    median = statistics.median(scores)
    return median if bounds[1] - median <= t.kl_gain_headroom * (bounds[1] - bounds[0]) else None


def check_rollout_mismatch(canon: Canonical, t: Thresholds) -> list[Finding]:
    """Inference-engine and training-engine probabilities of the same tokens disagreeing."""
    corr = canon.series.get("rollout_probs_corr", [])
    diff = canon.series.get("rollout_probs_diff_max", [])
    low_corr: dict[int, float] = {}  # step -> rolling median correlation, where below the bar
    if len(corr) >= t.window:
        smooth = rolling_median([v for _, v in corr], t.window)
        low_corr = {s: m for (s, _), m in zip(corr, smooth, strict=True) if m < t.mismatch_corr_min}
    high_diff: dict[int, float] = {}  # step -> rolling median largest difference, where too high
    base = bar = math.nan
    if len(diff) >= t.mismatch_base_steps + t.window:
        base = statistics.median(v for _, v in diff[: t.mismatch_base_steps])
        bar = max(t.mismatch_jump_factor * base, t.mismatch_diff_floor)
        smooth = rolling_median([v for _, v in diff], t.window)
        high_diff = {s: m for (s, _), m in zip(diff, smooth, strict=True) if m > bar}
    if not low_corr and not high_diff:
        return []
    steps = sorted({s for s, _ in corr} | {s for s, _ in diff})
    flags = [s in low_corr or s in high_diff for s in steps]
    findings: list[Finding] = []
    for a, b in spans(flags, min_len=t.window // 2):
        span = steps[a : b + 1]
        corrs = [low_corr[s] for s in span if s in low_corr]
        diffs = [high_diff[s] for s in span if s in high_diff]
        why: list[str] = []
        evidence: dict[str, Any] = {}
        if corrs:
            why.append(
                f"rolling median Pearson correlation down to {fmt(min(corrs))} "
                f"(bar {t.mismatch_corr_min})"
            )
            evidence["lowest_corr"] = min(corrs)
        if diffs:
            why.append(
                f"rolling median largest |p_rollout - p_training| up to {fmt(max(diffs))} "
                f"vs {fmt(base)} over the first {t.mismatch_base_steps} steps (bar {fmt(bar)})"
            )
            evidence.update(highest_diff_max=max(diffs), diff_max_base=base, diff_max_bar=bar)
        findings.append(
            Finding(
                "rollout_mismatch",
                "warning",
                "rollout_probs_corr" if corrs else "rollout_probs_diff_max",
                span[0],
                span[-1],
                "; ".join(why) + ": the inference engine and the trainer disagree on the policy",
                evidence,
            )
        )
    return findings


# verl's corrections for the gap, named in the rollout_gap finding (verl docs/algo/rollout_corr.md,
# docs/faq/faq.rst): importance weights or rejection of off-policy tokens, then the known cause.
ROLLOUT_CORRECTION = (
    "verl's correction: algorithm.rollout_correction.rollout_is=token (truncated importance "
    "weights, rollout_is_threshold 2.0) or rollout_rs (reject the off-policy tokens), verl "
    "docs/algo/rollout_corr.md; its FAQ's known cause on vLLM: "
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_cascade_attn=True"
)


def check_rollout_gap(data: RunData, canon: Canonical, t: Thresholds) -> list[Finding]:
    """The mean per-token |p_rollout - p_training| above the level verl's FAQ calls a precision
    problem of the inference engine (warning) or above its normal level (note)."""
    points = canon.series.get("rollout_probs_diff_mean", [])
    if not points:
        return []
    window = min(t.window, len(points))
    smooth = rolling_median([v for _, v in points], window)
    steps = [s for s, _ in points]
    corrected = any(
        key.startswith("rollout_corr/rollout_is") or key.startswith("rollout_corr/rollout_rs")
        for values in data.steps.values()
        for key in values
    )
    findings: list[Finding] = []
    faq = (
        f"verl's FAQ: below {t.mismatch_mean_normal} is normal, above {t.mismatch_mean_harmful} "
        "a precision problem of the inference engine"
    )
    fix = (
        "the rollout correction is on (rollout_corr/rollout_is*/rollout_rs* logged): look for "
        "the cause"
        if corrected
        else ROLLOUT_CORRECTION
    )
    harmful = [m > t.mismatch_mean_harmful for m in smooth]
    above_normal = [t.mismatch_mean_normal < m <= t.mismatch_mean_harmful for m in smooth]
    findings: list[Finding] = []
    for severity, bar, flags in (
        ("warning", t.mismatch_mean_harmful, harmful),
        ("note", t.mismatch_mean_normal, above_normal),
    ):
        for a, b in spans(flags, min_len=max(1, window // 2)):
            peak = max(smooth[a : b + 1])
            findings.append(
                Finding(
                    "rollout_gap",
                    severity,
                    "rollout_probs_diff_mean",
                    steps[a],
                    steps[b],
                    f"mean |p_rollout - p_training| per token ({window}-step median) up to "
                    f"{fmt(peak)} > {bar} ({faq}); {fix}",
                    {"peak_median": peak, "bar": bar, "correction_on": corrected},
                )
            )
    return findings


def health_checks(
    data: RunData, canon: Canonical, t: Thresholds = THRESHOLDS, more: list[Finding] | None = None
) -> list[Finding]:
    """Run every check (plus ``more`` findings, e.g. the trace's); ordered by severity, step."""
    findings = (
        list(more or [])
        + check_non_finite(data)
        + check_first_non_finite(data, canon)
        + check_kl(canon, t)
        + check_entropy(canon, t)
        + check_length_hacking(canon, t)
        + check_value_loss(canon, t)
        + check_critic_divergence(canon, t)
        + check_accuracy_flat(canon, t)
        + check_clip_fraction(canon, t)
        + check_rollout_mismatch(canon, t)
        + check_rollout_gap(data, canon, t)
        + check_dropped_groups(data, t)
        + check_accuracy_below_best(canon, t)
        + check_kl_without_score_gain(canon, t)
    )
    order = {"error": 0, "warning": 1, "note": 2}
    return sorted(findings, key=lambda f: (order[f.severity], f.start_step, f.check))

"""Health checks of whether training still pays: validation accuracy that fell clearly below its
best, and a KL to the reference that keeps growing while the train score does not.

Standard library only. Their constants live in ``thresholds.Thresholds`` (``acc_drop_*``,
``kl_gain_*``); docs/reading-a-ppo-run.md explains them and what to change when they fire.
``checks.health_checks`` runs them with the other checks.
"""

from __future__ import annotations

import math
import statistics

from verl_gsm8k.analysis.finding import Finding, aligned, fmt
from verl_gsm8k.analysis.parse import Canonical
from verl_gsm8k.analysis.thresholds import Thresholds

DOCS = "docs/reading-a-ppo-run.md, 'What to change when a check fires'"
_EPS = 1e-9  # a drop of exactly the bar counts (0.5 - 0.4 is 0.0999... in floating point)


def accuracy_drop_bar(
    best: float, later: float, problems: int | None, t: Thresholds
) -> tuple[float, str]:
    """How far below ``best`` an accuracy must be to be clearly below it, and why, in words.

    max(acc_drop_floor, min(acc_drop_abs, acc_drop_rel x best)); with the number of validation
    problems known, also at least acc_drop_z standard errors of the difference of two
    evaluations, sqrt(2 p (1 - p) / n), p the mean of the two accuracies.
    """
    bar = max(t.acc_drop_floor, min(t.acc_drop_abs, t.acc_drop_rel * best))
    why = f"max({t.acc_drop_floor}, min({t.acc_drop_abs}, {t.acc_drop_rel} x best))"
    if problems:
        p = min(max((best + later) / 2, 0.0), 1.0)
        noise = t.acc_drop_z * math.sqrt(2 * p * (1 - p) / problems)
        if noise > bar:
            bar = noise
            why = f"{t.acc_drop_z} standard errors of a difference of two evaluations"
    why += f" on {problems} problems" if problems else ", number of problems not known"
    return bar, why


def check_accuracy_below_best(canon: Canonical, t: Thresholds) -> list[Finding]:
    """Validation accuracy ending clearly below its best earlier value."""
    val = canon.series.get("val_acc", [])
    if len(val) < 2:
        return []
    best = max(v for _, v in val)
    best_step = next(s for s, v in val if v == best)
    last_step, last = val[-1]
    if last_step == best_step:
        return []
    bar, why = accuracy_drop_bar(best, last, canon.val_problems, t)
    if best - last < bar - _EPS:
        return []
    # How long it has stayed there: the trailing evaluations all at least the bar below.
    below = 0
    for _, value in reversed(val):
        if best - value < bar - _EPS:
            break
        below += 1
    since = val[-below][0]
    if best_step == val[0][0] == 0:
        before_training, keep = ", before training", "the model before training was better"
    else:
        before_training = ""
        keep = f"the step-{best_step} model was better: keep its checkpoint if one was saved"
    message = (
        f"validation accuracy ended at {last:.3g} (step {last_step}), {best - last:.3g} below "
        f"its best {best:.3g} (step {best_step}{before_training}); it has been at least "
        f"{bar:.3g} below the best for its last {below} evaluation(s), since step {since}. Bar "
        f"{bar:.3g} = {why}. Try a lower actor learning rate, critic warm-up, a larger KL "
        f"coefficient or batch; {keep} ({DOCS})"
    )
    return [
        Finding(
            "accuracy_below_best",
            "warning",
            "val_acc",
            best_step,
            last_step,
            message,
            {
                "best_step": best_step,
                "best": best,
                "last_step": last_step,
                "last": last,
                "drop": best - last,
                "bar": bar,
                "problems": canon.val_problems,
                "evaluations_below": below,
                "below_since_step": since,
            },
        )
    ]


def _thirds(values: list[float]) -> tuple[float, float, float]:
    """Medians of the first, middle and last third of ``values`` (at least 3 values)."""
    k = len(values) // 3
    return (
        statistics.median(values[:k]),
        statistics.median(values[k : len(values) - k]),
        statistics.median(values[len(values) - k :]),
    )


def score_range(canon: Canonical, score_name: str) -> tuple[float, float] | None:
    """(worst, best) score any response got in the run: the range the mean score moves in.

    From ``<score>_min`` / ``<score>_max`` (verl logs critic/score/min and /max every step);
    None when either is missing or the range is empty.
    """
    lows = [v for _, v in canon.series.get(f"{score_name}_min", [])]
    highs = [v for _, v in canon.series.get(f"{score_name}_max", [])]
    if not lows or not highs or max(highs) <= min(lows):
        return None
    return min(lows), max(highs)


def check_kl_without_score_gain(canon: Canonical, t: Thresholds) -> list[Finding]:
    """KL to the reference growing through the end of the run while the train score does not.

    A warning, unless the score already sits within kl_gain_headroom of the best a response
    scored: then there was nothing left to buy, the run has converged, and it is a note.
    """
    s = canon.series
    kl_name = "kl" if "kl" in s else "kl_loss" if "kl_loss" in s else None
    score_name = "score" if "score" in s else "reward" if "reward" in s else None
    if kl_name is None or score_name is None:
        return []
    steps, scores, kls = aligned(canon, score_name, kl_name)
    size = int(len(steps) * t.kl_gain_frac)
    if size < max(t.kl_gain_min_steps, 3):
        return []
    steps, scores, kls = steps[-size:], scores[-size:], kls[-size:]
    s0, _, s2 = _thirds(scores)
    k0, k1, k2 = _thirds(kls)
    growing = (
        k0 < k1 < k2
        and k2 - k1 >= t.kl_gain_late_share * (k2 - k0)  # still growing at the end
        and k2 >= t.kl_gain_ratio * k0
        and k2 - k0 >= t.kl_gain_abs
    )
    if not growing or s2 - s0 >= t.kl_gain_score_min:
        return []
    ratio = f", {k2 / k0:.1f}x" if k0 > 0 else ""
    window = (
        f"over steps {steps[0]}-{steps[-1]} (the last {size} steps) the train score "
        f"({canon.source_keys.get(score_name, score_name)})"
    )
    kl_growth = (
        f"the KL to the reference ({canon.source_keys.get(kl_name, kl_name)}) kept growing "
        f"{fmt(k0)} -> {fmt(k1)} -> {fmt(k2)} (medians of the first, middle and last third{ratio})"
    )
    evidence: dict[str, object] = {
        "window_steps": size,
        "score_metric": score_name,
        "score_start": s0,
        "score_end": s2,
        "kl_start": k0,
        "kl_middle": k1,
        "kl_end": k2,
    }
    bounds = score_range(canon, score_name)
    if bounds is not None and bounds[1] - s0 <= t.kl_gain_headroom * (bounds[1] - bounds[0]):
        severity = "note"
        evidence.update(score_floor=bounds[0], score_ceiling=bounds[1], converged=True)
        message = (
            f"{window} stayed at {fmt(s0)} -> {fmt(s2)}, near the best a response scores "
            f"({fmt(bounds[1])}; range {fmt(bounds[0])}..{fmt(bounds[1])}, within "
            f"{t.kl_gain_headroom} of it), while {kl_growth}: the run has converged, and further "
            f"steps only move the policy away from the reference. A shorter run or an earlier "
            f"checkpoint scores the same ({DOCS})"
        )
    else:
        severity = "warning"
        message = (
            f"{window} went {fmt(s0)} -> {fmt(s2)}, a gain under {t.kl_gain_score_min}, "
            f"while {kl_growth}: the policy moves away from the reference and buys no reward. "
            f"Try a lower actor learning rate, a larger KL coefficient, critic warm-up or a "
            f"larger batch ({DOCS})"
        )
    return [
        Finding(
            "kl_without_score_gain",
            severity,
            kl_name,
            steps[0],
            steps[-1],
            message,
            evidence,
        )
    ]

"""The checks only the per-token trace can make."""

import math
import statistics
from typing import Any

from verl_gsm8k.analysis.finding import Finding, fmt, spans
from verl_gsm8k.guard.thresholds import THRESHOLDS, Thresholds
from verl_gsm8k.replay.load import Trace


def _numbers(samples: list[dict[str, Any]], name: str) -> list[float]:
    return [v for s in samples for v in (s.get("per_token") or {}).get(name, []) if v is not None]


def check_critic_flat(trace: Trace, t: Thresholds) -> list[Finding]:
    spread_steps, flat = [], []
    for step, ts in sorted(trace.steps.items()):
        values = _numbers(ts.samples, "value")
        scores = [s.get("score") or 0.0 for s in ts.samples]
        if len(values) < 2 or len(scores) < 2 or statistics.pstdev(scores) < t.trace_score_spread:
            continue
        spread_steps.append(step)
        if statistics.pstdev(values) < t.critic_flat_std:
            flat.append((step, statistics.pstdev(values)))
    if len(flat) < t.trace_steps or 2 * len(flat) < len(spread_steps):
        return []
    worst = max(v for _, v in flat)
    return [Finding(
        "critic_flat", "warning", "trace:value", flat[0][0], flat[-1][0],
        f"on {len(flat)} of the {len(spread_steps)} traced steps whose rewards differ, the "
        f"critic's values varied by at most {fmt(worst)} (std, bar {t.critic_flat_std}): every "
        "token gets the same advantage (critic.optim.lr, its warm-up)",
        {"steps": [s for s, _ in flat], "max_value_std": worst},
    )]  # fmt: skip


def check_zero_spread_groups(trace: Trace, t: Thresholds) -> list[Finding]:
    if trace.run.get("adv_estimator") == "gae":
        return []
    steps, shares, kinds = [], [], []
    for step, ts in sorted(trace.steps.items()):
        groups = (ts.head.get("batch") or {}).get("groups")
        if not groups or not groups.get("count") or (groups.get("size") or 1) < 2:
            continue
        steps.append(step)
        shares.append(groups["zero_spread"] / groups["count"])
        kinds.append(groups)
    findings = []
    flags = [share >= t.zero_spread_share for share in shares]
    for a, b in spans(flags, min_len=t.trace_steps):
        window = kinds[a : b + 1]
        low = sum(g["all_min"] for g in window if g["score_min"] != g["score_max"])
        high = sum(g["all_max"] for g in window if g["score_min"] != g["score_max"])
        wrong = low >= high
        share = statistics.median(shares[a : b + 1])
        what = ("most all wrong: the prompts are out of reach" if wrong
                else "most all right: the run has converged on these prompts")  # fmt: skip
        findings.append(Finding(
            "grpo_zero_spread", "warning" if wrong else "note", "trace:groups", steps[a],
            steps[b], f"over steps {steps[a]}-{steps[b]} a median {fmt(share)} of each step's "
            f"prompt groups had the same score in every response (zero advantage; bar "
            f"{t.zero_spread_share}), {what}",
            {"median_share": share, "all_lowest": low, "all_highest": high},
        ))  # fmt: skip
    return findings


def check_trace_prob_gap(trace: Trace, t: Thresholds) -> list[Finding]:
    steps, gaps, worst = [], [], []
    for step, ts in sorted(trace.steps.items()):
        pairs = []
        for k, s in enumerate(ts.samples):
            pt, mask = s.get("per_token") or {}, (s.get("response") or {}).get("mask") or []
            for i, (r, o) in enumerate(zip(pt.get("rollout_log_prob", []),
                                           pt.get("old_log_prob", []), strict=False)):  # fmt: skip
                # a token vLLM did not sample (a tool's reply: response mask 0) has no rollout
                # probability to compare
                if r is not None and o is not None and (i >= len(mask) or mask[i]):
                    pairs.append((abs(math.exp(r) - math.exp(o)), k, i))
        if pairs:
            steps.append(step)
            gaps.append(statistics.fmean(p[0] for p in pairs))
            worst.append(max(pairs))
    findings = []
    for a, b in spans([g > t.trace_prob_gap for g in gaps], min_len=t.trace_steps):
        gap, k, i = max(worst[a : b + 1])
        at = steps[a + [w[0] for w in worst[a : b + 1]].index(gap)]
        findings.append(Finding(
            "trace_prob_gap", "warning", "trace:rollout_log_prob", steps[a], steps[b],
            f"over steps {steps[a]}-{steps[b]} vLLM's and the actor's probabilities of the "
            f"traced tokens differed by {fmt(min(gaps[a:b + 1]))}-{fmt(max(gaps[a:b + 1]))} on "
            f"average (bar {t.trace_prob_gap}), up to {fmt(gap)} (replay.html#step={at}&sample="
            f"{k}&token={i}): the rollout sampled with other weights (a stale weight sync?)",
            {"steps": steps[a : b + 1], "mean_gap": gaps[a : b + 1],
             "largest": {"step": at, "sample": k, "token": i, "gap": gap}},
        ))  # fmt: skip
    return findings


def trace_checks(trace: Trace, t: Thresholds = THRESHOLDS) -> list[Finding]:
    checks = (check_critic_flat, check_zero_spread_groups, check_trace_prob_gap)
    return [finding for check in checks for finding in check(trace, t)]

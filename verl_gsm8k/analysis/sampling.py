"""DAPO's dynamic sampling, read from the metrics of verl's v1 trainer: how much of what a step
generated was thrown away. With ``algorithm.filter_groups`` on, a prompt group whose responses all
got the same accuracy carries no signal and is dropped (``.../filter_groups/evicted_samples``), and
prompts generated past the batch are dropped too (``.../discarded_surplus_samples``); verl names
both "samples" but counts prompt groups (``trainer/ppo/v1/replay_buffer.py``). verl 0.9.1's v1
trainer ignores ``filter_groups.max_num_gen_batches``: nothing caps how many groups a step
generates to fill its batch, and the share dropped grows as the model masters the prompts.

Standard library only; the bar is ``thresholds.Thresholds.dropped_groups_share``.
"""

from __future__ import annotations

from verl_gsm8k.analysis.finding import Finding, rolling_median, spans
from verl_gsm8k.analysis.parse import RunData
from verl_gsm8k.analysis.thresholds import Thresholds

# The two counts of dropped prompt groups, under the replay buffer's partition prefix.
DROPPED_SUFFIXES = ("/filter_groups/evicted_samples", "/filter_groups/discarded_surplus_samples")
# A training step logs its step time; validation-only steps (step 0) do not.
STEP_KEY = "timing_s/step"


def dropped_groups(metrics: dict[str, float]) -> float:
    """Prompt groups a step generated and dropped (0 where neither count is logged)."""
    return sum(v for k, v in metrics.items() if k.endswith(DROPPED_SUFFIXES))


def check_dropped_groups(data: RunData, t: Thresholds) -> list[Finding]:
    """Most of what the steps generated was dropped by dynamic sampling (window-step median of
    the dropped share of prompt groups above ``dropped_groups_share`` for half a window)."""
    batch = data.config.get("train_batch_size")
    logs_drops = any(k.endswith(DROPPED_SUFFIXES) for m in data.steps.values() for k in m)
    if not logs_drops or not batch:
        return []
    steps = [s for s, m in data.steps.items() if STEP_KEY in m]
    dropped = [dropped_groups(data.steps[s]) for s in steps]
    shares = [d / (d + batch) for d in dropped]
    window = min(t.window, len(shares))
    smooth = rolling_median(shares, window)
    findings = []
    for a, b in spans([m > t.dropped_groups_share for m in smooth], min_len=max(1, window // 2)):
        peak = max(range(a, b + 1), key=lambda i: dropped[i])
        findings.append(
            Finding(
                "dropped_groups",
                "warning",
                "filter_groups/evicted_samples",
                steps[a],
                steps[b],
                f"dynamic sampling dropped {max(smooth[a : b + 1]):.0%} of the prompt groups the "
                f"steps generated ({window}-step median; bar {t.dropped_groups_share:.0%}), up to "
                f"{dropped[peak]:.0f} groups for {batch} kept at step {steps[peak]}: the model "
                "answers most prompts all right (or all wrong) and each step generates more to "
                "fill its batch; nothing caps it (verl 0.9.1's v1 trainer ignores "
                "filter_groups.max_num_gen_batches). Harder or fresh prompts, or stop here "
                "(docs/algorithms.md)",
                {"peak_share": max(smooth[a : b + 1]), "batch": batch},
            )
        )
    return findings

"""The health rules' thresholds: the per-step rules read the first block, the report's trends the
rest. A bar at 0 or null turns its rule off."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

MODES = ("stop", "warn", "off")
BLOCK = "gsm8k_guard.watchdog"
FRACTIONS = ("entropy_fraction", "degenerate_share", "degenerate_repeat", "clip_fraction_ceiling",
             "length_fraction", "kl_gain_frac")  # fmt: skip


def _trend(default: Any) -> Any:
    return field(default=default, metadata={"trend": True})  # report only, not in the block


@dataclass(frozen=True)
class Thresholds:
    # stop: a trip ends the run, its step unsaved (exit 4); warn: logged, the run goes on
    mode: str = "stop"
    non_finite: bool | None = True
    # a non-finite grad norm (a skipped update) warns; this many in the window stop
    skipped_updates: int | None = 3
    skipped_updates_window: int = 10
    # KL > factor x the median of the last `window` healthy steps and > floor
    kl_spike_factor: float | None = 10.0
    kl_spike_floor: float = 0.5
    kl_spike_window: int = 10
    kl_spike_min_history: int = 10
    kl_ceiling: float | None = 3.0  # nats/token
    # each of the last `run` grad norms > factor x the median of the `window` steps before them
    grad_norm_factor: float | None = 10.0
    grad_norm_window: int = 10
    grad_norm_run: int = 3
    # critic/vf_loss > max(factor x the run's first, floor): a warning
    critic_loss_factor: float | None = 5.0
    critic_loss_floor: float = 1.0
    clip_fraction_ceiling: float | None = 0.6  # actor/pg_clipfrac
    ppo_kl_ceiling: float | None = 1.0  # actor/ppo_kl
    # mean length < fraction x the median of the first steps, or every response cut at the limit
    length_fraction: float | None = 0.2
    length_at_limit: bool | None = True
    length_start_steps: int = 5
    # entropy < floor (nats/token), or < fraction x the median of the first steps
    entropy_floor: float | None = 0.005
    entropy_fraction: float | None = 0.02
    entropy_start_steps: int = 5
    # > share of the responses one token repeated (>= repeat of >= min_length tokens), or every
    # response the same across >= identical_prompts prompts
    degenerate_share: float | None = 0.5
    degenerate_repeat: float = 0.8
    degenerate_min_length: int = 8
    degenerate_identical_prompts: int | None = 4
    # the mean score of the last `window` steps > drop below its best
    reward_drop: float | None = 0.25
    reward_window: int = 5
    reward_min_history: int = 10

    # The report's trends: rolling medians of `window` steps; the length up by len_rise from where
    # it began to climb (within len_base_tol of its low over len_lookback steps), the score by
    # len_score_gain
    window: int = _trend(10)
    len_rise: float = _trend(0.30)
    len_lookback: int = _trend(100)
    len_base_tol: float = _trend(0.05)
    len_score_gain: float = _trend(0.05)
    # value loss not falling: the last quarter's median >= ratio x the first's
    vf_flat_ratio: float = _trend(0.95)
    vf_min_steps: int = _trend(40)
    # accuracy flat for acc_flat_steps (the train score below acc_min_val_points validations);
    # below its best by max(floor, min(abs, rel x best)) and acc_drop_z SE
    acc_min_gain: float = _trend(0.01)
    acc_flat_steps: int = _trend(100)
    acc_min_val_points: int = _trend(4)
    acc_drop_abs: float = _trend(0.10)
    acc_drop_rel: float = _trend(0.25)
    acc_drop_floor: float = _trend(0.03)
    acc_drop_z: float = _trend(2.5)
    # the KL's thirds rising over the last kl_gain_frac of the run, the score's not
    kl_gain_frac: float = _trend(0.5)
    kl_gain_min_steps: int = _trend(10)
    kl_gain_ratio: float = _trend(1.5)
    kl_gain_abs: float = _trend(0.01)
    kl_gain_late_share: float = _trend(0.25)
    kl_gain_score_min: float = _trend(0.03)
    kl_gain_headroom: float = _trend(0.2)
    clip_window: int = _trend(20)
    clip_low: float = _trend(0.0002)
    # training/rollout_probs_diff_mean: verl's FAQ's levels
    mismatch_mean_normal: float = _trend(0.005)
    mismatch_mean_harmful: float = _trend(0.01)
    dropped_groups_share: float = _trend(0.75)  # DAPO's dynamic sampling
    # the trace: trace_steps steps of a flat critic, of groups without a score spread, of
    # probabilities apart
    trace_steps: int = _trend(3)
    trace_score_spread: float = _trend(0.1)
    critic_flat_std: float = _trend(0.005)
    zero_spread_share: float = _trend(0.8)
    trace_prob_gap: float = _trend(0.01)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            wanted = _wanted(f.name, str(f.type), value)
            if wanted:
                raise ValueError(f"{BLOCK}.{f.name}: {value!r} is not {wanted}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Thresholds:
        """From the config block; an unknown key or a bad value: ValueError naming it."""
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ValueError(f"{BLOCK}: unknown key {key!r}{hint}")
        return cls(**{str(k): v for k, v in values.items()})


def _wanted(name: str, kind: str, value: Any) -> str | None:
    """What a field must be where ``value`` is not that, else None."""
    if name == "mode":
        return None if value in MODES else f"one of {', '.join(MODES)}"
    if kind.startswith("bool"):
        ok = value is None or (isinstance(value, int) and value in (0, 1))
        return None if ok else "true, false or null"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    optional = kind.endswith("| None")
    if optional and (value is None or (number and value == 0)):
        return None
    if kind.startswith("int"):
        least = 2 if name == "degenerate_identical_prompts" else 1
        ok = number and isinstance(value, int) and value >= least
        return None if ok else f"an integer >= {least}"
    positive, most = name == "degenerate_repeat", 1.0 if name in FRACTIONS else math.inf
    if number and math.isfinite(value) and 0 <= value <= most and (value or not positive):
        return None
    bounds = ("> 0" if positive else ">= 0") + (" and <= 1" if most == 1 else "")
    return f"a number {bounds}" + (" (or null: off)" if optional else "")


def doc_table() -> str:
    rows = ["| threshold | default | read by |", "|---|---|---|"]
    for f in fields(Thresholds):
        who = "the report" if f.metadata.get("trend") else f"the watchdog (`{BLOCK}`), the report"
        rows.append(f"| `{f.name}` | {json.dumps(f.default)} | {who} |")
    return "\n".join(rows)


THRESHOLDS = Thresholds()

"""The watchdog's knobs (the ``gsm8k_guard.watchdog`` block of configs/gsm8k_base.yaml) and
their defaults. Standard library only. The rules that read them: ``rules.py``.

Each default sits beyond the healthy extreme of every real run it was checked against (none
trips), by the margin given with it: the runs, what each rule's metric reached in them, and when
and where that was measured are in docs/reliability.md, "The watchdog's thresholds, checked
against real runs". ``Thresholds`` says what each knob means.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

MODES = ("stop", "warn", "off")
CONFIG_BLOCK = "gsm8k_guard.watchdog"


@dataclass(frozen=True)
class Thresholds:
    """The watchdog's knobs: the block ``gsm8k_guard.watchdog`` of configs/gsm8k_base.yaml, which
    repeats these defaults (a test keeps the two equal). Why each default: docs/reliability.md,
    "The watchdog's thresholds, checked against real runs".
    A rule's knob at 0 or null turns it off."""

    # stop: a trip saves no checkpoint of the step and ends the run (run_dir.EXIT_WATCHDOG);
    # warn: the trip is logged and the run goes on; off: nothing is checked. Knob WATCHDOG.
    mode: str = "stop"
    # non_finite: NaN/inf in any loss, grad norm, KL, entropy or score metric. true/false.
    non_finite: bool | None = True
    # skipped_updates: a non-finite grad norm (verl skipped that optimizer step) is a warning; this
    # many among the last `window` steps (this one included) stop the run. 0/null: warn only.
    skipped_updates: int | None = 3
    skipped_updates_window: int = 10
    # kl_spike: KL > factor x the median of the last `window` healthy steps and > floor (nats per
    # token; 0: no floor), once `min_history` healthy steps logged a KL. factor 0/null: off.
    kl_spike_factor: float | None = 10.0
    kl_spike_floor: float = 0.5
    kl_spike_window: int = 10
    kl_spike_min_history: int = 10
    # kl_ceiling: KL to the reference > this (nats/token), whatever its history. 0/null: off.
    kl_ceiling: float | None = 3.0
    # grad_norm_explosion: each of the last `run` steps' grad norm (actor or critic) > factor x
    # the median of the `window` healthy steps before them. factor 0/null: off.
    grad_norm_factor: float | None = 10.0
    grad_norm_window: int = 10
    grad_norm_run: int = 3
    # critic_divergence: critic/vf_loss > max(factor x the run's first logged one, floor), a
    # warning on the step it crosses that bar, never a stop (mode stop included). factor 0/null:
    # off.
    critic_loss_factor: float | None = 5.0
    critic_loss_floor: float = 1.0
    # clipped_update: actor/pg_clipfrac > clip_fraction_ceiling, or actor/ppo_kl > ppo_kl_ceiling
    # (the update moved the policy far from the one that sampled). Each 0/null: off.
    clip_fraction_ceiling: float | None = 0.6
    ppo_kl_ceiling: float | None = 1.0
    # length_collapse: response_length/mean < fraction x the median of the first `start_steps`
    # healthy steps (0/null: off), or, with length_at_limit, every response of the step cut at
    # data.max_response_length (response_length/min at it) where the first steps' mean length was
    # below half of it.
    length_fraction: float | None = 0.2
    length_at_limit: bool | None = True
    length_start_steps: int = 5
    # entropy_collapse: actor/entropy < floor (nats/token; 0/null: this bar off), or < fraction x
    # the median of the first `start_steps` healthy steps (0/null: this bar off).
    entropy_floor: float | None = 0.005
    entropy_fraction: float | None = 0.02
    entropy_start_steps: int = 5
    # degenerate: more than `share` of the responses are one token repeated (>= `repeat` of their
    # >= `min_length` tokens one id; share 0/null: this form off), or every response is the same
    # across >= `identical_prompts` distinct prompts (0/null: this form off).
    degenerate_share: float | None = 0.5
    degenerate_repeat: float = 0.8
    degenerate_min_length: int = 8
    degenerate_identical_prompts: int | None = 4
    # reward_collapse: the mean score of the last `window` steps more than `drop` below its best,
    # once `min_history` healthy steps logged a score. drop 0/null: off.
    reward_drop: float | None = 0.25
    reward_window: int = 5
    reward_min_history: int = 10

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"{CONFIG_BLOCK}.mode: {self.mode!r} is not one of {', '.join(MODES)}")
        for name in ("non_finite", "length_at_limit"):
            flag = getattr(self, name)
            if not (flag is None or (isinstance(flag, int) and flag in (0, 1))):
                raise ValueError(f"{CONFIG_BLOCK}.{name}: {flag!r} is not true, false or null")
        for name in ("kl_spike_factor", "entropy_floor", "reward_drop", "kl_ceiling",
                     "grad_norm_factor", "ppo_kl_ceiling", "critic_loss_factor"):  # fmt: skip
            _number(self, name, optional=True)
        for name in ("entropy_fraction", "degenerate_share", "clip_fraction_ceiling",
                     "length_fraction"):  # fmt: skip
            _number(self, name, optional=True, most=1.0)
        _number(self, "kl_spike_floor")
        _number(self, "critic_loss_floor")
        _number(self, "degenerate_repeat", most=1.0, positive=True)
        for name in (
            "kl_spike_window",
            "kl_spike_min_history",
            "entropy_start_steps",
            "degenerate_min_length",
            "reward_window",
            "reward_min_history",
            "skipped_updates_window",
            "grad_norm_window",
            "grad_norm_run",
            "length_start_steps",
        ):
            _count(self, name, least=1)
        if self.skipped_updates not in (None, 0):
            _count(self, "skipped_updates", least=1)
        if self.degenerate_identical_prompts not in (None, 0):
            _count(self, "degenerate_identical_prompts", least=2)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Thresholds:
        """From the config block ``gsm8k_guard.watchdog`` (``mode`` included); a key missing keeps
        its default, an unknown key or a bad value: ValueError naming it."""
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ValueError(f"{CONFIG_BLOCK}: unknown key {key!r}{hint}")
        return cls(**{str(k): v for k, v in values.items()})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(
    t: Thresholds,
    name: str,
    optional: bool = False,
    most: float | None = None,
    positive: bool = False,
) -> None:
    value = getattr(t, name)
    if optional and value is None:
        return
    ok = _is_number(value) and math.isfinite(value) and value >= 0
    ok = ok and (most is None or value <= most) and (not positive or value > 0)
    if not ok:
        low = "> 0" if positive else ">= 0"
        high = f" and <= {most:g}" if most is not None else ""
        null = " (or null: off)" if optional else ""
        raise ValueError(f"{CONFIG_BLOCK}.{name}: {value!r} is not a number {low}{high}{null}")


def _count(t: Thresholds, name: str, least: int) -> None:
    value = getattr(t, name)
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
        raise ValueError(f"{CONFIG_BLOCK}.{name}: {value!r} is not an integer >= {least}")

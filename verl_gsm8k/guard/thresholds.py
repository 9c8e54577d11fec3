"""The watchdog's knobs (the ``gsm8k_guard.watchdog`` block of configs/gsm8k_base.yaml) and
why each default is what it is. Standard library only. The rules that read them: ``rules.py``.

Defaults, and the real runs they were checked against (none trips; "margin": how far the
default sits beyond the healthy extreme). Measured 2026-11-25 on:
- the learning runs, ``recipes/learn_tiny.sh`` (warm-started tiny model, 20 steps, PPO and GRPO):
  /work/fixtures/learn_{ppo,grpo} replayed through ``Watchdog`` (metrics and trace), and a second
  pair from a full test session, read for the same extremes (its directory is gone since);
  tests/test_learn_cpu.py replays the suite's own pair on every slow run;
- the smoke runs of a full test session (the RANDOM tiny model, vocabulary 600):
  tests/test_train_cpu.py's ``smoke`` (4 steps, actor lr 1e-2, a resume after step 2), the
  two-node smoke (1 step) and the LoRA run (1 step), read for the same extremes;
- the 0.5B runs: the two real 435-step Qwen2.5-0.5B PPO GSM8K console logs (shared data
  ``verl-logs``, metrics rounded to 3 decimals; their keys ``critic/kl`` and
  ``actor/entropy_loss`` read as ``actor/reward_kl_penalty`` and ``actor/entropy``), replayed
  by tests/test_watchdog_rules.py on every fast run.

- non_finite (on): no loss, grad norm, KL, entropy or score metric is NaN, inf or null in any
  of those runs (the SFT runs' ``val/loss`` is null, but the SFT trainer has no watchdog).
- kl_spike (factor 10, floor 0.5, window 10, min history 10): the only healthy steps above
  10 x their window's median are the 0.5B runs' first ones, where the KL starts at 0; the
  largest is 0.046 (512-token run, step 13, median 0.002): the floor is 11 x above it. The
  learning runs stay within 1.9 x their median (KL <= 0.16), the 0.5B runs reach 0.35 slowly.
  The smoke runs' random model drifts fast with actor lr 1e-2 (KL 0, 0.08, 0.15, 0.52 over
  steps 1-4, 6 x the median at step 4: neither bar would hold), hence the 10 steps of history,
  which no smoke run of the suite reaches.
- entropy_collapse (floor 0.005, fraction 0.02 of the first 5 steps' median): lowest healthy
  entropy 0.0238 in the learning runs (0.53 of its start; the floor 4.8 x below), 0.049 in the
  0.5B runs (0.10 of their start 0.45-0.48; the fraction 5 x below), 5.9 in the smoke runs
  (ln 600 = 6.4). A learning run much longer than 20 steps keeps lowering its entropy
  (0.045 -> 0.025 in 20 steps) and could reach the floor in a few more tens: lower
  ``entropy_floor`` for such a run.
- degenerate (share 0.5, repeat 0.8, min length 8, identical across 4 prompts): in the traces
  (8 responses a step, every step) the highest share of one id in a response is 0.375 in the
  learning runs (``0 + 0 = 0<|im_end|>``, 8 tokens) and 0.06 in the smoke runs (random ids,
  32-128 tokens); no response counts as repeated, no step's responses are all the same. A
  random model samples near-uniformly from 600 ids (entropy 6.4 of ln 600): 8 tokens of which
  7 are one id, or two prompts answered identically, are out of reach.
- reward_collapse (drop 0.25, window 5, min history 10): the largest fall of the 5-step mean
  below its best so far is 0.064 in the 0.5B runs (3.9 x below the drop), 0.011 in the learning
  runs; the smoke runs score 0 throughout.

Added by issue 34 (slow divergence), measured 2026-11-26 on the same 0.5B logs, the suite's PPO
learning run and its smoke run taken to step 8 by the kill test (actor lr 1e-2 on a random
model: the fastest drift of any healthy run here):
- skipped_updates (3 in 10 steps): no run here skipped a single update (no non-finite grad
  norm); 2 in 10 go on, as "occasional" allows; the smoke run's planted NaN reward (step 9)
  skips one update beside its non_finite stop.
- kl_ceiling (3.0): the largest KL is 0.35 in the 0.5B runs (8.6 x below), 0.15 in the learning
  run, 1.18 in the smoke run at step 8 (2.5 x below: it drifts about 0.15 a step). A KL growing
  25 % a step from the healthy 0.08 never spikes against its median, and meets the ceiling on
  its 17th step.
- grad_norm_explosion (3 steps each > 10 x the median of the 10 before): the largest such run
  is 3.95 x (0.5B critic; single spikes reach 29 x, which the rule does not count), 1.27 x in
  the learning run; the smoke run never has the 12 steps of history it needs.
- clipped_update (pg_clipfrac 0.6, ppo_kl 1.0): at most 0.009 and 0.005 in the 0.5B runs, 0.008
  and 0.005 in the learning run, 0.23 and 0.20 in the smoke run (2.6 x and 4.9 x below).
- length_collapse (0.2 x the first 5 steps' median; every response at the limit): the mean
  length falls to 0.61 of its start in the 0.5B runs, 0.91 in the learning run, 0.81 in the
  smoke run. Every response at the limit: the smoke run's random model cuts all 16 at some
  steps (step 2 of the suite's run), but its mean length starts near the limit (125 of 128), so
  the rule, which needs a start below half of it, stays quiet there; so does it for the 0.5B runs
  (235 of 256, 314 of 512 at their start); the learning run's responses (about 12 of 24 tokens)
  never reach the limit.
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
    repeats these defaults (a test keeps the two equal). Why each default: the module docstring.
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
                     "grad_norm_factor", "ppo_kl_ceiling"):  # fmt: skip
            _number(self, name, optional=True)
        for name in ("entropy_fraction", "degenerate_share", "clip_fraction_ceiling",
                     "length_fraction"):  # fmt: skip
            _number(self, name, optional=True, most=1.0)
        _number(self, "kl_spike_floor")
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

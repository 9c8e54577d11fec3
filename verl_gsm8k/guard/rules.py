"""The divergence watchdog's rules: is the step that just trained sick? (issue 26, section 2)

Standard library only (no torch, no verl): the guarded trainer (``trainer.py``) calls it inside
verl's v1 trainer, the tests call it with plain lists.

    watchdog = Watchdog(Thresholds.from_mapping(cfg["gsm8k_guard"]["watchdog"]), history)
    trips = watchdog.check(step, metrics, responses, prompt_ids)  # after the update, before saving
    if not trips (or mode warn): watchdog.accept(metrics)         # the step becomes history

``metrics`` is verl's metric dict of the step at that moment (the update's ``actor/*``,
``critic/*`` losses and grad norms, ``actor/entropy``, the KL) plus ``critic/score/mean``;
``responses`` are the response token ids of every sample (no padding), ``prompt_ids`` the prompt
group id (verl's ``uid``) of each. ``history`` is the metrics of earlier healthy steps, oldest
first (a resumed run replays its metrics files). A value logged as ``null`` (orjson writes NaN
that way) counts as not finite in ``check`` and is skipped in the history.

The rules, at most one trip each, in this order (each off with its knob at 0 or null):

- ``non_finite``: a metric whose name contains one of ``NON_FINITE_PATTERNS`` (a loss, KL,
  entropy or score) is NaN or infinite. Knob ``non_finite`` (true/false). A NaN reward goes on
  for ever (issue 26's planted run).
- ``skipped_update`` / ``skipped_updates``: a non-finite gradient norm. verl's engines skip that
  optimizer step and go on (an occasional one is normal in bf16), so one is a warning even in
  mode stop; ``skipped_updates`` of the last ``skipped_updates_window`` steps (default 3 of 10)
  stop the run. Neither real 0.5B run nor any run of the suite skipped a single update, so the
  window is set by what "occasional" can mean: 2 in 10 steps go on, a fifth of the updates lost
  for a third step does not.

Each trip says which weights it describes (``Trip.weights``): at step N the responses, their
scores, the entropy and the KL to the reference come from the policy after step N-1, whose
checkpoint is already saved; the losses, grad norms, ppo_kl and clip fractions are step N's own
update. A trip of the rollout's metrics marks checkpoint N-1 sick (kept, never resumed, never
best) and names the newest checkpoint before it as the last healthy one; a trip of the update's
names N-1 (guard/trainer.py).
- ``kl_spike``: the KL to the reference (``KL_KEYS``: ``actor/reward_kl_penalty`` when the KL is
  in the reward, ``actor/kl_loss`` when it is a loss, the first present) above
  ``kl_spike_factor`` x the median of the last ``kl_spike_window`` healthy steps AND above
  ``kl_spike_floor``, once ``kl_spike_min_history`` healthy steps logged it. The floor keeps a KL
  that starts near 0 (exactly 0 at step 1, negative with the k1 estimator) from tripping on its
  normal early rise.
- ``entropy_collapse``: ``actor/entropy`` below ``entropy_floor`` (nats/token), or below
  ``entropy_fraction`` x the median of the run's first ``entropy_start_steps`` healthy steps.
  Both: an absolute floor alone separates every healthy run below (the tiny model's low entropy
  included), and the relative bar follows a model that starts higher (a collapse of the 0.5B
  model from 0.45 to 0.008 is caught by it, not by the floor).
- ``degenerate``: more than ``degenerate_share`` of the step's responses are one token repeated
  (at least ``degenerate_min_length`` tokens, at least ``degenerate_repeat`` of them one id:
  0.8, not 0.9, so ``!!!!!!!!`` followed by its end-of-text token counts), or every response of
  the step is the same token ids across at least ``degenerate_identical_prompts`` distinct
  prompts.
- ``reward_collapse``: the mean ``critic/score/mean`` of the last ``reward_window`` steps (this
  one included) more than ``reward_drop`` below the best such mean so far, once
  ``reward_min_history`` healthy steps logged a score. Absolute, in the reward's units (0..1 for
  the recipes' GSM8K reward).

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
"""

from __future__ import annotations

import difflib
import math
import statistics
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

# Every metric the non_finite rule reads: a name containing one of these. Ordered as a NaN
# spreads (a score feeds the advantages, the loss, then the gradient), so the first one named
# is the likeliest cause.
NON_FINITE_PATTERNS = ("score/mean", "kl", "entropy", "loss")
# A non-finite gradient norm alone is verl skipping one optimizer step (its engines do, and go on):
# the skipped_updates rule counts them.
GRAD_NORM_PATTERN = "grad_norm"
# Which weights a metric describes. At step N the responses, their scores, the entropy and the KL
# to the reference come from the policy after step N-1 (the checkpoint of step N-1, saved before
# step N began); the losses, gradient norms, ppo_kl and clip fractions are step N's own update.
# A metric of neither list counts as the rollout's: the older checkpoint is the safer one to name.
UPDATE_PATTERNS = ("pg_loss", "vf_loss", "grad_norm", "ppo_kl", "clipfrac")
ROLLOUT, UPDATE = "rollout", "update"
KL_KEYS = ("actor/reward_kl_penalty", "actor/kl_loss")  # KL in the reward (PPO), as a loss (GRPO)
ENTROPY_KEY = "actor/entropy"
SCORE_KEY = "critic/score/mean"
MODES = ("stop", "warn", "off")
CONFIG_BLOCK = "gsm8k_guard.watchdog"

REPEATED_METRIC = "responses/one_token_repeated_share"
IDENTICAL_METRIC = "responses/prompts_answered_identically"


@dataclass(frozen=True)
class Thresholds:
    """The watchdog's knobs: the block ``gsm8k_guard.watchdog`` of configs/gsm8k_base.yaml, which
    repeats these defaults (a test keeps the two equal). Why each default: the module docstring.
    A rule's knob at 0 or null turns it off."""

    # stop: a trip saves no checkpoint of the step and ends the run (files.EXIT_WATCHDOG);
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
        flag = self.non_finite
        if not (flag is None or (isinstance(flag, int) and flag in (0, 1))):
            raise ValueError(
                f"{CONFIG_BLOCK}.non_finite: {self.non_finite!r} is not true, false or null"
            )
        for name in ("kl_spike_factor", "entropy_floor", "reward_drop"):
            _number(self, name, optional=True)
        for name in ("entropy_fraction", "degenerate_share"):
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


def _knob(value: float | None) -> float | None:
    """A rule's knob as a float; None where it is off (0 or null)."""
    return float(value) if value is not None and value > 0 else None


@dataclass(frozen=True)
class Trip:
    """One rule that fired on one step."""

    rule: str
    metric: str
    value: float
    threshold: str  # when it trips: "> 10 x median of last 10 healthy steps (0.0031) and > 0.5"
    stops: bool = True  # False: a warning even in mode stop (one skipped update)

    @property
    def weights(self) -> str:
        """ROLLOUT: the metric describes the weights that generated the step (the checkpoint of
        the step before); UPDATE: the step's own update."""
        return UPDATE if any(p in self.metric for p in UPDATE_PATTERNS) else ROLLOUT

    def sick_from(self, step: int) -> int:
        """The first step whose weights this trip judges sick: step-1 for the rollout's metrics
        (its checkpoint produced them), the step itself for its update's."""
        return step - 1 if self.weights == ROLLOUT else step

    def message(self, step: int, last_healthy: int | None, marked: int | None = None) -> str:
        """The one line the launcher prints: metric, value, threshold, step, which weights it
        describes, and the checkpoint to resume or merge from (``marked``: the saved checkpoint
        the trip marked sick)."""
        where = f"global_step_{last_healthy}" if last_healthy is not None else "none yet"
        if self.weights == ROLLOUT:
            whose = f"the responses of step {step - 1}'s weights"
            if marked is not None:
                whose += f" (global_step_{marked}: marked sick, kept, never resumed)"
        else:
            whose = f"step {step}'s update"
        return (
            f"watchdog: {self.rule} at step {step}: {self.metric} = {_show(self.value)} "
            f"({self.threshold}), from {whose}; last healthy checkpoint to resume or merge "
            f"from: {where}"
        )

    def record(
        self,
        step: int,
        last_healthy: int | None,
        launch: str | None,
        action: str,
        marked: int | None = None,
    ) -> dict[str, Any]:
        """The line of RUN_DIR/watchdog.jsonl (``files.append_trip``)."""
        return {
            "launch": launch,
            "step": step,
            "rule": self.rule,
            "metric": self.metric,
            "value": self.value,
            "threshold": self.threshold,
            "action": action,
            "weights": self.weights,
            "last_healthy_checkpoint": last_healthy,
            "sick_checkpoint": marked,
            "message": self.message(step, last_healthy, marked),
        }


def _show(value: float) -> str:
    return f"{value:.4g}"


def metric_value(value: Any) -> float | None:
    """A metric as a float: None for what is no number (a string, a list); a logged null is NaN."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _finite(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metric_value(metrics.get(key)) if key in metrics else None
    return value if value is not None and math.isfinite(value) else None


def _kl(metrics: Mapping[str, Any]) -> tuple[str, float] | None:
    for key in KL_KEYS:
        value = _finite(metrics, key)
        if value is not None:
            return key, value
    return None


def top_token_share(ids: Sequence[int]) -> float:
    """The share of a response's tokens that are its most common id (0 for an empty one)."""
    if not len(ids):
        return 0.0
    return Counter(ids).most_common(1)[0][1] / len(ids)


def repeated_count(responses: Sequence[Sequence[int]], repeat: float, min_length: int) -> int:
    """How many responses are one token repeated: >= min_length long, >= repeat of it one id."""
    return sum(1 for r in responses if len(r) >= min_length and top_token_share(r) >= repeat)


class Watchdog:
    """The rules over one run: ``check`` a step, ``accept`` it into the history if it goes on."""

    def __init__(self, thresholds: Thresholds, history: Sequence[Mapping[str, float]] = ()) -> None:
        self.thresholds = thresholds
        self._kl: deque[float] = deque(maxlen=thresholds.kl_spike_window)
        self._kl_seen = 0
        self._entropy_start: list[float] = []
        self._scores: deque[float] = deque(maxlen=thresholds.reward_window)
        self._scores_seen = 0
        self._best_score_mean: float | None = None
        self._skipped: deque[bool] = deque(maxlen=thresholds.skipped_updates_window)
        for metrics in history:
            self.accept(metrics)

    def check(
        self,
        step: int,
        metrics: Mapping[str, float],
        responses: Sequence[Sequence[int]],
        prompt_ids: Sequence[str],
    ) -> list[Trip]:
        """The trips of this step, most telling first; empty: healthy (mode off: always)."""
        if len(responses) != len(prompt_ids):
            raise ValueError(
                f"step {step}: {len(responses)} responses but {len(prompt_ids)} prompt ids"
            )
        if self.thresholds.mode == "off":
            return []
        found = (
            self._non_finite(metrics),
            self._skipped_update(metrics),
            self._kl_spike(metrics),
            self._entropy_collapse(metrics),
            self._degenerate(responses, prompt_ids),
            self._reward_collapse(metrics),
        )
        return [trip for trip in found if trip is not None]

    def accept(self, metrics: Mapping[str, float]) -> None:
        """The step was healthy (or the mode is warn): its finite values become history."""
        t = self.thresholds
        self._skipped.append(bool(_non_finite_grad_norms(metrics)))
        kl = _kl(metrics)
        if kl is not None:
            self._kl.append(kl[1])
            self._kl_seen += 1
        entropy = _finite(metrics, ENTROPY_KEY)
        if entropy is not None and len(self._entropy_start) < t.entropy_start_steps:
            self._entropy_start.append(entropy)
        score = _finite(metrics, SCORE_KEY)
        if score is not None:
            self._scores.append(score)
            self._scores_seen += 1
            if len(self._scores) == t.reward_window:
                mean = statistics.fmean(self._scores)
                best = self._best_score_mean
                self._best_score_mean = mean if best is None else max(best, mean)

    # -- the rules ------------------------------------------------------------------------------

    def _non_finite(self, metrics: Mapping[str, Any]) -> Trip | None:
        if not self.thresholds.non_finite:
            return None
        bad: dict[str, float] = {}
        for pattern in NON_FINITE_PATTERNS:
            for key in sorted(metrics):
                value = metric_value(metrics[key]) if pattern in key else None
                if value is not None and not math.isfinite(value):
                    bad.setdefault(key, value)
        if not bad:
            return None
        (key, value), *others = bad.items()
        threshold = "not finite"
        if others:
            more = f", +{len(others) - 3} more" if len(others) > 3 else ""
            threshold += f"; also: {', '.join(k for k, _ in others[:3])}{more}"
        return Trip("non_finite", key, value, threshold)

    def _skipped_update(self, metrics: Mapping[str, Any]) -> Trip | None:
        t = self.thresholds
        bad = _non_finite_grad_norms(metrics)
        if not bad:
            return None
        key, value = bad[0]
        # this step and the earlier ones still in the window (the deque holds `window` of them)
        earlier = list(self._skipped)[-(t.skipped_updates_window - 1) :]
        count = 1 + sum(earlier) if t.skipped_updates_window > 1 else 1
        window = f"{count} of the last {1 + len(earlier)} steps"
        limit = t.skipped_updates if t.skipped_updates else None
        if limit is None or count < limit:
            stop = f"stops at {limit}" if limit else "never stops (skipped_updates off)"
            return Trip("skipped_update", key, value, f"not finite: verl skipped this update; "
                        f"{window}, {stop}", stops=False)  # fmt: skip
        threshold = f"not finite: {window} skipped their update (>= {limit})"
        return Trip("skipped_updates", key, value, threshold)

    def _kl_spike(self, metrics: Mapping[str, Any]) -> Trip | None:
        t = self.thresholds
        factor, kl = _knob(t.kl_spike_factor), _kl(metrics)
        if factor is None or kl is None or self._kl_seen < t.kl_spike_min_history:
            return None
        key, value = kl
        median = statistics.median(self._kl)
        if value <= factor * median or value <= t.kl_spike_floor:
            return None
        threshold = (
            f"> {factor:g} x median of last {len(self._kl)} healthy steps ({median:.3g}) "
            f"and > {t.kl_spike_floor:g}"
        )
        return Trip("kl_spike", key, value, threshold)

    def _entropy_collapse(self, metrics: Mapping[str, Any]) -> Trip | None:
        t = self.thresholds
        value = _finite(metrics, ENTROPY_KEY)
        if value is None:
            return None
        floor, fraction = _knob(t.entropy_floor), _knob(t.entropy_fraction)
        start = self._entropy_start
        if floor is not None and value < floor:
            return Trip("entropy_collapse", ENTROPY_KEY, value, f"< {floor:g} nats/token")
        if fraction is not None and len(start) >= t.entropy_start_steps:
            base = statistics.median(start)
            if value < fraction * base:
                threshold = f"< {fraction:g} x median of the first {len(start)} steps ({base:.3g})"
                return Trip("entropy_collapse", ENTROPY_KEY, value, threshold)
        return None

    def _degenerate(
        self, responses: Sequence[Sequence[int]], prompt_ids: Sequence[str]
    ) -> Trip | None:
        t = self.thresholds
        if len(responses) == 0:
            return None
        prompts = len(set(prompt_ids))
        identical, share = _knob(t.degenerate_identical_prompts), _knob(t.degenerate_share)
        if identical is not None and prompts >= identical:
            first = tuple(responses[0])
            if all(len(r) == len(first) and tuple(r) == first for r in responses):
                threshold = f">= {identical:g} prompts, every response the same"
                return Trip("degenerate", IDENTICAL_METRIC, float(prompts), threshold)
        if share is not None:
            repeated = repeated_count(responses, t.degenerate_repeat, t.degenerate_min_length)
            if repeated / len(responses) > share:
                threshold = (
                    f"> {share:g}: {repeated} of {len(responses)} responses with >= "
                    f"{t.degenerate_repeat:g} of their tokens one id (>= "
                    f"{t.degenerate_min_length} tokens)"
                )
                return Trip("degenerate", REPEATED_METRIC, repeated / len(responses), threshold)
        return None

    def _reward_collapse(self, metrics: Mapping[str, Any]) -> Trip | None:
        t = self.thresholds
        drop, value, best = _knob(t.reward_drop), _finite(metrics, SCORE_KEY), self._best_score_mean
        if drop is None or value is None or best is None:
            return None
        if self._scores_seen < t.reward_min_history:
            return None
        earlier = list(self._scores)[-(t.reward_window - 1) :] if t.reward_window > 1 else []
        mean = statistics.fmean([*earlier, value])
        if best - mean <= drop:
            return None
        window = f"{t.reward_window}-step mean"
        threshold = f"{window} < {best - drop:.3g}: {drop:g} below its best {window}, {best:.3g}"
        return Trip("reward_collapse", SCORE_KEY, mean, threshold)


def _non_finite_grad_norms(metrics: Mapping[str, Any]) -> list[tuple[str, float]]:
    found = []
    for key in sorted(metrics):
        value = metric_value(metrics[key]) if GRAD_NORM_PATTERN in key else None
        if value is not None and not math.isfinite(value):
            found.append((key, value))
    return found


def prompt_of(key: str) -> str:
    """The prompt uid of a response key ``{uid}_{session}_{index}`` (the key itself otherwise)."""
    parts = key.rsplit("_", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0]
    return key

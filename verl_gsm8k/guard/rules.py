"""The divergence watchdog's rules: is the step that just trained sick? (docs/reliability.md,
"What survives what": a sick step, slow divergence)

Standard library only (no torch, no verl): the guarded trainer (``ppo_trainer/guard_base.py``)
calls it inside verl's v1 trainer, the tests call it with plain lists.

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
  for ever: verl has no such check and trains on, logging the step's scores, advantages and
  losses as NaN (tests/report_runs.py, ``SICK_KEY``: what a real smoke run logged).
- ``skipped_update`` / ``skipped_updates``: a non-finite gradient norm. verl's engines skip that
  optimizer step and go on (an occasional one is normal in bf16), so one is a warning even in
  mode stop; ``skipped_updates`` of the last ``skipped_updates_window`` steps (default 3 of 10)
  stop the run. Neither real 0.5B run nor any run of the suite skipped a single update, so the
  window is set by what "occasional" can mean: 2 in 10 steps go on, a fifth of the updates lost
  for a third step does not.

- ``kl_spike``: the KL to the reference (``KL_KEYS``: ``actor/reward_kl_penalty`` when the KL is
  in the reward, ``actor/kl_loss`` when it is a loss, the first present) above
  ``kl_spike_factor`` x the median of the last ``kl_spike_window`` healthy steps AND above
  ``kl_spike_floor``, once ``kl_spike_min_history`` healthy steps logged it. The floor keeps a KL
  that starts near 0 (exactly 0 at step 1, negative with the k1 estimator) from tripping on its
  normal early rise.
- ``kl_ceiling``: the same KL above ``kl_ceiling``, whatever its history: a KL that grows 25 % a
  step never spikes against its own median, and reaches the ceiling instead.
- ``grad_norm_explosion``: each of the last ``grad_norm_run`` steps' actor or critic grad norm
  above ``grad_norm_factor`` x the median of the ``grad_norm_window`` healthy steps before them.
  A run of them, not one: healthy runs have single spikes (a 0.5B run: 29 x its recent median).
- ``critic_divergence``: ``critic/vf_loss`` above ``critic_loss_factor`` x the run's first logged
  value loss AND above ``critic_loss_floor``, from the second step on: a warning (``stops``
  False, whatever the mode) on the step it crosses that bar, not again while it stays above.
  The first step is the base: a critic with too high a learning rate diverges from its second
  step (a smoke run with a critic lr of 1e-1), long before any window of history fills. The
  floor keeps a critic that started near 0 (every reward 0) quiet once rewards vary: a critic
  whose values stay within 0/1 returns has a value loss of at most 0.5 (verl halves the squared
  error). The message gives ``critic/grad_norm`` against its own first value beside it.
- ``clipped_update``: ``actor/pg_clipfrac`` above ``clip_fraction_ceiling`` or ``actor/ppo_kl``
  above ``ppo_kl_ceiling``: the update moved the policy far from the one that sampled.
- ``length_collapse``: ``response_length/mean`` below ``length_fraction`` x the median of the
  first ``length_start_steps`` healthy steps, or (``length_at_limit``) ``response_length/min``
  at the run's ``data.max_response_length`` (every response cut there) where the first steps'
  mean length was below half of it. Not verl's ``response_length/clip_ratio``: under the agent
  loop it is the share of responses as long as the step's longest one, 0.99 on some steps of a
  healthy learning run.
  A run whose responses ran near the limit from the start (a random model that rarely ends
  one: the smoke run cuts all 16 at some steps) is no collapse.
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

Each trip says which weights it describes (``Trip.weights``): at step N the responses, their
scores, the entropy and the KL to the reference come from the policy after step N-1, whose
checkpoint is already saved; the losses, grad norms, ppo_kl and clip fractions are step N's own
update. A trip of the rollout's metrics marks checkpoint N-1 sick (kept, never resumed, never
best) and names the newest checkpoint before it as the last healthy one; a trip of the update's
names N-1, and a grad-norm explosion the step before its run (ppo_trainer/guard_base.py).

The defaults: ``watchdog_settings.py``; the real runs they were checked against:
docs/reliability.md, "The watchdog's thresholds, checked against real runs".
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_gsm8k.common.run_dir import step_name
from verl_gsm8k.guard.watchdog_settings import Thresholds

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
GRAD_NORM_KEYS = ("actor/grad_norm", "critic/grad_norm")
VF_LOSS_KEY, CRITIC_GRAD_NORM_KEY = "critic/vf_loss", "critic/grad_norm"
CLIPFRAC_KEY, PPO_KL_KEY = "actor/pg_clipfrac", "actor/ppo_kl"
LENGTH_KEY, LENGTH_MIN_KEY = "response_length/mean", "response_length/min"
KL_KEYS = ("actor/reward_kl_penalty", "actor/kl_loss")  # KL in the reward (PPO), as a loss (GRPO)
ENTROPY_KEY = "actor/entropy"
SCORE_KEY = "critic/score/mean"

REPEATED_METRIC = "responses/one_token_repeated_share"
IDENTICAL_METRIC = "responses/prompts_answered_identically"


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
    span: int = 1  # the steps the trip saw sick, this one the last (grad_norm_explosion: its run)

    @property
    def weights(self) -> str:
        """ROLLOUT: the metric describes the weights that generated the step (the checkpoint of
        the step before); UPDATE: the step's own update."""
        return UPDATE if any(p in self.metric for p in UPDATE_PATTERNS) else ROLLOUT

    def sick_from(self, step: int) -> int:
        """The first step whose weights this trip judges sick: step-1 for the rollout's metrics
        (its checkpoint produced them), the step itself for its update's."""
        first = step - self.span + 1
        return first - 1 if self.weights == ROLLOUT else first

    def message(self, step: int, last_healthy: int | None, marked: int | None = None) -> str:
        """The one line the launcher prints: metric, value, threshold, step, which weights it
        describes, and the checkpoint to resume or merge from (``marked``: the saved checkpoint
        the trip marked sick)."""
        where = step_name(last_healthy) if last_healthy is not None else "none yet"
        if self.weights == ROLLOUT:
            whose = f"the responses of step {step - 1}'s weights"
            if marked is not None:
                whose += f" ({step_name(marked)}: marked sick, kept, never resumed)"
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
        """The line of RUN_DIR/watchdog.jsonl (``common.run_dir.append_trip``)."""
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

    def __init__(
        self,
        thresholds: Thresholds,
        history: Sequence[Mapping[str, float]] = (),
        response_limit: int | None = None,
    ) -> None:
        self.thresholds = thresholds
        self.response_limit = response_limit  # data.max_response_length, for length_at_limit
        self._kl: deque[float] = deque(maxlen=thresholds.kl_spike_window)
        self._kl_seen = 0
        self._entropy_start: list[float] = []
        self._scores: deque[float] = deque(maxlen=thresholds.reward_window)
        self._scores_seen = 0
        self._best_score_mean: float | None = None
        self._skipped: deque[bool] = deque(maxlen=thresholds.skipped_updates_window)
        grad_span = thresholds.grad_norm_window + thresholds.grad_norm_run - 1
        self._grad_norms = {key: deque(maxlen=grad_span) for key in GRAD_NORM_KEYS}
        self._length_start: list[float] = []
        # critic_divergence: the run's first value loss and critic grad norm, and whether the
        # last accepted step was above the bar (the rule warns where it crosses, not every step)
        self._vf_start: float | None = None
        self._critic_norm_start: float | None = None
        self._vf_above = False
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
            self._kl_ceiling(metrics),
            self._grad_norm_explosion(metrics),
            self._critic_divergence(metrics),
            self._clipped_update(metrics),
            self._length_collapse(metrics),
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
        for key, norms in self._grad_norms.items():
            norm = _finite(metrics, key)
            if norm is not None:
                norms.append(norm)
        self._accept_critic(metrics)
        length = _finite(metrics, LENGTH_KEY)
        if length is not None and len(self._length_start) < t.length_start_steps:
            self._length_start.append(length)
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

    def _kl_ceiling(self, metrics: Mapping[str, Any]) -> Trip | None:
        ceiling, kl = _knob(self.thresholds.kl_ceiling), _kl(metrics)
        if ceiling is None or kl is None or kl[1] <= ceiling:
            return None
        return Trip("kl_ceiling", kl[0], kl[1], f"> {ceiling:g} nats/token")

    def _grad_norm_explosion(self, metrics: Mapping[str, Any]) -> Trip | None:
        t = self.thresholds
        factor = _knob(t.grad_norm_factor)
        if factor is None:
            return None
        for key, norms in self._grad_norms.items():
            value = _finite(metrics, key)
            if value is None or len(norms) < t.grad_norm_window + t.grad_norm_run - 1:
                continue
            recent = [*list(norms)[len(norms) - t.grad_norm_run + 1 :], value]
            base = statistics.median(list(norms)[: t.grad_norm_window])
            if min(recent) > factor * base:
                threshold = (
                    f"each of the last {t.grad_norm_run} steps > {factor:g} x the median of the "
                    f"{t.grad_norm_window} steps before them ({base:.3g})"
                )
                return Trip("grad_norm_explosion", key, value, threshold, span=t.grad_norm_run)
        return None

    def _critic_bar(self) -> float | None:
        """critic_divergence's bar: max(factor x the first value loss, floor); None: off, or no
        value loss accepted yet."""
        factor = _knob(self.thresholds.critic_loss_factor)
        if factor is None or self._vf_start is None:
            return None
        return max(factor * self._vf_start, self.thresholds.critic_loss_floor)

    def _accept_critic(self, metrics: Mapping[str, Any]) -> None:
        norm = _finite(metrics, CRITIC_GRAD_NORM_KEY)
        if norm is not None and self._critic_norm_start is None:
            self._critic_norm_start = norm
        value = _finite(metrics, VF_LOSS_KEY)
        if value is None:
            return
        if self._vf_start is None:
            self._vf_start = value
            return
        bar = self._critic_bar()
        self._vf_above = bar is not None and value > bar

    def _critic_divergence(self, metrics: Mapping[str, Any]) -> Trip | None:
        bar, value = self._critic_bar(), _finite(metrics, VF_LOSS_KEY)
        if bar is None or value is None or value <= bar or self._vf_above:
            return None
        t, start = self.thresholds, self._vf_start
        threshold = (
            f"> {bar:.3g} = max({t.critic_loss_factor:g} x the run's first {VF_LOSS_KEY} "
            f"({start:.3g}), {t.critic_loss_floor:g}): the critic diverges; a warning, the run "
            "goes on"
        )
        norm, first = _finite(metrics, CRITIC_GRAD_NORM_KEY), self._critic_norm_start
        if norm is not None and first:
            threshold += f"; {CRITIC_GRAD_NORM_KEY} {norm:.3g} = {norm / first:.1f} x its first"
        return Trip("critic_divergence", VF_LOSS_KEY, value, threshold, stops=False)

    def _clipped_update(self, metrics: Mapping[str, Any]) -> Trip | None:
        t = self.thresholds
        for key, ceiling in (
            (CLIPFRAC_KEY, t.clip_fraction_ceiling),
            (PPO_KL_KEY, t.ppo_kl_ceiling),
        ):
            bar, value = _knob(ceiling), _finite(metrics, key)
            if bar is not None and value is not None and value > bar:
                return Trip("clipped_update", key, value, f"> {bar:g}")
        return None

    def _length_collapse(self, metrics: Mapping[str, Any]) -> Trip | None:
        t = self.thresholds
        if len(self._length_start) >= t.length_start_steps:
            fraction, value = _knob(t.length_fraction), _finite(metrics, LENGTH_KEY)
            base = statistics.median(self._length_start)
            if fraction is not None and value is not None and value < fraction * base:
                first = len(self._length_start)
                threshold = f"< {fraction:g} x median of the first {first} steps ({base:.3g})"
                return Trip("length_collapse", LENGTH_KEY, value, threshold)
        limit = self.response_limit
        if t.length_at_limit and limit and len(self._length_start) >= t.length_start_steps:
            shortest, base = _finite(metrics, LENGTH_MIN_KEY), statistics.median(self._length_start)
            if shortest is not None and shortest >= limit and base < limit / 2:
                threshold = (
                    f">= {limit} (data.max_response_length): every response cut at the limit, "
                    f"where the first {len(self._length_start)} steps' mean length was {base:.3g}"
                )
                return Trip("length_collapse", LENGTH_MIN_KEY, shortest, threshold)
        return None

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

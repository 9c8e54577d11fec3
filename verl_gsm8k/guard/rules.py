"""The per-step health rules (is a step sick, given the healthy steps before it?), run by the
watchdog before each save and by the report."""

import math
import statistics
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_gsm8k.common.run_dir import step_name
from verl_gsm8k.guard.thresholds import Thresholds
from verl_gsm8k.guard.vocab import keys_of

(SCORE,) = keys_of("score")
KL_KEYS = keys_of("kl") + keys_of("kl_loss")  # in the reward (PPO), as a loss (GRPO)
ENTROPY_KEYS = keys_of("entropy")
(VF_LOSS,), (CRITIC_NORM,) = keys_of("vf_loss"), keys_of("critic_grad_norm")
GRAD_NORM_KEYS = (*keys_of("actor_grad_norm"), CRITIC_NORM)
(CLIPFRAC,), (PPO_KL,) = keys_of("pg_clipfrac"), keys_of("ppo_kl")
(LENGTH,), (LENGTH_MIN,) = keys_of("response_length_mean"), keys_of("response_length_min")
# in the order a NaN spreads (score, advantages, losses): the first named is the likeliest cause
NON_FINITE_PATTERNS = ("score/mean", "kl", "entropy", "loss")
# metrics of the step's own update; any other describes the rollout (the step before's weights)
UPDATE_PATTERNS = ("pg_loss", "vf_loss", "grad_norm", "ppo_kl", "clipfrac")
ROLLOUT, UPDATE = "rollout", "update"
REPEATED_METRIC = "responses/one_token_repeated_share"
IDENTICAL_METRIC = "responses/prompts_answered_identically"


@dataclass(frozen=True)
class Trip:
    rule: str
    metric: str
    value: float
    threshold: str
    stops: bool = True  # False: a warning even in mode stop
    span: int = 1  # the steps it saw sick, this one the last

    @property
    def weights(self) -> str:
        """UPDATE: the step's own update is sick; ROLLOUT: the weights that sampled it."""
        return UPDATE if any(p in self.metric for p in UPDATE_PATTERNS) else ROLLOUT

    def sick_from(self, step: int) -> int:
        """The first step whose weights this trip judges sick."""
        first = step - self.span + 1
        return first - 1 if self.weights == ROLLOUT else first

    def message(self, step: int, last_healthy: int | None, marked: int | None = None) -> str:
        where = step_name(last_healthy) if last_healthy is not None else "none yet"
        whose = f"step {step}'s update"
        if self.weights == ROLLOUT:
            whose = f"the responses of step {step - 1}'s weights"
            if marked is not None:
                whose += f" ({step_name(marked)}: marked sick, kept, never resumed)"
        return (f"watchdog: {self.rule} at step {step}: {self.metric} = {self.value:.4g} "
                f"({self.threshold}), from {whose}; last healthy checkpoint to resume or merge "
                f"from: {where}")  # fmt: skip

    def record(self, step: int, last_healthy: int | None, launch: str | None, action: str,
               marked: int | None = None) -> dict[str, Any]:  # fmt: skip
        return {"launch": launch, "step": step, "rule": self.rule, "metric": self.metric,
                "value": self.value, "threshold": self.threshold, "action": action,
                "weights": self.weights, "last_healthy_checkpoint": last_healthy,
                "sick_checkpoint": marked,
                "message": self.message(step, last_healthy, marked)}  # fmt: skip


def metric_value(value: Any) -> float | None:
    """A metric as a float: None for what is no number; a logged null is NaN."""
    if value is None or isinstance(value, bool):
        return math.nan if value is None else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _split(metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[tuple[str, float]]]:
    good: dict[str, float] = {}
    bad: list[tuple[str, float]] = []
    for key, raw in metrics.items():
        value = metric_value(raw)
        if value is not None and math.isfinite(value):
            good[key] = value
        elif value is not None:
            bad.append((key, value))
    return good, sorted(bad)


def _first(good: Mapping[str, float], keys: Sequence[str]) -> tuple[str, float] | None:
    return next(((key, good[key]) for key in keys if key in good), None)


def _with(bad: list[tuple[str, float]], pattern: str) -> list[tuple[str, float]]:
    return [(key, value) for key, value in bad if pattern in key]


def _on(value: float | None) -> float | None:
    """A bar; None where it is off (0 or null)."""
    return float(value) if value else None


def top_token_share(ids: Sequence[int]) -> float:
    return Counter(ids).most_common(1)[0][1] / len(ids) if len(ids) else 0.0


class Watchdog:
    """The rules over one run: ``check`` a step, ``accept`` it if the run goes on."""

    def __init__(self, thresholds: Thresholds, history: Sequence[Mapping[str, Any]] = (),
                 response_limit: int | None = None) -> None:  # fmt: skip
        t = self.thresholds = thresholds
        self.response_limit = response_limit
        self._kl: deque[float] = deque(maxlen=t.kl_spike_window)
        self._scores: deque[float] = deque(maxlen=t.reward_window)
        self._kl_seen = self._scores_seen = 0
        self._best_score: float | None = None
        self._skipped: deque[bool] = deque(maxlen=t.skipped_updates_window)
        span = t.grad_norm_window + t.grad_norm_run - 1
        self._norms = {key: deque[float](maxlen=span) for key in GRAD_NORM_KEYS}
        self._entropy_start: list[float] = []
        self._length_start: list[float] = []
        self._vf_start: float | None = None
        self._norm_start: float | None = None
        self._vf_above = False
        for metrics in history:
            self.accept(metrics)

    def check(self, step: int, metrics: Mapping[str, Any], responses: Sequence[Sequence[int]],
              prompt_ids: Sequence[str]) -> list[Trip]:  # fmt: skip
        """The trips of this step, most telling first; empty: healthy."""
        if len(responses) != len(prompt_ids):
            raise ValueError(f"step {step}: {len(responses)} responses but "
                             f"{len(prompt_ids)} prompt ids")  # fmt: skip
        if self.thresholds.mode == "off":
            return []
        good, bad = _split(metrics)
        found = (self._non_finite(bad), self._skipped_update(_with(bad, "grad_norm")),
                 self._kl_spike(good), self._kl_ceiling(good), self._grad_norms(good),
                 self._critic(good), self._clipped(good), self._length(good),
                 self._entropy(good), self._degenerate(responses, prompt_ids),
                 self._reward(good))  # fmt: skip
        return [trip for trip in found if trip is not None]

    def accept(self, metrics: Mapping[str, Any]) -> None:
        """The step goes on: its finite values become history."""
        t, (good, bad) = self.thresholds, _split(metrics)
        self._skipped.append(bool(_with(bad, "grad_norm")))
        kl = _first(good, KL_KEYS)
        if kl:
            self._kl.append(kl[1])
            self._kl_seen += 1
        starts = ((self._entropy_start, ENTROPY_KEYS, t.entropy_start_steps),
                  (self._length_start, (LENGTH,), t.length_start_steps))  # fmt: skip
        for start, keys, size in starts:
            found = _first(good, keys)
            if found and len(start) < size:
                start.append(found[1])
        for key, norms in self._norms.items():
            if (norm := good.get(key)) is not None:
                norms.append(norm)
        if self._norm_start is None:
            self._norm_start = good.get(CRITIC_NORM)
        if (loss := good.get(VF_LOSS)) is not None:
            bar = self._critic_bar()
            self._vf_above = bar is not None and loss > bar
            self._vf_start = loss if self._vf_start is None else self._vf_start
        if (score := good.get(SCORE)) is not None:
            self._scores.append(score)
            self._scores_seen += 1
            if len(self._scores) == t.reward_window:
                mean = statistics.fmean(self._scores)
                best = self._best_score
                self._best_score = mean if best is None else max(mean, best)

    def _non_finite(self, bad: list[tuple[str, float]]) -> Trip | None:
        read = dict(kv for pattern in NON_FINITE_PATTERNS for kv in _with(bad, pattern))
        if not self.thresholds.non_finite or not read:
            return None
        (key, value), *others = read.items()
        threshold = "not finite"
        if others:
            more = f", +{len(others) - 3} more" if len(others) > 3 else ""
            threshold += f"; also: {', '.join(k for k, _ in others[:3])}{more}"
        return Trip("non_finite", key, value, threshold)

    def _skipped_update(self, bad: list[tuple[str, float]]) -> Trip | None:
        if not bad:
            return None
        t = self.thresholds
        full = len(self._skipped) == t.skipped_updates_window
        earlier = list(self._skipped)[full:]
        count, limit = 1 + sum(earlier), t.skipped_updates or None
        window = f"{count} of the last {1 + len(earlier)} steps"
        if limit is None or count < limit:
            stop = f"stops at {limit}" if limit else "never stops (skipped_updates off)"
            why = f"not finite: verl skipped this update; {window}, {stop}"
            return Trip("skipped_update", *bad[0], why, stops=False)
        return Trip("skipped_updates", *bad[0], f"not finite: {window} skipped their update "
                    f"(>= {limit})")  # fmt: skip

    def _kl_spike(self, good: Mapping[str, float]) -> Trip | None:
        t, kl = self.thresholds, _first(good, KL_KEYS)
        factor = _on(t.kl_spike_factor)
        if factor is None or kl is None or self._kl_seen < t.kl_spike_min_history:
            return None
        median = statistics.median(self._kl)
        if kl[1] <= factor * median or kl[1] <= t.kl_spike_floor:
            return None
        return Trip("kl_spike", *kl, f"> {factor:g} x median of last {len(self._kl)} healthy "
                    f"steps ({median:.3g}) and > {t.kl_spike_floor:g}")  # fmt: skip

    def _kl_ceiling(self, good: Mapping[str, float]) -> Trip | None:
        ceiling, kl = _on(self.thresholds.kl_ceiling), _first(good, KL_KEYS)
        if ceiling is None or kl is None or kl[1] <= ceiling:
            return None
        return Trip("kl_ceiling", *kl, f"> {ceiling:g} nats/token")

    def _grad_norms(self, good: Mapping[str, float]) -> Trip | None:
        t = self.thresholds
        factor, run = _on(t.grad_norm_factor), t.grad_norm_run
        for key, norms in self._norms.items():
            value = good.get(key)
            if factor is None or value is None or len(norms) < norms.maxlen:  # type: ignore
                continue
            recent = [*list(norms)[t.grad_norm_window :], value]
            base = statistics.median(list(norms)[: t.grad_norm_window])
            if min(recent) > factor * base:
                return Trip("grad_norm_explosion", key, value, f"each of the last {run} steps > "
                            f"{factor:g} x the median of the {t.grad_norm_window} steps before "
                            f"them ({base:.3g})", span=run)  # fmt: skip
        return None

    def _critic_bar(self) -> float | None:
        factor = _on(self.thresholds.critic_loss_factor)
        if factor is None or self._vf_start is None:
            return None
        return max(factor * self._vf_start, self.thresholds.critic_loss_floor)

    def _critic(self, good: Mapping[str, float]) -> Trip | None:
        bar, value = self._critic_bar(), good.get(VF_LOSS)
        if bar is None or value is None or value <= bar or self._vf_above:
            return None
        t, norm, first = self.thresholds, good.get(CRITIC_NORM), self._norm_start
        threshold = (f"> {bar:.3g} = max({t.critic_loss_factor:g} x the run's first {VF_LOSS} "
                     f"({self._vf_start:.3g}), {t.critic_loss_floor:g}): the critic diverges; "
                     "a warning, the run goes on")  # fmt: skip
        if norm is not None and first:
            threshold += f"; {CRITIC_NORM} {norm:.3g} = {norm / first:.1f} x its first"
        return Trip("critic_divergence", VF_LOSS, value, threshold, stops=False)

    def _clipped(self, good: Mapping[str, float]) -> Trip | None:
        t = self.thresholds
        for key, ceiling in ((CLIPFRAC, t.clip_fraction_ceiling), (PPO_KL, t.ppo_kl_ceiling)):
            bar, value = _on(ceiling), good.get(key)
            if bar is not None and value is not None and value > bar:
                return Trip("clipped_update", key, value, f"> {bar:g}")
        return None

    def _length(self, good: Mapping[str, float]) -> Trip | None:
        t, start, limit = self.thresholds, self._length_start, self.response_limit
        if len(start) < t.length_start_steps:
            return None
        fraction, base, n = _on(t.length_fraction), statistics.median(start), len(start)
        value, shortest = good.get(LENGTH), good.get(LENGTH_MIN)
        if fraction is not None and value is not None and value < fraction * base:
            return Trip("length_collapse", LENGTH, value,
                        f"< {fraction:g} x median of the first {n} steps ({base:.3g})")  # fmt: skip
        if t.length_at_limit and limit and shortest is not None and shortest >= limit > 2 * base:
            return Trip("length_collapse", LENGTH_MIN, shortest, f">= {limit} "
                        "(data.max_response_length): every response cut at the limit, where "
                        f"the first {n} steps' mean length was {base:.3g}")  # fmt: skip
        return None

    def _entropy(self, good: Mapping[str, float]) -> Trip | None:
        t, found, start = self.thresholds, _first(good, ENTROPY_KEYS), self._entropy_start
        floor, fraction = _on(t.entropy_floor), _on(t.entropy_fraction)
        if found is not None and floor is not None and found[1] < floor:
            return Trip("entropy_collapse", *found, f"< {floor:g} nats/token")
        if found is not None and fraction is not None and len(start) >= t.entropy_start_steps:
            base = statistics.median(start)
            if found[1] < fraction * base:
                return Trip("entropy_collapse", *found, f"< {fraction:g} x median of the first "
                            f"{len(start)} steps ({base:.3g})")  # fmt: skip
        return None

    def _degenerate(self, responses: Sequence[Sequence[int]],
                    prompt_ids: Sequence[str]) -> Trip | None:  # fmt: skip
        t, n = self.thresholds, len(responses)
        identical, share = _on(t.degenerate_identical_prompts), _on(t.degenerate_share)
        prompts = len(set(prompt_ids))
        same = n and all(list(r) == list(responses[0]) for r in responses)
        if same and identical is not None and prompts >= identical:
            return Trip("degenerate", IDENTICAL_METRIC, float(prompts),
                        f">= {identical:g} prompts, every response the same")  # fmt: skip
        long = [r for r in responses if len(r) >= t.degenerate_min_length]
        repeated = sum(top_token_share(r) >= t.degenerate_repeat for r in long)
        if n and share is not None and repeated / n > share:
            return Trip("degenerate", REPEATED_METRIC, repeated / n, f"> {share:g}: {repeated} "
                        f"of {n} responses with >= {t.degenerate_repeat:g} of their tokens one "
                        f"id (>= {t.degenerate_min_length} tokens)")  # fmt: skip
        return None

    def _reward(self, good: Mapping[str, float]) -> Trip | None:
        t, value, best = self.thresholds, good.get(SCORE), self._best_score
        drop, early = _on(t.reward_drop), self._scores_seen < t.reward_min_history
        if drop is None or value is None or best is None or early:
            return None
        mean = statistics.fmean([*list(self._scores)[1:], value])
        if best - mean <= drop:
            return None
        window = f"{t.reward_window}-step mean"
        return Trip("reward_collapse", SCORE, mean, f"{window} < {best - drop:.3g}: {drop:g} "
                    f"below its best {window}, {best:.3g}")  # fmt: skip


def trained_steps(rows: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """The logged steps that trained (a validation-only step logs no score)."""
    return sorted(step for step, metrics in rows.items() if SCORE in metrics)


def judge_run(rows: Mapping[int, Mapping[str, Any]], thresholds: Thresholds,
              response_limit: int | None = None) -> list[tuple[int, Trip]]:  # fmt: skip
    """Every trip over a logged run, as in mode warn (no degenerate: no token ids)."""
    watchdog, trips = Watchdog(thresholds, response_limit=response_limit), []
    for step in trained_steps(rows):
        trips += [(step, trip) for trip in watchdog.check(step, rows[step], [], [])]
        watchdog.accept(rows[step])
    return trips


def prompt_of(key: str) -> str:
    """The prompt uid of a response key ``{uid}_{session}_{index}``, else the key."""
    parts = key.rsplit("_", 2)
    return parts[0] if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() else key

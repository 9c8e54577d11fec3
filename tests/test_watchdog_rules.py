"""The divergence watchdog's rules (verl_gsm8k/guard/rules.py): each rule trips on a failure
planted after a healthy history and stays silent on that history; each is off at 0 or null; the
knobs read from configs/gsm8k_base.yaml are the defaults; the two real 0.5B PPO logs pass with
the defaults. The real learning runs are replayed in tests/test_learn_cpu.py (slow), and the
trainer that applies the rules is tested by planting failures in real runs
(tests/test_train_cpu.py, tests/test_guard_trainer.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from report_runs import EXPLODING_CRITICS, HEALTHY_CRITICS

from verl_gsm8k.analysis.parse import load_run
from verl_gsm8k.common import run_dir
from verl_gsm8k.guard.rules import (
    IDENTICAL_METRIC,
    REPEATED_METRIC,
    Thresholds,
    Trip,
    Watchdog,
    top_token_share,
)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, N = 8, 4  # prompt groups a step, responses a prompt
EOS = 2


def healthy_steps(n: int = 25, seed: int = 0, kl_key: str = "actor/reward_kl_penalty"):
    """n steps of a healthy run: KL rising from 0 and levelling off, entropy falling slowly, the
    score climbing, with batch noise on each."""
    rng = random.Random(seed)
    steps = []
    for i in range(n):
        steps.append(
            {
                kl_key: 0.0 if i == 0 else 0.08 * (1 - math.exp(-i / 6)) * rng.uniform(0.7, 1.3),
                "actor/entropy": 0.45 * math.exp(-i / 40) * rng.uniform(0.9, 1.1),
                "critic/score/mean": min(0.9, 0.3 + 0.02 * i + rng.uniform(-0.05, 0.05)),
                "actor/pg_loss": rng.uniform(-0.05, 0.05),
                "actor/grad_norm": rng.uniform(0.2, 2.0),
                "critic/vf_loss": rng.uniform(0.01, 0.3),
                "critic/grad_norm": rng.uniform(1, 10),
                "actor/ppo_kl": rng.uniform(-0.003, 0.003),
                "actor/pg_clipfrac": rng.uniform(0.0, 0.01),
                "response_length/mean": 230 - 3 * i + rng.uniform(-10, 10),
                "response_length/min": 40 + rng.uniform(-10, 10),
            }
        )
    return steps


def healthy_responses(seed: int = 0) -> tuple[list[list[int]], list[str]]:
    rng = random.Random(seed)
    responses = [
        [rng.randrange(3, 600) for _ in range(rng.randint(8, 40))] + [EOS]
        for _ in range(PROMPTS * N)
    ]
    return responses, [f"uid-{i // N}" for i in range(PROMPTS * N)]


def run(watchdog: Watchdog, steps, start: int = 1) -> Iterator[tuple[int, list[Trip]]]:
    """Check then accept each step, as the trainer does in mode warn."""
    for i, metrics in enumerate(steps, start):
        responses, prompts = healthy_responses(i)
        yield i, watchdog.check(i, metrics, responses, prompts)
        watchdog.accept(metrics)


def after_history(t: Thresholds | None = None, n: int = 25, **kw) -> Watchdog:
    """A watchdog that has checked and accepted n healthy steps without a trip."""
    watchdog = Watchdog(t or Thresholds())
    for step, trips in run(watchdog, healthy_steps(n, **kw)):
        assert trips == [], (step, trips)
    return watchdog


def check(watchdog: Watchdog, metrics=None, responses=None, prompts=None) -> list[Trip]:
    healthy, healthy_prompts = healthy_responses(99)
    metrics = healthy_steps(26)[-1] if metrics is None else metrics
    responses = healthy if responses is None else responses
    return watchdog.check(26, metrics, responses, healthy_prompts if prompts is None else prompts)


def with_(**changes) -> dict:
    return {**healthy_steps(26)[-1], **changes}


# --------------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------------


def test_the_healthy_history_and_its_next_step_trip_nothing() -> None:
    assert check(after_history()) == []


def test_non_finite_names_the_likeliest_cause_first() -> None:
    # a reward turned NaN: the score (logged as null by verl's file logger), then everything
    # downstream of it
    metrics = with_(
        **{"critic/score/mean": None, "actor/pg_loss": math.nan, "actor/grad_norm": math.inf}
    )
    trip, skipped = check(after_history(), metrics)
    assert (trip.rule, trip.metric) == ("non_finite", "critic/score/mean")
    assert math.isnan(trip.value) and trip.stops and trip.weights == "rollout"
    assert "actor/pg_loss" in trip.threshold
    assert (skipped.rule, skipped.metric, skipped.stops) == ("skipped_update", "actor/grad_norm",
                                                             False)  # fmt: skip
    (trip,) = check(after_history(), with_(**{"actor/pg_loss": math.nan}))
    assert trip.weights == "update" and trip.sick_from(26) == 26  # the update's own metric
    # a metric that is no number (a string, a list) is not a NaN; one outside the patterns is
    # not read
    assert check(after_history(), with_(**{"actor/pg_loss": "n/a", "perf/mfu": math.nan})) == []


def test_one_skipped_update_warns_three_in_ten_steps_stop() -> None:
    """verl skips an optimizer step whose grad norm is not finite: one is a warning (stops=False)
    even in mode stop, the third within 10 steps stops; a resumed run counts the logged ones."""
    skipped = with_(**{"actor/grad_norm": math.nan})
    watchdog = after_history()
    for step in (26, 30):
        (trip,) = watchdog.check(step, skipped, [], [])
        assert (trip.rule, trip.stops, trip.weights) == ("skipped_update", False, "update")
        watchdog.accept(skipped)
        for _ in range(3):
            watchdog.accept(with_())
    (trip,) = watchdog.check(35, skipped, [], [])  # 26 and 30 are within the last 10 steps
    assert (trip.rule, trip.stops) == ("skipped_updates", True)
    assert "3 of the last 10 steps skipped their update (>= 3)" in trip.threshold
    history = [*healthy_steps(25), skipped, with_(), with_(), with_(), skipped]
    assert check(Watchdog(Thresholds(), history), skipped)[0].stops  # replayed: the same count
    spaced = Watchdog(Thresholds(), [skipped, *[with_()] * 9, skipped])  # 11 steps apart
    assert not check(spaced, skipped)[0].stops
    off = Watchdog(Thresholds(skipped_updates=None), [skipped, skipped])
    assert not check(off, skipped)[0].stops


def test_non_finite_trips_without_any_history() -> None:
    (trip,) = check(Watchdog(Thresholds()), with_(**{"actor/kl_loss": math.nan}))
    assert trip.metric == "actor/kl_loss"


@pytest.mark.parametrize("kl_key", ["actor/reward_kl_penalty", "actor/kl_loss"])
def test_kl_spike_over_its_recent_median(kl_key: str) -> None:
    history = healthy_steps(25, kl_key=kl_key)
    median = sorted(s[kl_key] for s in history[-10:])[4:6]
    median_value = (median[0] + median[1]) / 2
    spike = max(11 * median_value, 0.6)
    nxt = healthy_steps(26, kl_key=kl_key)[-1]
    (trip,) = check(after_history(kl_key=kl_key), {**nxt, kl_key: spike})
    assert (trip.rule, trip.metric, trip.value) == ("kl_spike", kl_key, spike)
    assert f"({median_value:.3g})" in trip.threshold and "> 0.5" in trip.threshold
    # 9 x its median is no spike; neither is 20 x a tiny median below the floor
    assert check(after_history(kl_key=kl_key), {**nxt, kl_key: 9 * median_value}) == []
    tiny = [dict(s, **{kl_key: 1e-6}) for s in history]
    watchdog = Watchdog(Thresholds(), tiny)
    assert check(watchdog, {**nxt, kl_key: 2e-5}) == []
    assert check(watchdog, {**nxt, kl_key: 0.51})[0].rule == "kl_spike"


def test_kl_spike_waits_for_its_history() -> None:
    spike = with_(**{"actor/reward_kl_penalty": 1.5})  # 10 x the median, under the ceiling
    assert check(after_history(n=9), spike) == []
    assert check(after_history(n=10), spike)[0].rule == "kl_spike"


def test_a_kl_growing_a_quarter_a_step_never_spikes_and_meets_the_ceiling() -> None:
    """Slow divergence: from the healthy history, the KL grows 25 % a step. Against its own last
    10 steps it never rises 10-fold (kl_spike stays quiet); the absolute ceiling stops it at the
    first step above 3 nats/token, and names the step before as the sick weights."""
    history = healthy_steps(25)
    quiet = Watchdog(Thresholds(kl_ceiling=None), history)
    guarded = Watchdog(Thresholds(), history)
    tripped = None
    for k in range(1, 31):
        metrics = with_(**{"actor/reward_kl_penalty": 0.08 * 1.25**k})
        assert quiet.check(25 + k, metrics, [], []) == [], k
        quiet.accept(metrics)
        trips = guarded.check(25 + k, metrics, [], [])
        if trips and tripped is None:
            tripped = (25 + k, trips)
        guarded.accept(metrics)
    step, (trip,) = tripped
    assert (step, trip.rule) == (25 + 17, "kl_ceiling") and 0.08 * 1.25**16 < 3.0 < trip.value
    assert trip.sick_from(step) == step - 1


def test_a_run_of_exploding_grad_norms_trips_one_spike_does_not() -> None:
    """Healthy runs have single spikes (a real 0.5B run: 29 x its recent median); three steps in
    a row above 10 x the median of the 10 before them trip, naming the step before the run."""
    watchdog = after_history()
    spike = with_(**{"critic/grad_norm": 500.0})
    assert watchdog.check(26, spike, [], []) == []  # one spike: clipped by verl, no divergence
    watchdog.accept(spike)
    for _ in range(2):
        watchdog.accept(with_())
    for step in (29, 30):
        assert watchdog.check(step, spike, [], []) == []
        watchdog.accept(spike)
    (trip,) = watchdog.check(31, spike, [], [])
    assert (trip.rule, trip.metric, trip.weights, trip.span) == (
        "grad_norm_explosion",
        "critic/grad_norm",
        "update",
        3,
    )
    assert trip.sick_from(31) == 29  # the first update of the run


def critic_trips(losses: list[float], norms: list[float]) -> list[tuple[int, Trip]]:
    """A run from its first step with the given critic, every step checked and accepted."""
    watchdog = Watchdog(Thresholds())
    trips = []
    for step, (loss, norm) in enumerate(zip(losses, norms, strict=True), 1):
        metrics = {**healthy_steps(1)[0], "critic/vf_loss": loss, "critic/grad_norm": norm}
        trips += [(step, trip) for trip in watchdog.check(step, metrics, [], [])]
        watchdog.accept(metrics)
    return trips


@pytest.mark.parametrize("run", sorted(EXPLODING_CRITICS))
def test_an_exploding_critic_warns_once_where_it_crosses_and_never_stops(run: str) -> None:
    """From the run's first step: the value loss 11-58 x its start at step 2 warns there (a
    warning even in mode stop), not again while it stays above the bar."""
    losses, norms = EXPLODING_CRITICS[run]
    ((step, trip),) = critic_trips(losses, norms)
    assert (step, trip.rule, trip.metric, trip.stops) == (2, "critic_divergence", "critic/vf_loss",
                                                           False)  # fmt: skip
    assert trip.weights == "update" and trip.value == losses[1]
    assert "the critic diverges; a warning, the run goes on" in trip.threshold
    assert f"critic/grad_norm {norms[1]:.3g} = " in trip.threshold


@pytest.mark.parametrize("run", sorted(HEALTHY_CRITICS))
def test_a_healthy_critic_of_a_cpu_run_trips_nothing(run: str) -> None:
    assert critic_trips(*HEALTHY_CRITICS[run]) == []


def test_the_critic_warns_again_after_it_came_back() -> None:
    watchdog = after_history()
    diverged = with_(**{"critic/vf_loss": 50.0})
    (trip,) = check(watchdog, diverged)
    assert trip.rule == "critic_divergence" and not trip.stops
    watchdog.accept(diverged)
    assert check(watchdog, diverged) == []  # still above: no second line
    watchdog.accept(with_())
    assert [t.rule for t in check(watchdog, diverged)] == ["critic_divergence"]


def test_a_critic_that_started_near_0_and_learns_stays_under_the_floor() -> None:
    """Every reward 0 at first (the critic fits ~0), then a 0/1 reward's loss: 40 x its start,
    healthy, under the floor."""
    losses = [0.005] * 5 + [0.2] * 5
    for floor, tripped in ((1.0, []), (0.0, [6])):
        watchdog = Watchdog(Thresholds(critic_loss_floor=floor))
        steps = [{**m, "critic/vf_loss": v} for m, v in zip(healthy_steps(10), losses, strict=True)]
        assert [step for step, trips in run(watchdog, steps) if trips] == tripped


def test_length_collapse_and_every_response_at_the_limit() -> None:
    (trip,) = check(after_history(), with_(**{"response_length/mean": 20.0}))
    assert (trip.rule, trip.metric) == ("length_collapse", "response_length/mean")
    limited = Watchdog(Thresholds(), healthy_steps(25), response_limit=512)  # starts near 230
    (trip,) = check(limited, with_(**{"response_length/min": 512.0}))
    assert (trip.rule, trip.metric) == ("length_collapse", "response_length/min")
    assert check(limited, with_(**{"response_length/min": 511.0})) == []
    off = Watchdog(Thresholds(length_at_limit=False), healthy_steps(25), response_limit=512)
    assert check(off, with_(**{"response_length/min": 512.0})) == []
    # a random model whose responses run near the limit from the start is no collapse
    near = [dict(s, **{"response_length/mean": 480.0}) for s in healthy_steps(25)]
    assert check(Watchdog(Thresholds(), near, 512), with_(**{"response_length/min": 512.0})) == []


def test_entropy_collapse_below_the_floor_or_a_fraction_of_the_start() -> None:
    (trip,) = check(after_history(), with_(**{"actor/entropy": 0.004}))
    assert (trip.rule, trip.metric, trip.value) == ("entropy_collapse", "actor/entropy", 0.004)
    assert trip.threshold == "< 0.005 nats/token"
    # the run started near 0.45: 0.008 is under 2 % of it, 0.01 is not
    (trip,) = check(after_history(), with_(**{"actor/entropy": 0.008}))
    assert "x median of the first 5 steps (0.4" in trip.threshold
    assert check(after_history(), with_(**{"actor/entropy": 0.01})) == []
    # a run that starts low (the tiny learning runs: ~0.045) is held by the floor only
    low = [dict(s, **{"actor/entropy": 0.045}) for s in healthy_steps(25)]
    assert check(Watchdog(Thresholds(), low), with_(**{"actor/entropy": 0.0055})) == []


def test_degenerate_one_token_repeated() -> None:
    responses, prompts = healthy_responses(99)
    bang = [0] * 20 + [EOS]  # "!!!!...!" then end of text: 20 of 21 one id
    planted = [bang if i % 8 < 5 else r for i, r in enumerate(responses)]  # 20 of 32
    (trip,) = check(after_history(), responses=planted)
    assert (trip.rule, trip.metric, trip.value) == ("degenerate", REPEATED_METRIC, 20 / 32)
    assert "20 of 32 responses" in trip.threshold
    # half of them is not more than half; short ones (< 8 tokens) do not count
    half = [bang if i % 2 else r for i, r in enumerate(responses)]
    assert check(after_history(), responses=half) == []
    short = [[3 + i] * 6 + [EOS] for i in range(len(responses))]
    assert check(after_history(), responses=short) == []


def test_degenerate_the_same_response_for_every_prompt() -> None:
    same = [[15, 16, 17, EOS]] * (PROMPTS * N)
    (trip,) = check(after_history(), responses=same)
    assert (trip.rule, trip.metric, trip.value) == ("degenerate", IDENTICAL_METRIC, PROMPTS)
    # three prompts answering alike is not enough; neither is one differing response
    three = [f"uid-{i % 3}" for i in range(PROMPTS * N)]
    assert check(after_history(), responses=same, prompts=three) == []
    one_off = [*same[:-1], [15, 16, 18, EOS]]
    assert check(after_history(), responses=one_off) == []


def test_reward_collapse_from_its_best() -> None:
    watchdog = after_history()
    best = max(
        sum(s["critic/score/mean"] for s in healthy_steps(25)[i - 4 : i + 1]) / 5
        for i in range(4, 25)
    )
    trips = []
    step = 0
    for step, score in enumerate([0.3, 0.2, 0.1, 0.0, 0.0], 26):  # noqa: B007 (read after)
        trips = check(watchdog, with_(**{"critic/score/mean": score}))
        if trips:
            break
        watchdog.accept(with_(**{"critic/score/mean": score}))
    (trip,) = trips
    assert (trip.rule, trip.metric) == ("reward_collapse", "critic/score/mean")
    assert best - trip.value > 0.25 and f"its best 5-step mean, {best:.3g}" in trip.threshold
    assert step == 28  # the third low step: one or two lows in five are no collapse


def test_reward_collapse_waits_for_its_history() -> None:
    steps = [dict(s, **{"critic/score/mean": 0.9}) for s in healthy_steps(9)]
    assert check(Watchdog(Thresholds(), steps), with_(**{"critic/score/mean": 0.0})) == []
    steps.append(steps[-1])
    watchdog = Watchdog(Thresholds(), steps)
    for _ in range(2):
        watchdog.accept(with_(**{"critic/score/mean": 0.0}))
    assert check(watchdog, with_(**{"critic/score/mean": 0.0}))[0].rule == "reward_collapse"


PLANTED = {
    "non_finite": ({"non_finite": False}, {"actor/pg_loss": math.nan}),
    "kl_spike": ({"kl_spike_factor": 0}, {"actor/reward_kl_penalty": 1.5}),
    "kl_ceiling": ({"kl_ceiling": None, "kl_spike_factor": 0}, {"actor/reward_kl_penalty": 9.0}),
    "clip_fraction": ({"clip_fraction_ceiling": None}, {"actor/pg_clipfrac": 0.9}),
    "ppo_kl": ({"ppo_kl_ceiling": 0}, {"actor/ppo_kl": 3.0}),
    "critic_divergence": ({"critic_loss_factor": None}, {"critic/vf_loss": 50.0}),
    "length_fraction": ({"length_fraction": 0}, {"response_length/mean": 10.0}),
    "entropy_floor": ({"entropy_floor": None, "entropy_fraction": 0}, {"actor/entropy": 1e-4}),
    "reward_collapse": ({"reward_drop": None}, {"critic/score/mean": -5.0}),
}


@pytest.mark.parametrize("rule", sorted(PLANTED))
def test_each_metric_rule_is_off_at_0_or_null(rule: str) -> None:
    off, planted = PLANTED[rule]
    assert check(after_history(), with_(**planted)) != []
    assert check(after_history(Thresholds(**off)), with_(**planted)) == []


def test_each_degenerate_form_is_off_at_0_or_null() -> None:
    same = [[0] * 20] * (PROMPTS * N)
    assert check(after_history(Thresholds(degenerate_identical_prompts=0)), responses=same)
    assert check(after_history(Thresholds(degenerate_share=None)), responses=same)
    off = Thresholds(degenerate_identical_prompts=None, degenerate_share=0)
    assert check(after_history(off), responses=same) == []


def test_mode_off_checks_nothing() -> None:
    watchdog = after_history(Thresholds(mode="off"))
    assert check(watchdog, with_(**{"actor/pg_loss": math.nan})) == []


def test_a_resumed_run_replays_its_history() -> None:
    """Watchdog(history) is the watchdog that accepted those steps: the same trips after."""
    steps = healthy_steps(25)
    planted = [0.3, 0.2, 0.1, 0.0, 0.0]
    live, resumed = Watchdog(Thresholds()), Watchdog(Thresholds(), steps)
    for metrics in steps:
        live.accept(metrics)
    for score in planted:
        metrics = with_(**{"critic/score/mean": score, "actor/reward_kl_penalty": 3.0})
        assert check(live, metrics) == check(resumed, metrics)
        live.accept(metrics)
        resumed.accept(metrics)
    # a logged null (a NaN step accepted in mode warn) leaves the history as it was
    skipped = Watchdog(Thresholds(), [*steps, with_(**{"actor/entropy": None})])
    assert check(skipped, with_(**{"actor/entropy": 0.008}))[0].rule == "entropy_collapse"


def test_responses_and_prompt_ids_must_pair_up() -> None:
    with pytest.raises(ValueError, match="step 26: 32 responses but 31 prompt ids"):
        check(Watchdog(Thresholds()), prompts=[f"uid-{i}" for i in range(31)])


def test_top_token_share() -> None:
    assert top_token_share([]) == 0.0
    assert top_token_share([5, 5, 5, 7]) == 0.75


# --------------------------------------------------------------------------------------------
# The trip's line and record
# --------------------------------------------------------------------------------------------


def test_the_message_names_metric_value_threshold_step_and_checkpoint(tmp_path: Path) -> None:
    trip = Trip(
        "kl_spike", "actor/kl_loss", 3.41, "> 10 x median of last 10 healthy steps (0.0031)"
    )
    line = trip.message(12, 10, marked=11)
    assert line == (
        "watchdog: kl_spike at step 12: actor/kl_loss = 3.41 (> 10 x median of last 10 healthy "
        "steps (0.0031)), from the responses of step 11's weights (global_step_11: marked sick, "
        "kept, never resumed); last healthy checkpoint to resume or merge from: global_step_10"
    )
    assert trip.sick_from(12) == 11  # the KL is the rollout policy's: step 11's weights
    assert trip.message(3, None).endswith("resume or merge from: none yet")
    nan = Trip("non_finite", "actor/pg_loss", math.nan, "not finite")
    assert "from step 12's update;" in nan.message(12, None)
    run_dir.append_trip(tmp_path, nan.record(12, None, "20261125T101500Z", "stop"))
    (read,) = run_dir.read_trips(tmp_path)
    assert math.isnan(read.pop("value"))
    assert read == {
        "launch": "20261125T101500Z",
        "step": 12,
        "rule": "non_finite",
        "metric": "actor/pg_loss",
        "threshold": "not finite",
        "action": "stop",
        "weights": "update",
        "last_healthy_checkpoint": None,
        "sick_checkpoint": None,
        "message": nan.message(12, None),
    }
    assert "\n" not in line and "actor/pg_loss = nan" in nan.message(12, None)


# --------------------------------------------------------------------------------------------
# The knobs
# --------------------------------------------------------------------------------------------


def test_the_config_block_is_the_defaults() -> None:
    from verl_gsm8k.launch.knobs import KNOBS

    block = yaml.safe_load((ROOT / "configs" / "gsm8k_base.yaml").read_text())["gsm8k_guard"]
    assert set(block["watchdog"]) == {f.name for f in dataclasses.fields(Thresholds)}
    # mode is the WATCHDOG knob's, declared ??? in the config: the knob table holds its default
    knobs = {key: value for key, value in block["watchdog"].items() if value != "???"}
    assert set(block["watchdog"]) - set(knobs) == {"mode"}
    assert Thresholds.from_mapping(knobs) == Thresholds()
    assert next(k.default for k in KNOBS if k.name == "WATCHDOG") == Thresholds().mode
    assert Thresholds.from_mapping({"mode": "warn", "reward_drop": None}) == Thresholds(
        mode="warn", reward_drop=None
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kl_factor": 3}, "unknown key 'kl_factor' (did you mean kl_spike_factor?)"),
        ({"colour": 3}, "gsm8k_guard.watchdog: unknown key 'colour'"),
        ({"mode": "halt"}, ".mode: 'halt' is not one of stop, warn, off"),
        ({"non_finite": "yes"}, ".non_finite: 'yes' is not true, false or null"),
        ({"kl_spike_factor": -1}, ".kl_spike_factor: -1 is not a number >= 0 (or null: off)"),
        (
            {"entropy_fraction": 1.5},
            ".entropy_fraction: 1.5 is not a number >= 0 and <= 1 (or null: off)",
        ),
        ({"reward_drop": True}, ".reward_drop: True is not a number >= 0 (or null: off)"),
        ({"kl_spike_floor": None}, ".kl_spike_floor: None is not a number >= 0"),
        ({"critic_loss_floor": -1}, ".critic_loss_floor: -1 is not a number >= 0"),
        ({"degenerate_repeat": 0}, ".degenerate_repeat: 0 is not a number > 0 and <= 1"),
        ({"kl_spike_window": 0}, ".kl_spike_window: 0 is not an integer >= 1"),
        ({"reward_window": 2.5}, ".reward_window: 2.5 is not an integer >= 1"),
        ({"degenerate_identical_prompts": 1}, "_prompts: 1 is not an integer >= 2"),
    ],
)
def test_a_bad_knob_is_one_line_naming_it(values: dict, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        Thresholds.from_mapping(values)
    text = str(raised.value)
    assert text.startswith("gsm8k_guard.watchdog") and "\n" not in text
    assert text.endswith(message), text


# --------------------------------------------------------------------------------------------
# Real runs
# --------------------------------------------------------------------------------------------

OLD_KEYS = {"critic/kl": "actor/reward_kl_penalty", "actor/entropy_loss": "actor/entropy"}


def test_the_real_0_5b_ppo_runs_trip_nothing(verl_logs_dir: Path) -> None:
    """The two real 435-step Qwen2.5-0.5B PPO GSM8K logs (an older verl: its KL and entropy
    keys renamed to 0.9.1's), every step checked and accepted with the default thresholds."""
    for log in sorted(verl_logs_dir.glob("*.log")):
        steps = load_run(log).steps
        assert len(steps) == 435, log
        watchdog = Watchdog(Thresholds())
        kl, entropy = [], []
        for step in sorted(steps):
            metrics = {OLD_KEYS.get(k, k): v for k, v in steps[step].items()}
            assert watchdog.check(step, metrics, [], []) == [], (log.name, step)
            watchdog.accept(metrics)
            kl.append(metrics["actor/reward_kl_penalty"])
            entropy.append(metrics["actor/entropy"])
        print(f"{log.name}: KL up to {max(kl):.3f}, entropy down to {min(entropy):.3f}")
        assert max(kl) > 0.2 and min(entropy) < 0.06  # the rules did see the real range


def test_a_planted_nan_in_a_real_log_trips(verl_logs_dir: Path) -> None:
    """The replay above can fail: the same log with a NaN reward at step 300 trips there."""
    log = sorted(verl_logs_dir.glob("*.log"))[0]
    steps = load_run(log).steps
    watchdog = Watchdog(Thresholds())
    for step in sorted(steps):
        metrics = {OLD_KEYS.get(k, k): v for k, v in steps[step].items()}
        if step == 300:
            metrics["critic/score/mean"] = math.nan
            (trip,) = watchdog.check(step, metrics, [], [])
            assert (trip.rule, trip.metric) == ("non_finite", "critic/score/mean")
            return
        watchdog.accept(metrics)
    raise AssertionError("no step 300")


def test_json_of_a_trip_is_one_line() -> None:
    record = Trip("degenerate", REPEATED_METRIC, 0.6, "> 0.5").record(3, 2, None, "warn")
    assert json.loads(json.dumps(record))["message"].count("\n") == 0

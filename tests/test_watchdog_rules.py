"""guard/rules.py: each rule trips on a failure planted after a healthy history, off at 0/null."""

import dataclasses
import json
import math
import random
import statistics

import pytest
import yaml
from helpers import ROOT
from report_runs import EXPLODING_CRITICS, HEALTHY_CRITICS

from verl_gsm8k.guard.rules import (
    IDENTICAL_METRIC,
    REPEATED_METRIC,
    Trip,
    Watchdog,
    judge_run,
    top_token_share,
)
from verl_gsm8k.guard.thresholds import Thresholds

PROMPTS, N, EOS = 8, 4, 2  # prompt groups a step, responses a prompt, end-of-text id
KL, SCORE = "actor/reward_kl_penalty", "critic/score/mean"
PG, VF = "actor/pg_loss", "critic/vf_loss"


def healthy_steps(n: int = 25, seed: int = 0, kl_key: str = KL) -> list[dict]:
    rng = random.Random(seed)
    return [{
        kl_key: 0.0 if i == 0 else 0.08 * (1 - math.exp(-i / 6)) * rng.uniform(0.7, 1.3),
        "actor/entropy": 0.45 * math.exp(-i / 40) * rng.uniform(0.9, 1.1),
        SCORE: min(0.9, 0.3 + 0.02 * i + rng.uniform(-0.05, 0.05)),
        PG: rng.uniform(-0.05, 0.05), "actor/grad_norm": rng.uniform(0.2, 2.0),
        VF: rng.uniform(0.01, 0.3), "critic/grad_norm": rng.uniform(1, 10),
        "actor/ppo_kl": rng.uniform(-0.003, 0.003), "actor/pg_clipfrac": rng.uniform(0.0, 0.01),
        "response_length/mean": 230 - 3 * i + rng.uniform(-10, 10),
        "response_length/min": 40 + rng.uniform(-10, 10),
    } for i in range(n)]  # fmt: skip


def healthy_responses(seed: int = 0) -> tuple[list[list[int]], list[str]]:
    rng = random.Random(seed)
    responses = [[rng.randrange(3, 600) for _ in range(rng.randint(8, 40))] + [EOS]
                 for _ in range(PROMPTS * N)]  # fmt: skip
    return responses, [f"uid-{i // N}" for i in range(PROMPTS * N)]


def after_history(t: Thresholds | None = None, n: int = 25, **kw) -> Watchdog:
    watchdog = Watchdog(t or Thresholds())
    for step, metrics in enumerate(healthy_steps(n, **kw), 1):
        assert watchdog.check(step, metrics, *healthy_responses(step)) == [], step
        watchdog.accept(metrics)
    return watchdog


def check(watchdog: Watchdog, metrics=None, responses=None, prompts=None) -> list[Trip]:
    healthy, healthy_prompts = healthy_responses(99)
    metrics = healthy_steps(26)[-1] if metrics is None else metrics
    responses = healthy if responses is None else responses
    return watchdog.check(26, metrics, responses, healthy_prompts if prompts is None else prompts)


def with_(**changes) -> dict:
    return {**healthy_steps(26)[-1], **changes}


def test_non_finite_names_the_likeliest_cause_first():
    assert check(after_history()) == []  # the healthy history's next step
    # a reward turned NaN: the score (logged as null), then everything downstream of it
    bad = with_(**{SCORE: None, PG: math.nan, "actor/grad_norm": math.inf})
    trip, skipped = check(after_history(), bad)
    assert (trip.rule, trip.metric, trip.stops, trip.weights) == (
        "non_finite", SCORE, True, "rollout")  # fmt: skip
    assert math.isnan(trip.value) and PG in trip.threshold
    assert (skipped.rule, skipped.metric, skipped.stops) == (
        "skipped_update", "actor/grad_norm", False)  # fmt: skip
    (trip,) = check(Watchdog(Thresholds()), with_(**{PG: math.nan}))  # no history
    assert trip.weights == "update" and trip.sick_from(26) == 26
    # no number (a string) is no NaN; a metric outside the patterns is not read
    assert check(after_history(), with_(**{PG: "n/a", "perf/mfu": math.nan})) == []


def test_one_skipped_update_warns_three_in_ten_steps_stop():
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
    spaced = Watchdog(Thresholds(), [skipped, *[with_()] * 9, skipped])  # 11 steps apart
    assert not check(spaced, skipped)[0].stops
    off = Watchdog(Thresholds(skipped_updates=None), [skipped, skipped])
    assert not check(off, skipped)[0].stops


def test_kl_spike_over_its_recent_median():
    history = healthy_steps(25)
    median_value = statistics.median(s[KL] for s in history[-10:])
    spike = max(11 * median_value, 0.6)
    (trip,) = check(after_history(), with_(**{KL: spike}))
    assert (trip.rule, trip.metric, trip.value) == ("kl_spike", KL, spike)
    assert f"({median_value:.3g})" in trip.threshold and "> 0.5" in trip.threshold
    # 9 x its median is no spike; neither is 20 x a tiny median below the floor
    assert check(after_history(), with_(**{KL: 9 * median_value})) == []
    watchdog = Watchdog(Thresholds(), [dict(s, **{KL: 1e-6}) for s in history])
    assert check(watchdog, with_(**{KL: 2e-5})) == []
    assert check(watchdog, with_(**{KL: 0.51}))[0].rule == "kl_spike"
    # and it waits for 10 healthy steps of history
    assert check(after_history(n=9), with_(**{KL: 1.5})) == []
    assert check(after_history(n=10), with_(**{KL: 1.5}))[0].rule == "kl_spike"
    # GRPO's KL loss (use_kl_loss) the same way
    grpo = healthy_steps(26, kl_key="actor/kl_loss")
    (trip,) = check(after_history(kl_key="actor/kl_loss"), {**grpo[-1], "actor/kl_loss": spike})
    assert (trip.rule, trip.metric) == ("kl_spike", "actor/kl_loss")


def test_a_kl_growing_a_quarter_a_step_never_spikes_and_meets_the_ceiling():
    history = healthy_steps(25)
    quiet, guarded = Watchdog(Thresholds(kl_ceiling=None), history), Watchdog(Thresholds(), history)
    tripped = []
    for k in range(1, 31):
        metrics = with_(**{KL: 0.08 * 1.25**k})
        assert quiet.check(25 + k, metrics, [], []) == [], k
        tripped += [(25 + k, trip) for trip in guarded.check(25 + k, metrics, [], [])]
        quiet.accept(metrics)
        guarded.accept(metrics)
    step, trip = tripped[0]
    assert (step, trip.rule) == (25 + 17, "kl_ceiling") and 0.08 * 1.25**16 < 3.0 < trip.value
    assert trip.sick_from(step) == step - 1


def test_a_run_of_exploding_grad_norms_trips_one_spike_does_not():
    watchdog = after_history()
    spike = with_(**{"critic/grad_norm": 500.0})
    assert watchdog.check(26, spike, [], []) == []
    watchdog.accept(spike)
    for _ in range(2):
        watchdog.accept(with_())
    for step in (29, 30):
        assert watchdog.check(step, spike, [], []) == []
        watchdog.accept(spike)
    (trip,) = watchdog.check(31, spike, [], [])
    assert (trip.rule, trip.metric, trip.weights, trip.span) == (
        "grad_norm_explosion", "critic/grad_norm", "update", 3)  # fmt: skip
    assert trip.sick_from(31) == 29


def critic_trips(losses: list[float], norms: list[float]) -> list[tuple[int, Trip]]:
    rows = {step: {**healthy_steps(1)[0], VF: loss, "critic/grad_norm": norm}
            for step, (loss, norm) in enumerate(zip(losses, norms, strict=True), 1)}  # fmt: skip
    return judge_run(rows, Thresholds())


@pytest.mark.parametrize("run", sorted(EXPLODING_CRITICS) + sorted(HEALTHY_CRITICS))
def test_an_exploding_critic_warns_once_where_it_crosses_and_never_stops(run: str):
    if run in HEALTHY_CRITICS:
        assert critic_trips(*HEALTHY_CRITICS[run]) == []
        return
    losses, norms = EXPLODING_CRITICS[run]
    ((step, trip),) = critic_trips(losses, norms)
    assert (step, trip.rule, trip.metric, trip.stops, trip.weights, trip.value) == (
        2, "critic_divergence", VF, False, "update", losses[1])  # fmt: skip
    assert "the critic diverges; a warning, the run goes on" in trip.threshold
    assert f"critic/grad_norm {norms[1]:.3g} = " in trip.threshold


def test_the_critic_warns_again_after_it_came_back_and_a_floor_holds_a_critic_near_0():
    watchdog, diverged = after_history(), with_(**{VF: 50.0})
    assert [t.rule for t in check(watchdog, diverged)] == ["critic_divergence"]
    watchdog.accept(diverged)
    assert check(watchdog, diverged) == []  # still above: no second line
    watchdog.accept(with_())
    assert [t.rule for t in check(watchdog, diverged)] == ["critic_divergence"]
    # every reward 0 at first (the critic fits ~0), then a 0/1 reward's loss: 40 x its start
    rows = {s: {**m, VF: 0.005 if s < 6 else 0.2} for s, m in enumerate(healthy_steps(10), 1)}
    assert judge_run(rows, Thresholds()) == []
    assert [s for s, _ in judge_run(rows, Thresholds(critic_loss_floor=0.0))] == [6]


LIMIT, MIN, MEAN, ENT = 512, "response_length/min", "response_length/mean", "actor/entropy"
# (each history step's change, response limit, thresholds, the step's change, trip or None)
ONE_STEP = [
    ({}, None, {}, {MEAN: 20.0}, ("length_collapse", MEAN, "")),
    ({}, LIMIT, {}, {MIN: 512.0}, ("length_collapse", MIN, "")),  # every response at the limit
    ({}, LIMIT, {}, {MIN: 511.0}, None),
    ({}, LIMIT, {"length_at_limit": False}, {MIN: 512.0}, None),
    ({MEAN: 480.0}, LIMIT, {}, {MIN: 512.0}, None),  # near the limit from the start: no collapse
    ({}, None, {}, {ENT: 0.004}, ("entropy_collapse", ENT, "< 0.005 nats/token")),
    ({}, None, {}, {ENT: 0.008}, ("entropy_collapse", ENT, "x median of the first 5 steps (0.4")),
    ({}, None, {}, {ENT: 0.01}, None),  # started near 0.45: 0.01 is not under 2 % of it
    ({ENT: 0.045}, None, {}, {ENT: 0.0055}, None),  # started low: held by the floor only
]


@pytest.mark.parametrize(("history", "limit", "off", "changes", "want"), ONE_STEP)
def test_length_and_entropy_collapse(history, limit, off, changes, want):
    steps = [dict(s, **history) for s in healthy_steps(25)]
    trips = check(Watchdog(Thresholds(**off), steps, limit), with_(**changes))
    assert [(t.rule, t.metric) for t in trips] == ([want[:2]] if want else [])
    for trip in trips:
        assert want[2] in trip.threshold and trip.value == changes[trip.metric]


def test_degenerate_one_token_repeated_or_the_same_response_for_every_prompt():
    responses, _ = healthy_responses(99)
    bang = [0] * 20 + [EOS]  # "!!!!...!" then end of text: 20 of 21 one id
    planted = [bang if i % 8 < 5 else r for i, r in enumerate(responses)]  # 20 of 32
    (trip,) = check(after_history(), responses=planted)
    assert (trip.rule, trip.metric, trip.value) == ("degenerate", REPEATED_METRIC, 20 / 32)
    assert "20 of 32 responses" in trip.threshold
    # half of them is not more than half; short ones (< 8 tokens) do not count
    half = [bang if i % 2 else r for i, r in enumerate(responses)]
    assert check(after_history(), responses=half) == []
    assert check(after_history(), responses=[[3 + i] * 6 + [EOS] for i in range(32)]) == []
    assert (top_token_share([]), top_token_share([5, 5, 5, 7])) == (0.0, 0.75)
    same = [[15, 16, 17, EOS]] * (PROMPTS * N)
    (trip,) = check(after_history(), responses=same)
    assert (trip.rule, trip.metric, trip.value) == ("degenerate", IDENTICAL_METRIC, PROMPTS)
    # three prompts answering alike is not enough; neither is one differing response
    three = [f"uid-{i % 3}" for i in range(PROMPTS * N)]
    assert check(after_history(), responses=same, prompts=three) == []
    assert check(after_history(), responses=[*same[:-1], [15, 16, 18, EOS]]) == []
    with pytest.raises(ValueError, match="step 26: 32 responses but 31 prompt ids"):
        check(Watchdog(Thresholds()), prompts=[f"uid-{i}" for i in range(31)])
    # each form is off at 0 or null
    same = [[0] * 20] * (PROMPTS * N)
    assert check(after_history(Thresholds(degenerate_identical_prompts=0)), responses=same)
    assert check(after_history(Thresholds(degenerate_share=None)), responses=same)
    off = Thresholds(degenerate_identical_prompts=None, degenerate_share=0)
    assert check(after_history(off), responses=same) == []


def test_reward_collapse_from_its_best_after_its_history():
    watchdog = after_history()
    scores = [s[SCORE] for s in healthy_steps(25)]
    best = max(sum(scores[i - 4 : i + 1]) / 5 for i in range(4, 25))
    trips, step = [], 25
    while not trips:
        step += 1
        low = with_(**{SCORE: max(0.0, 0.3 - 0.1 * (step - 26))})
        trips = check(watchdog, low)
        watchdog.accept(low)
    (trip,) = trips
    assert (trip.rule, trip.metric) == ("reward_collapse", SCORE)
    assert best - trip.value > 0.25 and f"its best 5-step mean, {best:.3g}" in trip.threshold
    assert step == 28  # the third low step: one or two lows in five are no collapse
    steps = [dict(s, **{SCORE: 0.9}) for s in healthy_steps(10)]
    crash = with_(**{SCORE: -5.0})
    assert check(Watchdog(Thresholds(), steps[:9]), crash) == []  # 9 steps of history: too few
    assert check(Watchdog(Thresholds(), steps), crash)[0].rule == "reward_collapse"


PLANTED = {
    "non_finite": ({"non_finite": False}, {PG: math.nan}),
    "kl_spike": ({"kl_spike_factor": 0}, {KL: 1.5}),
    "kl_ceiling": ({"kl_ceiling": None, "kl_spike_factor": 0}, {KL: 9.0}),
    "clip_fraction": ({"clip_fraction_ceiling": None}, {"actor/pg_clipfrac": 0.9}),
    "ppo_kl": ({"ppo_kl_ceiling": 0}, {"actor/ppo_kl": 3.0}),
    "critic_divergence": ({"critic_loss_factor": None}, {VF: 50.0}),
    "length_fraction": ({"length_fraction": 0}, {"response_length/mean": 10.0}),
    "entropy_floor": ({"entropy_floor": None, "entropy_fraction": 0}, {"actor/entropy": 1e-4}),
    "reward_collapse": ({"reward_drop": None}, {SCORE: -5.0}),
    "every rule (mode off)": ({"mode": "off"}, {PG: math.nan, KL: 9.0}),
}


@pytest.mark.parametrize("rule", sorted(PLANTED))
def test_each_rule_is_off_at_0_or_null(rule: str):
    off, planted = PLANTED[rule]
    assert check(after_history(), with_(**planted)) != []
    assert check(after_history(Thresholds(**off)), with_(**planted)) == []


def test_a_resumed_run_replays_its_history():
    steps = healthy_steps(25)
    live, resumed = Watchdog(Thresholds()), Watchdog(Thresholds(), steps)
    for metrics in steps:
        live.accept(metrics)
    for score in [0.3, 0.2, 0.1, 0.0, 0.0]:
        metrics = with_(**{SCORE: score, KL: 3.0})
        assert check(live, metrics) == check(resumed, metrics)
        live.accept(metrics)
        resumed.accept(metrics)
    # a logged null (a NaN step accepted in mode warn) leaves the history as it was
    skipped = Watchdog(Thresholds(), [*steps, with_(**{"actor/entropy": None})])
    assert check(skipped, with_(**{"actor/entropy": 0.008}))[0].rule == "entropy_collapse"


def test_the_message_names_metric_value_threshold_step_and_checkpoint():
    trip = Trip("kl_spike", "actor/kl_loss", 3.41,
                "> 10 x median of last 10 healthy steps (0.0031)")  # fmt: skip
    line = trip.message(12, 10, marked=11)
    assert line == (
        "watchdog: kl_spike at step 12: actor/kl_loss = 3.41 (> 10 x median of last 10 healthy "
        "steps (0.0031)), from the responses of step 11's weights (global_step_11: marked sick, "
        "kept, never resumed); last healthy checkpoint to resume or merge from: global_step_10"
    )
    assert trip.sick_from(12) == 11  # the KL is the rollout policy's: step 11's weights
    assert trip.message(3, None).endswith("resume or merge from: none yet")
    nan = Trip("non_finite", PG, math.nan, "not finite")
    assert "from step 12's update;" in nan.message(12, None)
    record = nan.record(12, None, "20261125T101500Z", "stop")  # written: test_run_dir's
    assert math.isnan(record.pop("value"))
    assert record == {"launch": "20261125T101500Z", "step": 12, "rule": "non_finite",
                    "metric": PG, "threshold": "not finite", "action": "stop",
                    "weights": "update", "last_healthy_checkpoint": None,
                    "sick_checkpoint": None, "message": nan.message(12, None)}  # fmt: skip
    assert "actor/pg_loss = nan" in nan.message(12, None)
    assert "\n" not in json.dumps(nan.record(3, 2, None, "warn"))


def test_the_config_block_is_the_defaults():
    from verl_gsm8k.launch.knobs import KNOBS

    block = yaml.safe_load((ROOT / "configs" / "gsm8k_base.yaml").read_text())["gsm8k_guard"]
    per_step = {f.name for f in dataclasses.fields(Thresholds) if not f.metadata.get("trend")}
    assert set(block["watchdog"]) == per_step
    # mode is the WATCHDOG knob's, declared ??? in the config: the knob table holds its default
    knobs = {key: value for key, value in block["watchdog"].items() if value != "???"}
    assert set(block["watchdog"]) - set(knobs) == {"mode"}
    assert Thresholds.from_mapping(knobs) == Thresholds()
    assert next(k.default for k in KNOBS if k.name == "WATCHDOG") == Thresholds().mode
    assert Thresholds.from_mapping({"mode": "warn", "reward_drop": None}) == Thresholds(
        mode="warn", reward_drop=None)  # fmt: skip


@pytest.mark.parametrize(("values", "message"), [
    ({"kl_factor": 3}, "unknown key 'kl_factor' (did you mean kl_spike_factor?)"),
    ({"mode": "halt"}, ".mode: 'halt' is not one of stop, warn, off"),
    ({"non_finite": "yes"}, ".non_finite: 'yes' is not true, false or null"),
    ({"kl_spike_factor": -1}, ".kl_spike_factor: -1 is not a number >= 0 (or null: off)"),
    ({"entropy_fraction": 1.5}, ": 1.5 is not a number >= 0 and <= 1 (or null: off)"),
    ({"reward_drop": True}, ".reward_drop: True is not a number >= 0 (or null: off)"),
    ({"kl_spike_floor": None}, ".kl_spike_floor: None is not a number >= 0"),
    ({"degenerate_repeat": 0}, ".degenerate_repeat: 0 is not a number > 0 and <= 1"),
    ({"reward_window": 2.5}, ".reward_window: 2.5 is not an integer >= 1"),
    ({"degenerate_identical_prompts": 1}, "_prompts: 1 is not an integer >= 2"),
])  # fmt: skip
def test_a_bad_knob_is_one_line_naming_it(values: dict, message: str):
    with pytest.raises(ValueError) as raised:
        Thresholds.from_mapping(values)
    text = str(raised.value)
    assert text.startswith("gsm8k_guard.watchdog") and "\n" not in text
    assert text.endswith(message), text

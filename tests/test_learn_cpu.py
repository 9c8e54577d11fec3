"""Does the loop LEARN? `bash recipes/learn_tiny.sh` on this CPU, as a new user runs it (PPO, then
ALGO=grpo on the cached warm start; the runs are tests/learn_runs.py's session fixtures): greedy
validation accuracy rises over the warm start, the sums it knew are kept, and a plain-PyTorch
policy gradient (tests/reference_pg.py) lifts the same warm start too.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from browser import plot_series, render, require_chromium
from helpers import ROOT, assert_loads_as_torch
from learn_runs import STEPS, WARM_START, Learned, toy_dir, warm_start_dir

from rewards.gsm8k import compute_score, compute_score_flexible
from verl_gsm8k.common.run_dir import read_trips

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

VAL = "val-core/openai/gsm8k/acc/mean@1"
SCORE = "critic/score/mean"
# Bounds outside the worst of 6 seeds per algorithm (docs/learning.md, "Results").
RISE = 0.20
WARM_VAL = (0.25, 0.75)  # the warm start's greedy val accuracy


def knowledge_floor(before_right: int, n: int, alpha: float = 0.05) -> int:
    """The fewest right answers of n that keep a rate of before_right/n: the binomial's one-sided
    alpha quantile (a warm start right on all n taken at 1 - 1/n)."""
    p, cdf = min(before_right / n, 1 - 1 / n), 0.0
    for floor in range(n + 1):
        cdf += math.comb(n, floor) * p**floor * (1 - p) ** (n - floor)
        if cdf >= alpha:
            return floor
    return n + 1


def test_first_use_builds_the_toy_task_and_the_warm_start(learn_base: Path, learned_ppo: Learned):
    ppo = learned_ppo
    assert "device: cpu (DEVICE=auto)" in ppo.stdout
    assert "the toy task" in ppo.stdout and "warm start (once)" in ppo.stdout
    assert (warm_start_dir(learn_base) / "config.json").is_file()
    manifest = json.loads((warm_start_dir(learn_base) / "merge_manifest.json").read_text())
    assert manifest["step"] == 400
    assert (toy_dir(learn_base) / "rl" / "train.parquet").is_file()
    assert f"model: {warm_start_dir(learn_base)}" in ppo.stdout


def test_the_same_seed_builds_the_same_warm_start(learned_ppo: Learned, tmp_path: Path):
    """Same seed, same machine: two first uses in fresh homes build the same warm start, byte for
    byte (2 SFT steps instead of 400)."""
    steps = "2"
    homes = [tmp_path / name / ".cache" / "verl-gsm8k" / WARM_START for name in ("first", "second")]
    warm = [home / f"warm-start-{steps}" for home in homes]
    # what a SIGKILL of a build in its merge leaves; the next build must remove it
    killed = warm[0].with_name(f".{warm[0].name}.merging-killed")
    killed.mkdir(parents=True)
    builds = []
    for name in ("first", "second"):
        env = dict(learned_ppo.env, HOME=str(tmp_path / name), DRY_RUN="1", WARM_START_STEPS=steps)
        builds.append(start_dry_run("learn_tiny", env))
    for build in builds:
        out, err = build.communicate(timeout=900)
        assert build.returncode == 0, out[-3000:] + err[-3000:]
    assert json.loads((warm[0] / "merge_manifest.json").read_text())["step"] == 2
    assert not (homes[0] / "warm-start-run").exists()  # the SFT run's save: gone once merged
    assert not killed.exists()
    weights = [w / "model.safetensors" for w in warm]
    assert weights[0].read_bytes() == weights[1].read_bytes()


def test_grpo_runs_without_a_critic_and_charges_kl_as_a_loss(learned_grpo: Learned):
    """GRPO (configs/gsm8k_grpo.yaml, as the GRPO recipe composes it): group-relative advantages,
    no critic written or trained, the KL a term of the actor's loss, validation at step 0."""
    for step in (10, STEPS):
        checkpoint = learned_grpo.run_dir / f"global_step_{step}"
        assert (checkpoint / "actor" / "model_world_size_1_rank_0.pt").is_file()
        assert not (checkpoint / "critic").exists()
    trained = [m for s, m in learned_grpo.steps.items() if s >= 1]
    assert all("actor/kl_loss" in m and "critic/vf_loss" not in m for m in trained)
    assert VAL in learned_grpo.steps[0]
    assert_loads_as_torch(learned_grpo.run_dir)  # the checked load: bit for bit


def test_the_preflights_checkpoint_size_is_the_runs(learned_ppo: Learned):
    """verl_gsm8k/preflight/checkpoints.py's size of one global_step_N/ against the one the PPO
    learning run wrote (actor and critic: fp32 weights and Adam states), within 5 %."""
    from omegaconf import OmegaConf
    from transformers import AutoConfig

    from verl_gsm8k.preflight.checkpoints import checkpoint_bytes

    (record,) = (learned_ppo.run_dir / "launches").glob("launch-*.yaml")
    cfg = OmegaConf.create(yaml.safe_load(record.read_text())["config"])
    step = learned_ppo.run_dir / "global_step_10"
    hf = {
        role: AutoConfig.from_pretrained(step / role / "huggingface")
        for role in ("actor", "critic")
    }
    written = sum(p.stat().st_size for p in step.rglob("*_world_size_*.pt"))
    estimated = checkpoint_bytes(cfg, hf)
    assert abs(estimated - written) <= 0.05 * written, (estimated, written)


def answers(run: Learned, step: int) -> list[dict]:
    path = run.run_dir / "validation" / f"{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def right_in_any_format(rows: list[dict]) -> list[bool]:
    return [compute_score_flexible("openai/gsm8k", r["output"], r["gts"])["acc"] == 1 for r in rows]


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_greedy_validation_accuracy_rises_by_0_20(algo: str, request: pytest.FixtureRequest):
    run: Learned = request.getfixturevalue(f"learned_{algo}")
    val = {step: m[VAL] for step, m in run.steps.items() if VAL in m}
    assert sorted(val) == [0, 5, 10, 15, 20]
    lost = [(r["output"], r["gts"]) for r in answers(run, STEPS) if not r["score"]][:5]
    assert val[STEPS] - val[0] >= RISE, f"{algo}: val accuracy {val}; wrong at the end: {lost}"
    assert WARM_VAL[0] <= val[0] <= WARM_VAL[1], f"the warm start should leave room: {val[0]}"
    # the recipe's closing lines: accuracy before and after, and where the report is
    assert re.search(rf"first val accuracy\s*: {val[0]:.4g} at step 0", run.stdout), run.stdout[
        -3000:
    ]
    assert re.search(rf"final val accuracy\s*: {val[STEPS]:.4g} at step {STEPS}", run.stdout)
    assert str(run.run_dir / "report" / "report.html") in run.stdout


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_rl_keeps_the_sums_the_warm_start_knew(algo: str, request: pytest.FixtureRequest):
    """Right in any format, step 0 vs the last step on the same 100 questions: the trained count
    stays above the binomial floor of the warm start's rate."""
    run: Learned = request.getfixturevalue(f"learned_{algo}")
    # the same questions, paired by prompt: each validation dump lists them in its own order
    before, after = (sorted(answers(run, s), key=lambda r: r["input"]) for s in (0, STEPS))
    assert [r["input"] for r in before] == [r["input"] for r in after]
    right0, right1 = right_in_any_format(before), right_in_any_format(after)
    floor = knowledge_floor(sum(right0), len(right0))
    lost = [
        (b["output"], a["output"], a["gts"])
        for b, a, r0, r1 in zip(before, after, right0, right1, strict=True)
        if r0 and not r1
    ]
    assert sum(right0) >= 0.9 * len(right0), f"the warm start should know the sums: {sum(right0)}"
    assert sum(right1) >= floor, (
        f"{algo}: right in any format {sum(right0)} -> {sum(right1)} of {len(right0)} "
        f"(floor {floor}); lost (warm, trained, truth): {lost[:6]}"
    )


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_sampled_train_score_rises(algo: str, request: pytest.FixtureRequest):
    run: Learned = request.getfixturevalue(f"learned_{algo}")
    score = [run.steps[s][SCORE] for s in range(1, STEPS + 1)]
    first, last = sum(score[:5]) / 5, sum(score[-5:]) / 5
    assert last - first >= 0.10, f"{algo}: sampled train score by step {score}"


def ints(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\b\d+\b", text)]


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_each_rollout_is_scored_against_its_own_prompt(algo: str, request: pytest.FixtureRequest):
    """rollout.n = 8: a reward paired with another response or another prompt's answer shows."""
    run: Learned = request.getfixturevalue(f"learned_{algo}")
    for step in (1, STEPS):
        rows = [
            json.loads(x)
            for x in (run.run_dir / "rollouts" / f"{step}.jsonl").read_text().splitlines()
        ]
        assert len(rows) == 16 * 8
        prompts = [row["input"] for row in rows]
        assert len(set(prompts)) == 16 and all(prompts.count(p) == 8 for p in set(prompts))
        for row in rows:
            a, b = ints(row["input"].split("How many")[0])[-2:]  # the question's two numbers
            assert str(row["gts"]) == str(a + b), row
            expected = compute_score("openai/gsm8k", row["output"], row["gts"])["score"]
            assert row["score"] == expected, row
        right = sum(row["score"] for row in rows)
        # by the last step a run may have learned every sum: there only all-0 breaks the pairing
        assert (0 < right < len(rows)) if step == 1 else right > 0, (step, right)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_vllm_samples_with_the_trained_weights_every_step(
    algo: str, request: pytest.FixtureRequest
):
    run: Learned = request.getfixturevalue(f"learned_{algo}")
    diffs = [run.steps[s]["training/rollout_probs_diff_max"] for s in range(1, STEPS + 1)]
    assert max(diffs) < 1e-3, diffs  # fp32 end to end on the CPU: a stale weight would be >> this


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_report_shows_the_rise_without_a_false_alarm(algo: str, request: pytest.FixtureRequest):
    run: Learned = request.getfixturevalue(f"learned_{algo}")
    summary = json.loads((run.run_dir / "report" / "summary.json").read_text())
    alarms = [f for f in summary["health"] if f["severity"] in ("error", "warning")]
    assert not alarms, "\n".join(f"{f['check']}: {f['message']} {f['evidence']}" for f in alarms)
    val = summary["validation"]
    assert val["final"]["value"] - val["first"]["value"] >= RISE


def traced_responses(run: Learned, step: int) -> tuple[list[list[int]], list[str]]:
    """The response ids (no padding) and prompt group of each response the trace holds."""
    responses, prompts = [], []
    for line in (run.run_dir / "trace" / f"{step}.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "sample":
            ids, mask = row["response"]["ids"], row["response"]["mask"]
            responses.append([i for i, m in zip(ids, mask, strict=True) if m])
            prompts.append(row["uid"])
    return responses, prompts


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_the_watchdogs_defaults_do_not_trip_on_a_healthy_run(
    algo: str, request: pytest.FixtureRequest
):
    """The watchdog's default rules, replayed over every step's metrics and responses: no trip."""
    from verl_gsm8k.guard.rules import KL_KEYS, Watchdog, top_token_share
    from verl_gsm8k.guard.thresholds import Thresholds

    run: Learned = request.getfixturevalue(f"learned_{algo}")
    watchdog = Watchdog(Thresholds())
    kl, entropy, share = [], [], 0.0
    for step in range(1, STEPS + 1):
        metrics = run.steps[step]
        responses, prompts = traced_responses(run, step)
        assert responses, f"{algo}: no traced response at step {step}"
        assert watchdog.check(step, metrics, responses, prompts) == [], (algo, step)
        watchdog.accept(metrics)
        kl.append(next(metrics[k] for k in KL_KEYS if k in metrics))
        entropy.append(metrics["actor/entropy"])
        share = max([share] + [top_token_share(r) for r in responses])
    # the guarded trainer ran the same rules inside the run, the 10-step ones with their history
    assert read_trips(run.run_dir) == [], read_trips(run.run_dir)
    score = [run.steps[s][SCORE] for s in range(1, STEPS + 1)]
    print(
        f"{algo}: KL up to {max(kl):.3g}, entropy down to {min(entropy):.3g}, top token share "
        f"in a response up to {share:.3g}, score {min(score):.3g}..{max(score):.3g}"
    )


def test_the_best_validation_step_is_kept_whole_between_saves(learned_grpo: Learned):
    """KEEP_BEST=1 on the GRPO run: the first step with the highest accuracy is on disk, whole and
    stamped, though it falls between the recipe's saves (step 5, the first best, on every seed)."""
    from verl_gsm8k.common.run_dir import read_best, read_stamp
    from verl_gsm8k.resume.verify import problem

    run = learned_grpo
    accuracy = {s: m[VAL] for s, m in sorted(run.steps.items()) if VAL in m and s > 0}
    first_best = min(s for s, v in accuracy.items() if v == max(accuracy.values()))
    best = read_best(run.run_dir)
    assert best is not None, accuracy
    assert (best["step"], best["metric"]) == (first_best, VAL), (best, accuracy)
    step_dir = run.run_dir / f"global_step_{first_best}"
    assert problem(step_dir, ("actor",)) is None
    (launch,) = (run.run_dir / "launches").glob("launch-*.yaml")
    assert read_stamp(run.run_dir, first_best) == launch.stem[len("launch-") :] == best["launch"]
    # the first validation after step 0 is always a best, between the recipe's saves
    first = min(accuracy)
    assert first % 10 != 0, accuracy
    assert f"step {first} is the best so far" in run.stdout, run.stdout[-3000:]


def test_report_page_draws_the_rising_curve(learned_ppo: Learned, tmp_path: Path):
    ppo = learned_ppo
    require_chromium()
    dom, _ = render(ppo.run_dir / "report" / "report.html", tmp_path)
    drawn = dict(plot_series(dom, "Validation accuracy")["val_acc"])
    logged = {step: m[VAL] for step, m in ppo.steps.items() if VAL in m}
    assert sorted(round(s) for s in drawn) == sorted(logged)
    for step, value in drawn.items():
        assert abs(value - logged[round(step)]) < 0.02
    assert drawn[max(drawn)] - drawn[min(drawn)] >= RISE


def start_dry_run(recipe: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(ROOT / "recipes" / f"{recipe}.sh")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_plain_pytorch_policy_gradient_lifts_the_same_warm_start_and_needs_the_reward(
    learn_base: Path, learned_ppo: Learned
):
    """The yardstick: what a correct update, written without verl, does to the same numbers; and
    its control: with the reward's sign flipped it makes the model worse."""
    from reference_pg import Policy, load_problems, train

    train_set = load_problems(str(toy_dir(learn_base) / "rl" / "train.parquet"))
    test_set = load_problems(str(toy_dir(learn_base) / "rl" / "test.parquet"))
    policy = Policy(str(warm_start_dir(learn_base)))
    before = policy.greedy_accuracy(test_set)
    scores = train(policy, train_set, steps=STEPS, prompts_per_step=16, n=8, lr=3e-4)
    after = policy.greedy_accuracy(test_set)
    assert after - before >= RISE, (before, after, scores)
    assert sum(scores[-5:]) / 5 > sum(scores[:5]) / 5
    flipped = Policy(str(warm_start_dir(learn_base)))
    train(flipped, train_set, steps=10, prompts_per_step=16, n=8, lr=3e-4, sign=-1.0)
    assert flipped.greedy_accuracy(test_set) < before

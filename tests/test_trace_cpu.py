"""The per-token trace of the real learning runs holds the run's own numbers: verl's advantages,
returns and KL recomputed from the traced inputs, the tokens verl dumped, rewards/gsm8k.py's
scores; the replay page shows the loop in Chromium.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import browser
import pytest
from learn_runs import STEPS, Learned
from transformers import AutoTokenizer

from rewards.gsm8k import compute_score
from verl_gsm8k.replay.load import load_trace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]
# The trace keeps 7 significant digits; GAE sums up to ~12 of those terms.
TOL = 2e-5


def traced(run: Learned) -> dict:
    trace = load_trace(run.run_dir)
    assert not trace.issues, trace.issues
    assert sorted(trace.steps) == list(range(1, STEPS + 1))
    return trace.steps


def close(a: float, b: float, tol: float = TOL) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """Generalised advantage estimation, written out (one response, no padding)."""
    out, running, next_value = [], 0.0, 0.0
    for reward, value in zip(reversed(rewards), reversed(values), strict=True):
        delta = reward + gamma * next_value - value
        running = delta + gamma * lam * running
        out.append(running)
        next_value = value
    return out[::-1]


def test_ppo_trace_gae_advantages_and_returns_are_the_runs(learned_ppo: Learned):
    for step, ts in traced(learned_ppo).items():
        run, whiten = ts.head["run"], ts.head["batch"]["advantage_whitening"]
        assert run["adv_estimator"] == "gae" and ts.samples, step
        scale = 1 / math.sqrt(whiten["var"] + whiten["eps"])
        for s in ts.samples:
            pt = s["per_token"]
            raw = gae(pt["reward"], pt["value"], run["gamma"], run["lam"])
            assert all(
                close(r + v, ret) for r, v, ret in zip(raw, pt["value"], pt["return"], strict=True)
            ), (step, s["key"])
            whitened = [(r - whiten["mean"]) * scale for r in raw]
            assert all(close(w, a, 1e-4) for w, a in zip(whitened, pt["advantage"], strict=True)), (
                step, s["key"], whitened[:4], pt["advantage"][:4])  # fmt: skip


def test_ppo_trace_kl_is_the_reward_penalty(learned_ppo: Learned):
    for step, ts in traced(learned_ppo).items():
        kl = ts.head["run"]["kl"]
        assert (kl["in"], kl["estimator"]) == ("reward", "kl")
        coef = ts.head["metrics"]["actor/reward_kl_penalty_coeff"]
        for s in ts.samples:
            pt = s["per_token"]
            for i, (old, ref) in enumerate(
                zip(pt["old_log_prob"], pt["ref_log_prob"], strict=True)
            ):
                assert close(pt["kl"][i], old - ref, 1e-4), (step, i)
                # verl's own token reward = score - coef x KL: the traced KL is the charged one
                assert close(pt["score"][i] - pt["reward"][i], coef * pt["kl"][i], 1e-4), (step, i)


def test_grpo_trace_advantages_are_the_group_normalised_scores(learned_grpo: Learned):
    for step, ts in traced(learned_grpo).items():
        run = ts.head["run"]
        assert run["adv_estimator"] == "grpo" and "value" in ts.samples[0]["absent"]
        groups: dict[str, list[dict]] = {}
        for s in ts.samples:
            groups.setdefault(s["uid"], []).append(s)
        assert all(len(g) == run["rollout_n"] for g in groups.values()), step  # whole groups
        for group in groups.values():
            scores = [s["score"] for s in group]
            mean, std = statistics.fmean(scores), statistics.stdev(scores)
            for s in group:
                expected = (s["score"] - mean) / (std + 1e-6)
                assert all(close(a, expected, 1e-4) for a in s["per_token"]["advantage"]), step
        assert ts.head["run"]["kl"]["estimator"] == "low_var_kl"


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_traced_tokens_are_the_dumped_responses_and_their_scores_the_rewards(
    algo: str, request: pytest.FixtureRequest
):
    run: Learned = request.getfixturevalue(f"learned_{algo}")
    tokenizer = AutoTokenizer.from_pretrained(
        json.loads(next((run.run_dir / "trace").glob("1.jsonl")).read_text().splitlines()[0])[
            "run"
        ]["model"]
    )
    special = set(tokenizer.all_special_ids)
    for step, ts in traced(run).items():
        dumped = {r["uid"]: r for r in map(json.loads, (run.run_dir / "rollouts" /
                  f"{step}.jsonl").read_text().splitlines())}  # fmt: skip
        for s in ts.samples:
            row = dumped[s["key"]]
            text = tokenizer.decode(s["response"]["ids"], skip_special_tokens=True)
            assert text == row["output"], (step, s["key"])
            # each token's own text, special ones (the end of turn, or an <|endoftext|> the
            # sampler drew mid-response) left out as the decode above leaves them out
            ids, tokens = s["response"]["ids"], s["response"]["tokens"]
            assert "".join(t for i, t in zip(ids, tokens, strict=True) if i not in special) == text
            assert s["score"] == row["score"] == compute_score(
                "openai/gsm8k", text, s["ground_truth"])["score"], (step, s["key"])  # fmt: skip
            assert s["ground_truth"] == row["gts"]


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_the_real_runs_replay_page_shows_the_loop(algo: str, request: pytest.FixtureRequest,
                                                  tmp_path: Path):  # fmt: skip
    run: Learned = request.getfixturevalue(f"learned_{algo}")
    page = run.run_dir / "report" / "replay.html"
    assert page.is_file(), "learn_tiny.sh's report writes the replay beside report.html"
    dom = browser.dom(f"{page.as_uri()}#step={STEPS}&sample=0&token=3", tmp_path)
    tokens = re.findall(r'class="tok[^"]*" tabindex="0" data-i="\d+" data-adv="([^"]+)" '
                        r'style="background:\s*([^";]+)', dom)  # fmt: skip
    assert tokens and all(adv != "n/a" for adv, _ in tokens)
    assert len({colour for _, colour in tokens}) > 1 or algo == "grpo"  # GAE varies per token
    panel = dom.split('id="panel"', 1)[1]
    assert "token 3" in panel and 'data-num="advantage"' in panel and 'data-num="kl"' in panel
    if algo == "ppo":
        assert 'data-num="value"' in panel and 'data-num="return"' in panel
        assert re.findall(r'data-curve="(\w+)"', dom) == ["kl", "value", "advantage"]
    else:
        assert "absent in this run: no critic" in dom and 'id="group-table"' in dom
        assert re.search(r'id="group-std">[0-9.]+<', dom)

"""`python -m verl_gsm8k.report RUN_A RUN_B` on the real PPO and GRPO learning runs draws both
runs' curves in Chromium, and its config diff names what differed and no key the two share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser import dom, plot_series
from learn_runs import Learned

from verl_gsm8k.compare.config import CRITIC_IN_USE, NAMED
from verl_gsm8k.report import cli as report

# The first reader of the GRPO run makes it: the limit covers that run on a slow machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]
VAL = "val-core/openai/gsm8k/acc/mean@1"


def test_ppo_and_grpo_learning_runs_side_by_side(
    learned_ppo: Learned, learned_grpo: Learned, tmp_path: Path
):
    out = tmp_path / "cmp"
    runs = [str(learned_ppo.run_dir), str(learned_grpo.run_dir)]
    assert report.main([*runs, "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["key"]: r for rows in summary["config_diff"]["groups"].values() for r in rows}
    ppo, grpo = learned_ppo.run_dir.name, learned_grpo.run_dir.name
    assert rows["algorithm.adv_estimator"]["values"] == {ppo: "gae", grpo: "grpo"}
    assert rows[CRITIC_IN_USE]["values"] == {ppo: True, grpo: False}
    assert rows["algorithm.use_kl_in_reward"]["values"] == {ppo: True, grpo: False}
    # same recipe and data: nothing of data or rollout differs; the run's name is its own group
    groups = summary["config_diff"]["groups"]
    named = {r["key"] for r in groups[NAMED]}
    assert {"trainer.experiment_name", "trainer.default_local_dir"} <= named, named
    settings = [r["key"] for g, rows in groups.items() if g != NAMED for r in rows]
    assert not [k for k in settings if k.startswith(("data.", "actor_rollout_ref.rollout."))], rows
    assert rows["actor_rollout_ref.actor.use_kl_loss"]["values"] == {ppo: False, grpo: True}
    drawn = plot_series(dom(out / "comparison.html", tmp_path), "Validation accuracy by step")
    assert set(drawn) == {ppo, grpo}
    for run in (learned_ppo, learned_grpo):
        logged = {s: m[VAL] for s, m in run.steps.items() if VAL in m}
        points = drawn[run.run_dir.name]
        assert [round(x) for x, _ in points] == sorted(logged)
        assert all(abs(y - logged[round(x)]) < 0.01 for x, y in points)

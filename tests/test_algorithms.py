"""The algorithm recipes (docs/algorithms.md): each composed config against the installed verl,
its preflight (verl_gsm8k/preflight/algorithm.py), and every combination the preflight refuses
because it would silently train something else. No training: dry runs and composed configs."""

from __future__ import annotations

import re

import pytest
from helpers import ROOT, composed_config, get, recipe_env, run_recipe
from omegaconf import OmegaConf

from verl_gsm8k.preflight.algorithm import algorithm_problems, overlong_problems
from verl_gsm8k.preflight.cli import LEGACY_KEYS
from verl_gsm8k.preflight.compose import compose, legacy_key_problems

# recipe -> the keys its config must set (the papers' settings: docs/algorithms.md).
ALGORITHMS = {
    "rloo": {
        "algorithm.adv_estimator": "rloo",
        "algorithm.use_kl_in_reward": True,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.rollout.n": 4,
    },
    "reinforce_pp": {
        "algorithm.adv_estimator": "reinforce_plus_plus",
        "algorithm.use_kl_in_reward": True,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.rollout.n": 1,
    },
    "reinforce_pp_baseline": {
        "algorithm.adv_estimator": "reinforce_plus_plus_baseline",
        "algorithm.use_kl_in_reward": True,
        "actor_rollout_ref.rollout.n": 8,
    },
    "remax": {
        "algorithm.adv_estimator": "remax",
        "algorithm.use_kl_in_reward": True,
        "trainer.use_v1": False,
        "actor_rollout_ref.rollout.n": 1,
    },
    "drgrpo": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": False,
        "algorithm.use_kl_in_reward": False,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
        "actor_rollout_ref.actor.loss_scale_factor": 256,  # MAX_RESPONSE_LENGTH's default
        "actor_rollout_ref.rollout.n": 8,
    },
    "dapo": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.actor.clip_ratio_low": 0.2,
        "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "algorithm.filter_groups.enable": True,
        "algorithm.filter_groups.metric": "acc",
        "algorithm.filter_groups.max_num_gen_batches": 0,
        "reward.reward_manager.name": "dapo",
        "reward.reward_kwargs.max_resp_len": 256,
        "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
        "actor_rollout_ref.rollout.n": 16,
    },
    "gspo": {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
        "actor_rollout_ref.actor.clip_ratio_low": 0.0003,
        "actor_rollout_ref.actor.clip_ratio_high": 0.0004,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
        "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.rollout.n": 16,
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_recipe_passes_its_dry_run(
    algo, tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    """The real recipe file: its knob defaults, the preflight (algorithm line included), and
    verl's own composed config (`--cfg job`)."""
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1")
    result = run_recipe(f"{algo}_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"preflight: \[ok\] algorithm: ", result.stdout), result.stdout[-3000:]
    cfg = composed_config(result.stdout)
    for key, value in ALGORITHMS[algo].items():
        got = get(cfg, key)
        if isinstance(got, str) and "${" in got:  # `--cfg job` prints interpolations unresolved
            got = get(cfg, got.strip("${}"))
        assert got == value, (algo, key, got)


@pytest.fixture(scope="module")
def configs() -> dict[str, object]:
    """Each algorithm's config (and PPO's, GRPO's) composed against the installed verl."""
    names = [*ALGORITHMS, "ppo", "grpo"]
    return {name: compose(ROOT / "configs", f"gsm8k_{name}", []) for name in names}


ROLLOUT_N = {name: keys["actor_rollout_ref.rollout.n"] for name, keys in ALGORITHMS.items()}
ROLLOUT_N.update(ppo=1, grpo=5)  # the PPO and GRPO recipes' ROLLOUT_N


def variant(configs, name: str):
    """A copy of the composed config with the recipe's own knobs: ROLLOUT_N, MAX_RESPONSE_LENGTH."""
    cfg = OmegaConf.create(OmegaConf.to_container(configs[name], resolve=False))
    cfg.actor_rollout_ref.rollout.n = ROLLOUT_N[name]
    cfg.data.max_response_length = 256
    return cfg


REWARD_KEYS = {"score", "acc", "format", "pred_found", "hedged", "clipped"}  # rewards/gsm8k.py


@pytest.mark.parametrize("name", [*ALGORITHMS, "ppo", "grpo"])
def test_the_shipped_configs_pass(configs, name):
    cfg = variant(configs, name)
    assert algorithm_problems(cfg, REWARD_KEYS) + overlong_problems(cfg) == []


# (config, changed keys, the text of the one refusal): each a combination that would train
# something else than its name says.
MISTAKES = [
    ("rloo", {"actor_rollout_ref.rollout.n": 1}, "rollout.n = 1: algorithm.adv_estimator=rloo"),
    (
        "reinforce_pp_baseline",
        {"actor_rollout_ref.rollout.n": 1},
        "adv_estimator=reinforce_plus_plus_baseline compares the responses",
    ),
    ("grpo", {"critic.enable": True}, "critic.enable=true with algorithm.adv_estimator=grpo"),
    ("ppo", {"critic.enable": False}, "critic.enable=false with algorithm.adv_estimator=gae"),
    ("grpo", {"algorithm.use_kl_in_reward": True}, "is charged twice"),
    (
        "drgrpo",
        {"algorithm.adv_estimator": "grpo_vectorized"},
        "norm_adv_by_std_in_grpo=false is ignored by adv_estimator=grpo_vectorized",
    ),
    ("drgrpo", {"actor_rollout_ref.actor.loss_scale_factor": None}, "loss_scale_factor null"),
    ("gspo", {"actor_rollout_ref.actor.clip_ratio_high": 0.2}, "clip_ratio_high=0.2: GSPO"),
    ("remax", {"trainer.use_v1": True}, "adv_estimator=remax with trainer.use_v1=true"),
    ("dapo", {"trainer.use_v1": False}, "the legacy trainer never reads algorithm.filter_groups"),
    (
        "dapo",
        {"algorithm.filter_groups.max_num_gen_batches": 10},
        "max_num_gen_batches=10 is ignored by the v1 trainer",
    ),
    ("dapo", {"actor_rollout_ref.rollout.n": 1}, "a group of one response is never dropped"),
    ("dapo", {"algorithm.filter_groups.metric": "reward"}, "the overlong penalty shapes"),
    ("dapo", {"algorithm.filter_groups.metric": "accuracy"}, "metric=accuracy is not a key"),
    (
        "dapo",
        {"reward.reward_manager.name": "naive"},
        "read only by the dapo reward manager",
    ),
    (
        "dapo",
        {"reward.reward_kwargs.overlong_buffer_cfg.len": 300},
        "overlong_buffer_cfg.len=300 must be above 0 and below data.max_response_length",
    ),
]


@pytest.mark.parametrize(
    ("name", "changes", "expected"), MISTAKES, ids=[m[2][:40] for m in MISTAKES]
)
def test_a_combination_that_trains_something_else_is_refused(configs, name, changes, expected):
    cfg = variant(configs, name)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    problems = algorithm_problems(cfg, REWARD_KEYS) + overlong_problems(cfg)
    assert any(expected in line for line in problems), problems
    assert all("\n" not in line for line in problems)


def test_reinforce_pp_needs_no_group(configs):
    """The one group-free estimator among the new ones: one response per prompt is its design."""
    cfg = variant(configs, "reinforce_pp")
    assert cfg.actor_rollout_ref.rollout.n == 1
    assert algorithm_problems(cfg) == []


def test_the_old_name_of_dapos_overlong_settings_is_refused_with_the_new_one():
    key = "reward_model.reward_kwargs.overlong_buffer_cfg.enable"
    (problem,) = legacy_key_problems([key], LEGACY_KEYS)
    assert "use reward.reward_kwargs.overlong_buffer_cfg.enable" in problem

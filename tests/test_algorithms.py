"""The algorithm recipes' configs against verl, their preflight (preflight/algorithm.py) and the
combinations that would silently train something else. No training."""

import inspect
import re

import pytest
from helpers import ROOT, composed_config, get, launch_in_process, recipe_env
from omegaconf import OmegaConf

from verl_gsm8k.launch.knobs import LEARN_ALGOS
from verl_gsm8k.preflight import algorithm as alg
from verl_gsm8k.preflight.cli import LEGACY_KEYS
from verl_gsm8k.preflight.compose import compose, legacy_key_problems

# recipe -> the keys its config must set (the papers' settings: docs/algorithms.md).
A, R, ALG = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "algorithm."
OB = "reward.reward_kwargs.overlong_buffer_cfg.len"
N1, ESTIMATOR, MAX_RESP = f"{R}n", f"{ALG}adv_estimator", "reward.reward_kwargs.max_resp_len"
ALGORITHMS = {
    "rloo": {ESTIMATOR: "rloo", f"{ALG}use_kl_in_reward": True, f"{A}use_kl_loss": False, N1: 4},
    "reinforce_pp": {ESTIMATOR: "reinforce_plus_plus", f"{ALG}use_kl_in_reward": True,
                     f"{A}use_kl_loss": False, N1: 1,
                     f"{A}ppo_mini_batch_size": 128},  # one update a step: verl's example
    "reinforce_pp_baseline": {ESTIMATOR: "reinforce_plus_plus_baseline",
                              f"{ALG}use_kl_in_reward": True, N1: 8,
                              f"{A}ppo_mini_batch_size": 128},
    "remax": {ESTIMATOR: "remax", f"{ALG}use_kl_in_reward": True, "trainer.use_v1": False, N1: 1},
    "drgrpo": {ESTIMATOR: "grpo", f"{ALG}norm_adv_by_std_in_grpo": False,
               f"{ALG}use_kl_in_reward": False, f"{A}use_kl_loss": False,
               f"{A}loss_agg_mode": "seq-mean-token-sum-norm",
               f"{A}loss_scale_factor": 256, N1: 8},  # MAX_RESPONSE_LENGTH's default
    "dapo": {ESTIMATOR: "grpo", f"{ALG}use_kl_in_reward": False,
             f"{A}use_kl_loss": False, f"{A}clip_ratio_low": 0.2, f"{A}clip_ratio_high": 0.28,
             f"{A}loss_agg_mode": "token-mean", f"{ALG}filter_groups.enable": True,
             f"{ALG}filter_groups.metric": "acc", f"{ALG}filter_groups.max_num_gen_batches": 0,
             "reward.reward_manager.name": "dapo", MAX_RESP: 256,
             "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
             OB: 51,  # a fifth of 256
             f"{A}clip_ratio_c": 10.0,  # verl's DAPO example
             f"{A}ppo_mini_batch_size": 8, N1: 16},  # 16 mini-batches: verl's example
    "gspo": {ESTIMATOR: "grpo", f"{A}policy_loss.loss_mode": "gspo",
             f"{A}clip_ratio_low": 0.0003, f"{A}clip_ratio_high": 0.0004,
             f"{A}loss_agg_mode": "seq-mean-token-mean", f"{A}use_kl_loss": False,
             f"{A}ppo_mini_batch_size": 32, N1: 16},  # 4 mini-batches: the paper's
}  # fmt: skip


def test_every_algorithm_config_has_its_row_here():
    assert set(LEARN_ALGOS) - {"ppo", "grpo"} == set(ALGORITHMS)


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_recipe_passes_its_dry_run(algo, tiny_model_dir, prepared_gsm8k_dir,
                                                   tmp_path):  # fmt: skip
    kl = {"KL_COEF": "0.01"} if algo == "dapo" else {}
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1", **kl)
    result = launch_in_process(f"{algo}_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"preflight: \[ok\] algorithm: ", result.stdout), result.stdout[-3000:]
    warned = "preflight: [warn] algorithm: KL_COEF=0.01 does nothing here" in result.stdout
    assert warned == bool(kl)
    assert re.search(r"preflight: \[ok\] trace: \d+ responses per step", result.stdout)
    assert "preflight: [warn] guard" not in result.stdout
    cfg = composed_config(result.stdout)
    for key, value in ALGORITHMS[algo].items():
        got = get(cfg, key)
        if isinstance(got, str) and "${" in got:  # `--cfg job` prints interpolations unresolved
            got = get(cfg, got.strip("${}"))
        assert got == value, (algo, key, got)


@pytest.mark.parametrize(
    "length, user, buffer",
    [("256", [], "51"), ("1024", [], "204"), ("7", [], "1"),
     ("256", ["data.max_response_length=1024"], "204"),
     ("256", ["data.max_response_length=1024", f"{OB}=100"], "100")],
)  # fmt: skip
def test_dapos_overlong_buffer_is_a_fifth_of_the_response_length(length, user, buffer):
    from verl_gsm8k.launch.plan import recipe_plan

    env = {"HOME": "/nonexistent", "MAX_RESPONSE_LENGTH": length}
    plan = recipe_plan(ROOT / "recipes" / "dapo_qwen2.5-0.5b_gsm8k.sh", env, gpu=True, user=user)
    assert [o for o in plan.all_overrides(user) if o.startswith(OB)][-1] == f"{OB}={buffer}"
    grpo = recipe_plan(ROOT / "recipes" / "grpo_qwen2.5-0.5b_gsm8k.sh", env, gpu=True)
    assert not any(o.startswith(OB) for o in grpo.all_overrides([]))  # no penalty: not set


@pytest.mark.parametrize("algo", ["dapo", "gspo", "drgrpo"])
def test_a_kl_coefficient_is_warned_where_the_config_charges_no_kl(configs, algo):
    from verl_gsm8k.preflight.algorithm import unused_kl_warnings

    chosen = {f"{ALG}kl_ctrl.kl_coef": "KL_COEF=0.01", f"{A}kl_loss_coef": "KL_COEF=0.01"}
    (line,) = unused_kl_warnings(variant(configs, algo), chosen)
    assert line.startswith("KL_COEF=0.01 does nothing here: this config charges no KL")
    assert unused_kl_warnings(variant(configs, algo), {}) == []
    assert unused_kl_warnings(variant(configs, "grpo"), chosen) == []


@pytest.fixture(scope="module")
def configs() -> dict[str, object]:
    return {name: compose(ROOT / "configs", f"gsm8k_{name}", []) for name in SHIPPED}


ROLLOUT_N = {name: keys[N1] for name, keys in ALGORITHMS.items()}
ROLLOUT_N.update(ppo=1, grpo=5)  # the PPO and GRPO recipes' ROLLOUT_N


def variant(configs, name: str):
    cfg = OmegaConf.create(OmegaConf.to_container(configs[name], resolve=False))
    cfg.actor_rollout_ref.rollout.n = ROLLOUT_N[name]
    cfg.data.max_response_length = 256
    return cfg


REWARD_KEYS = {"score", "acc", "format", "pred_found", "hedged", "clipped"}  # rewards/gsm8k.py


SHIPPED = [*ALGORITHMS, "ppo", "grpo"]


@pytest.mark.parametrize(
    ("name", "changes"), [*((n, {}) for n in SHIPPED), ("dapo", {OB: 256})],
    ids=[*SHIPPED, "dapo-buffer-as-long-as-max_resp_len"],
)  # fmt: skip
def test_the_shipped_configs_pass(configs, name, changes):
    cfg = changed(configs, name, changes)
    assert refusals(cfg) == []
    assert alg.algorithm_warnings(cfg) == []


# (config, changed keys, the refusal's text): verl refuses it or it trains something else.
MISTAKES = [
    ("rloo", {N1: 1, ESTIMATOR: "rloo_vectorized"}, "the advantage is 0 for every response"),
    ("grpo", {N1: 1, ESTIMATOR: "grpo_passk"}, "Pass@k requires at least 2 samples per group"),
    ("grpo", {"critic.enable": True}, "critic.enable=true with algorithm.adv_estimator=grpo"),
    ("ppo", {"critic.enable": False}, "critic.enable=false with algorithm.adv_estimator=gae"),
    ("drgrpo", {ESTIMATOR: "grpo_vectorized"},
     "norm_adv_by_std_in_grpo=false is ignored by adv_estimator=grpo_vectorized"),
    ("drgrpo", {f"{A}loss_scale_factor": None}, "loss_scale_factor null"),
    ("remax", {"trainer.use_v1": True}, "adv_estimator=remax with trainer.use_v1=true"),
    ("dapo", {"trainer.use_v1": False}, "the legacy trainer never reads algorithm.filter_groups"),
    ("dapo", {f"{ALG}filter_groups.max_num_gen_batches": 10},
     "max_num_gen_batches=10 is ignored by the v1 trainer"),
    ("dapo", {N1: 1}, "a group of one response is never dropped"),
    ("dapo", {f"{ALG}filter_groups.metric": "reward"}, "the overlong penalty shapes"),
    ("dapo", {f"{ALG}filter_groups.metric": "accuracy"}, "metric=accuracy is not a key"),
    ("dapo", {"reward.reward_manager.name": "naive"}, "read only by the dapo reward manager"),
    ("dapo", {OB: 300},
     "overlong_buffer_cfg.len=300 must be above 0 and at most reward.reward_kwargs.max_resp_len"),
    ("dapo", {OB: 0}, "overlong_buffer_cfg.len=0 must be above 0"),
    ("dapo", {MAX_RESP: None}, "max_resp_len is not set: verl's dapo reward manager asserts it"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "changes", "expected"), MISTAKES, ids=[m[2][:40] for m in MISTAKES]
)
def test_a_combination_that_trains_something_else_is_refused(configs, name, changes, expected):
    cfg = changed(configs, name, changes)
    problems = refusals(cfg)
    assert any(expected in line for line in problems), problems
    assert all("\n" not in line for line in problems)


def refusals(cfg) -> list[str]:
    return alg.algorithm_problems(cfg, REWARD_KEYS) + alg.overlong_problems(cfg)


def changed(configs, name: str, changes: dict):
    cfg = variant(configs, name)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


# (config, changed keys, the warning's text): verl runs them as written; the launch goes on.
WARNINGS = [
    ("reinforce_pp_baseline", {N1: 1},
     "adv_estimator=reinforce_plus_plus_baseline compares the responses"),
    ("rloo", {N1: 1},
     "adv_estimator=rloo compares the responses within a prompt's group; verl allows this"),
    ("grpo", {N1: 1}, "with one response verl gives it mean 0 and std 1"),
    *[("grpo", {N1: 1, ESTIMATOR: e}, f"adv_estimator={e} compares the responses")
      for e in ("gpg", "optimal_token_baseline", "tir_optimal_token_baseline")],
    ("grpo", {f"{ALG}use_kl_in_reward": True}, "charges the KL to the reference twice"),
    ("rloo", {f"{A}use_kl_loss": True}, "charges the KL to the reference twice"),
    ("gspo", {f"{A}clip_ratio_high": 0.2},
     "clip_ratio_high=0.2: verl allows this and clips the sequence-level ratio"),
    ("dapo", {MAX_RESP: 512, OB: 300},
     "max_resp_len=512 with data.max_response_length=256: verl allows this"),
    ("dapo", {MAX_RESP: 200}, "the penalty keeps growing past -penalty_factor"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "changes", "expected"), WARNINGS, ids=[w[2][:40] for w in WARNINGS]
)
def test_a_combination_verl_allows_is_a_warning(configs, name, changes, expected):
    cfg = changed(configs, name, changes)
    assert refusals(cfg) == []
    (warning,) = alg.algorithm_warnings(cfg)
    assert expected in warning and "verl allows this" in warning, warning
    assert "\n" not in warning


def test_every_estimator_verl_groups_by_prompt_is_checked_at_one_response():
    from verl.trainer.ppo import core_algos

    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    grouped = {n for n, fn in registry.items() if "index" in inspect.signature(fn).parameters}
    assert grouped == set(alg.GROUP_AT_ONE)


@pytest.mark.parametrize("estimator", sorted(alg.GROUP_AT_ONE))
def test_the_reason_at_one_response_is_what_verl_computes(estimator):  # 4 prompts, 1 response
    import numpy as np
    import torch
    from verl.trainer.ppo import core_algos

    scores = torch.tensor([1.0, 0.0, 1.0, 0.5])
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = scores
    kwargs = {
        "token_level_rewards": rewards,
        "response_mask": torch.ones(4, 3),
        "index": np.array(["a", "b", "c", "d"], dtype=object),
        "config": OmegaConf.create({"norm_adv_by_std_in_grpo": True, "gamma": 1.0}),
        "old_log_probs": torch.full((4, 3), -1.0),  # the optimal token baselines' inputs
        "sum_pi_squared": torch.full((4, 3), 0.3),
    }
    fn = core_algos.get_adv_estimator_fn(estimator)
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    reason = alg.GROUP_AT_ONE[estimator]
    try:
        advantages, _ = fn(**kwargs)
    except ValueError as exc:
        assert "raises ValueError" in reason and str(exc).split(".")[0] in reason, reason
        return
    first = advantages[:, 0]
    assert torch.allclose(advantages, first.unsqueeze(-1).expand(4, 3))  # one value per response
    if torch.all(first == 0):
        assert "the advantage is 0 for every response" in reason, reason
    elif torch.allclose(first, scores, atol=1e-5):
        assert "the raw score" in reason and "times" not in reason, reason
    elif torch.allclose(first, scores * first[0] / scores[0]):
        assert "the raw score times" in reason, reason
    else:
        assert abs(first.mean()) < 1e-5  # whitened: mean 0 over the batch
        assert "whitens over the batch" in reason, reason


def test_the_old_name_of_dapos_overlong_settings_is_refused_with_the_new_one():
    key = "reward_model.reward_kwargs.overlong_buffer_cfg.enable"
    (problem,) = legacy_key_problems([key], LEGACY_KEYS)
    assert "use reward.reward_kwargs.overlong_buffer_cfg.enable" in problem

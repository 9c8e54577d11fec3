"""What each RL algorithm needs from a verl 0.9.1 config, and the combinations that would silently
train something else (docs/algorithms.md): one error line each, naming the key.

  group     the estimators with a group baseline need rollout.n >= 2: with one response per
            prompt verl falls back to a baseline of 0 (core_algos.py: ``len(id2score[idx]) == 1``)
            and the raw score becomes the advantage;
  critic    a critic is trained only for GAE; critic.enable=true beside another estimator trains
            one that nothing reads, critic.enable=false beside GAE has no values to estimate with;
  kl        the KL to the reference in the reward (use_kl_in_reward) or in the loss
            (use_kl_loss), never both: both charge it twice;
  std       algorithm.norm_adv_by_std_in_grpo=false is read only by the grpo and grpo_passk
            estimators (grpo_vectorized, rloo, ... ignore it: Dr. GRPO would still divide by the
            std);
  loss      seq-mean-token-sum-norm (Dr. GRPO) without loss_scale_factor divides by the padded
            length of each micro-batch, which varies; GSPO with a token-sized clip range never
            clips its sequence ratio;
  trainer   ReMax's greedy baseline is generated only by the legacy trainer
            (trainer.use_v1=false); dynamic sampling (algorithm.filter_groups) only by the v1
            trainer, which ignores max_num_gen_batches;
  dapo      the filter needs groups (rollout.n >= 2), a metric the reward reports, and must not
            read the reward the overlong penalty shapes.
"""

from __future__ import annotations

from typing import Any

from verl_gsm8k.preflight.lines import Report

# Estimators whose baseline is the prompt's group (verl/trainer/ppo/core_algos.py).
GROUP_ESTIMATORS = frozenset(
    {
        "grpo",
        "grpo_vectorized",
        "grpo_passk",
        "gdpo",
        "rloo",
        "rloo_vectorized",
        "reinforce_plus_plus_baseline",
        "opo",
    }
)
# The estimators that read algorithm.norm_adv_by_std_in_grpo: compute_advantage passes it to grpo
# (trainer/ppo/ray_trainer.py ~235-245), grpo_passk reads it from the config (core_algos.py ~500).
STD_READERS = frozenset({"grpo", "grpo_passk"})
# GSPO's ratio is a geometric mean of token ratios: the paper clips it to [1-3e-4, 1+4e-4]
# (arXiv:2507.18071, section 5.1). A range this wide or wider never clips it.
GSPO_MAX_CLIP = 0.01
# The names a filter metric may take besides the reward's own keys: "reward" is verl's canonical
# score (trainer/ppo/v1/replay_buffer.py FILTER_GROUPS_REWARD_METRIC), the shaped one.
CANONICAL_REWARD = "reward"


def _get(cfg: Any, dotted: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, dotted, default=default)


def algorithm_problems(cfg: Any, reward_keys: set[str] | None = None) -> list[str]:
    """One line per combination that trains something else than it says. ``reward_keys``: the
    keys the reward function returns (None: not known, the filter metric is not checked)."""
    algo = cfg.algorithm
    actor = cfg.actor_rollout_ref.actor
    estimator = str(algo.adv_estimator)
    n = int(cfg.actor_rollout_ref.rollout.n)
    v1 = bool(_get(cfg, "trainer.use_v1", True))
    problems: list[str] = []

    if estimator in GROUP_ESTIMATORS and n < 2:
        problems.append(
            f"actor_rollout_ref.rollout.n = {n}: algorithm.adv_estimator={estimator} compares the "
            "responses within a prompt's group; with one response verl's baseline falls back to "
            "0 and the raw score is the advantage; set ROLLOUT_N >= 2"
        )
    critic = _get(cfg, "critic.enable")
    if critic is True and estimator != "gae":
        problems.append(
            f"critic.enable=true with algorithm.adv_estimator={estimator}: only gae reads the "
            "critic's values; remove critic.enable (verl then skips the critic)"
        )
    if critic is False and estimator == "gae":
        problems.append(
            "critic.enable=false with algorithm.adv_estimator=gae: GAE needs the critic's values; "
            "pick a critic-free estimator (grpo, rloo, ...) or remove critic.enable"
        )
    if bool(algo.use_kl_in_reward) and bool(actor.use_kl_loss):
        problems.append(
            "algorithm.use_kl_in_reward=true and actor_rollout_ref.actor.use_kl_loss=true: the KL "
            "to the reference is charged twice (in the reward and in the loss); keep one"
        )
    if not bool(algo.get("norm_adv_by_std_in_grpo", True)) and estimator not in STD_READERS:
        problems.append(
            f"algorithm.norm_adv_by_std_in_grpo=false is ignored by adv_estimator={estimator} "
            f"(read only by {', '.join(sorted(STD_READERS))}): advantages keep whatever "
            "normalisation that estimator does"
        )
    if str(actor.loss_agg_mode) == "seq-mean-token-sum-norm" and actor.loss_scale_factor is None:
        problems.append(
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm with loss_scale_factor "
            "null divides by each micro-batch's padded length, which varies (core_algos.agg_loss); "
            "set actor_rollout_ref.actor.loss_scale_factor (Dr. GRPO: data.max_response_length)"
        )
    loss_mode = str(_get(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"))
    if loss_mode == "gspo":
        wide = {k: float(actor[k]) for k in ("clip_ratio_low", "clip_ratio_high")}
        wide = {k: v for k, v in wide.items() if v >= GSPO_MAX_CLIP}
        if wide:
            shown = ", ".join(f"actor_rollout_ref.actor.{k}={v:g}" for k, v in wide.items())
            problems.append(
                f"policy_loss.loss_mode=gspo with {shown}: GSPO clips a sequence-level ratio (a "
                f"geometric mean, within ~1e-3 of 1), so a range >= {GSPO_MAX_CLIP} never clips; "
                "the paper uses 3e-4 below and 4e-4 above"
            )
    if estimator == "remax" and v1:
        problems.append(
            "algorithm.adv_estimator=remax with trainer.use_v1=true: the v1 trainer never "
            "generates ReMax's greedy baseline (only trainer/ppo/ray_trainer.py ~1493 does) and "
            "fails at the first advantage; set trainer.use_v1=false (configs/gsm8k_remax.yaml)"
        )
    problems += _filter_problems(cfg, n, v1, reward_keys)
    return problems


def _filter_problems(cfg: Any, n: int, v1: bool, reward_keys: set[str] | None) -> list[str]:
    """DAPO's dynamic sampling (algorithm.filter_groups)."""
    groups = _get(cfg, "algorithm.filter_groups")
    if not groups or not bool(groups.get("enable", False)):
        return []
    key = "algorithm.filter_groups"
    if not v1:
        return [
            f"{key}.enable=true with trainer.use_v1=false: the legacy trainer never reads "
            f"{key} (only the v1 trainer's replay buffer filters groups): no group is dropped"
        ]
    problems = []
    if int(groups.get("max_num_gen_batches", 0) or 0) > 0:
        problems.append(
            f"{key}.max_num_gen_batches={groups.max_num_gen_batches} is ignored by the v1 "
            "trainer (trainer/ppo/v1/trainer_base.py ~205): nothing caps a step's generation; "
            f"set it to 0 ({key}.max_inflight_gen_batches bounds the batches in flight)"
        )
    if n < 2:
        problems.append(
            f"{key}.enable=true with actor_rollout_ref.rollout.n = {n}: a group of one response "
            "is never dropped (replay_buffer.py needs len > 1); set ROLLOUT_N >= 2"
        )
    metric = str(groups.get("metric") or "")
    overlong = _get(cfg, "reward.reward_kwargs.overlong_buffer_cfg.enable", False)
    manager = str(_get(cfg, "reward.reward_manager.name", "naive"))
    if metric == CANONICAL_REWARD and overlong and manager == "dapo":
        problems.append(
            f"{key}.metric=reward filters on the score the overlong penalty shapes (a group of "
            "equally right answers of different lengths is kept); filter on accuracy: "
            f"{key}.metric=acc"
        )
    elif metric != CANONICAL_REWARD and reward_keys is not None and metric not in reward_keys:
        problems.append(
            f"{key}.metric={metric or 'null'} is not a key of the reward's result "
            f"({', '.join(sorted(reward_keys))}): verl stops at the first filtered step"
        )
    return problems


def overlong_problems(cfg: Any) -> list[str]:
    """DAPO's overlong penalty: verl asserts these only inside its reward workers."""
    buffer = _get(cfg, "reward.reward_kwargs.overlong_buffer_cfg")
    if not buffer or not bool(buffer.get("enable", False)):
        return []
    key = "reward.reward_kwargs"
    if str(_get(cfg, "reward.reward_manager.name", "naive")) != "dapo":
        return [
            f"{key}.overlong_buffer_cfg.enable=true is read only by the dapo reward manager; set "
            f"reward.reward_manager.name=dapo (now {cfg.reward.reward_manager.name})"
        ]
    length = int(buffer.get("len", 0) or 0)
    limit = int(cfg.data.max_response_length)
    if not 0 < length < limit:
        return [
            f"{key}.overlong_buffer_cfg.len={length} must be above 0 and below "
            f"data.max_response_length={limit} (the penalty ramps over the last len tokens)"
        ]
    if _get(cfg, f"{key}.max_resp_len") is None:
        return [f"{key}.max_resp_len is not set: verl's dapo reward manager asserts it"]
    return []


def check_algorithm(cfg: Any, report: Report, reward_keys: set[str] | None = None) -> None:
    problems = algorithm_problems(cfg, reward_keys) + overlong_problems(cfg)
    for problem in problems:
        report.error("algorithm", problem)
    if problems:
        return
    actor = cfg.actor_rollout_ref.actor
    kl = (
        "KL in the reward"
        if cfg.algorithm.use_kl_in_reward
        else "KL in the loss"
        if actor.use_kl_loss
        else "no KL"
    )
    loss = _get(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla")
    extra = ""
    groups = _get(cfg, "algorithm.filter_groups")
    if groups and groups.get("enable", False):
        extra = f", dynamic sampling on {groups.metric}"
    report.ok(
        "algorithm",
        f"{cfg.algorithm.adv_estimator} advantages, {loss} loss ({actor.loss_agg_mode}), {kl}, "
        f"rollout.n={cfg.actor_rollout_ref.rollout.n}{extra}",
    )

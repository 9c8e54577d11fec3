"""What each RL algorithm needs from a verl 0.9.1 config (docs/algorithms.md), one line each,
naming the key. An error where verl itself fails or asserts, or where the run would silently
train something else than its name says; a warning, saying "verl allows this" and what verl then
does, where verl runs the combination as written and it may be meant.

  group     the estimators with a group baseline compare rollout.n >= 2 responses: with one
            response per prompt each computes something else (GROUP_AT_ONE). Refused where verl
            raises (grpo_passk) or where every advantage is 0 and nothing can be learned
            (rloo_vectorized); a warning where verl trains on the raw score instead;
  critic    a critic is trained only for GAE; critic.enable=true beside another estimator trains
            one that nothing reads, critic.enable=false beside GAE has no values to estimate with;
  kl        the KL to the reference in the reward (use_kl_in_reward) and in the loss
            (use_kl_loss) at once: verl allows it and charges the KL twice (a warning);
  std       algorithm.norm_adv_by_std_in_grpo=false is read only by the grpo and grpo_passk
            estimators (grpo_vectorized, rloo, ... ignore it: Dr. GRPO would still divide by the
            std);
  loss      seq-mean-token-sum-norm (Dr. GRPO) without loss_scale_factor divides by the padded
            length of each micro-batch, which varies; GSPO with a token-sized clip range: verl
            clips the sequence ratio to the range as given (a warning);
  trainer   ReMax's greedy baseline is generated only by the legacy trainer
            (trainer.use_v1=false); dynamic sampling (algorithm.filter_groups) only by the v1
            trainer, which ignores max_num_gen_batches;
  dapo      the filter needs groups (rollout.n >= 2), a metric the reward reports, and must not
            read the reward the overlong penalty shapes; the overlong penalty what verl's dapo
            reward manager asserts (max_resp_len set, 0 < len <= max_resp_len), and a
            max_resp_len other than data.max_response_length is a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_gsm8k.preflight.lines import Report

# What each estimator with a group baseline computes for a prompt with one response
# (rollout.n = 1), read in verl/trainer/ppo/core_algos.py (utils/groupwise.py for
# grpo_vectorized) and checked by running each on a batch of one-response groups.
RAW_SCORE = "the raw score is the advantage (REINFORCE without a baseline)"
GROUP_AT_ONE = {
    "grpo": f"verl gives it mean 0 and std 1 (core_algos.py ~315): {RAW_SCORE}",
    "grpo_vectorized": f"verl gives it mean 0 and std 1 (utils/groupwise.py ~214): {RAW_SCORE}",
    "gdpo": (
        "verl gives it mean 0 and std 1 (grpo's, core_algos.py ~315) and whitens over the batch "
        "(~466): the raw scores whitened over the batch, no group baseline"
    ),
    "grpo_passk": (
        "verl raises ValueError('Pass@k requires at least 2 samples per group') at the first "
        "advantage (core_algos.py ~517)"
    ),
    "reinforce_plus_plus_baseline": (
        "verl gives it mean 0 (core_algos.py ~572) and whitens over the batch (~582): plain "
        "REINFORCE++, no group baseline"
    ),
    "rloo": (
        "verl leaves its score as it is (core_algos.py ~629: leave-one-out only for more than "
        f"one): {RAW_SCORE}"
    ),
    "rloo_vectorized": (
        "verl multiplies the advantage by (group size > 1) (core_algos.py ~864): the advantage "
        "is 0 for every response, the policy gradient is zero"
    ),
    "opo": f"verl gives it baseline 0 (core_algos.py ~678): {RAW_SCORE}",
    "gpg": (
        "verl gives it mean 0 (core_algos.py ~817): the advantage is the raw score times the "
        "batch size over the count of non-zero scores (~811), no baseline"
    ),
    "optimal_token_baseline": (
        "verl gives it baseline 0 (core_algos.py ~950): the advantage is each token's return, "
        "the raw score for an outcome reward, no baseline"
    ),
    "tir_optimal_token_baseline": (
        "verl gives it baseline 0 (core_algos.py ~1085): the advantage is each token's return, "
        "the raw score for an outcome reward, no baseline"
    ),
}
GROUP_ESTIMATORS = frozenset(GROUP_AT_ONE)
# At one response per prompt these either fail in verl or train nothing: refused. The others run
# a baseline-free policy gradient, which may be meant: a warning.
REFUSED_AT_ONE = frozenset({"grpo_passk", "rloo_vectorized"})
# The estimators that read algorithm.norm_adv_by_std_in_grpo: compute_advantage passes it to grpo
# (trainer/ppo/ray_trainer.py ~235-245), grpo_passk reads it from the config (core_algos.py ~500).
STD_READERS = frozenset({"grpo", "grpo_passk"})
# GSPO's ratio is a geometric mean of token ratios, usually far closer to 1 than one token's:
# the paper clips it to [1-3e-4, 1+4e-4] (arXiv:2507.18071, section 5.1). verl clips it to the
# range as given (core_algos.py ~1596); a range of 0.01 or more, 25 times the paper's or more
# (verl's token-level default is 0.2), is warned about.
GSPO_WIDE_CLIP = 0.01
# The names a filter metric may take besides the reward's own keys: "reward" is verl's canonical
# score (trainer/ppo/v1/replay_buffer.py FILTER_GROUPS_REWARD_METRIC), the shaped one.
CANONICAL_REWARD = "reward"


def _get(cfg: Any, dotted: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, dotted, default=default)


def algorithm_problems(cfg: Any, reward_keys: set[str] | None = None) -> list[str]:
    """One line per combination that verl refuses or that trains something else than it says.
    ``reward_keys``: the keys the reward function returns (None: not known, the filter metric is
    not checked)."""
    algo = cfg.algorithm
    actor = cfg.actor_rollout_ref.actor
    estimator = str(algo.adv_estimator)
    n = int(cfg.actor_rollout_ref.rollout.n)
    v1 = bool(_get(cfg, "trainer.use_v1", True))
    problems: list[str] = []

    if estimator in REFUSED_AT_ONE and n < 2:
        problems.append(
            f"actor_rollout_ref.rollout.n = {n}: algorithm.adv_estimator={estimator} compares the "
            f"responses within a prompt's group; with one response {GROUP_AT_ONE[estimator]}; "
            "set ROLLOUT_N >= 2"
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
    if estimator == "remax" and v1:
        problems.append(
            "algorithm.adv_estimator=remax with trainer.use_v1=true: the v1 trainer never "
            "generates ReMax's greedy baseline (only trainer/ppo/ray_trainer.py ~1493 does) and "
            "fails at the first advantage; set trainer.use_v1=false (configs/gsm8k_remax.yaml)"
        )
    problems += _filter_problems(cfg, n, v1, reward_keys)
    return problems


def algorithm_warnings(cfg: Any) -> list[str]:
    """One line per combination verl runs as written that is seldom what is meant: each says
    "verl allows this" and what verl then does."""
    actor = cfg.actor_rollout_ref.actor
    warnings: list[str] = []
    estimator, n = str(cfg.algorithm.adv_estimator), int(cfg.actor_rollout_ref.rollout.n)
    if estimator in GROUP_ESTIMATORS - REFUSED_AT_ONE and n < 2:
        warnings.append(
            f"actor_rollout_ref.rollout.n = {n}: algorithm.adv_estimator={estimator} compares the "
            f"responses within a prompt's group; verl allows this: with one response "
            f"{GROUP_AT_ONE[estimator]}; set ROLLOUT_N >= 2 unless that is meant"
        )
    # verl's validate_config only prints a notice (utils/config.py ~184); then both apply: the
    # penalty on the reward (trainer/ppo/v1/trainer_base.py ~1754, the legacy
    # ray_trainer.py ~1639) and the loss term (workers/utils/losses.py ~132-140).
    if bool(cfg.algorithm.use_kl_in_reward) and bool(actor.use_kl_loss):
        warnings.append(
            "algorithm.use_kl_in_reward=true and actor_rollout_ref.actor.use_kl_loss=true: verl "
            "allows this (it prints a NOTICE) and charges the KL to the reference twice, as a "
            "penalty in the reward (algorithm.kl_ctrl.kl_coef) and as a loss term "
            "(actor_rollout_ref.actor.kl_loss_coef); set one false unless both are meant"
        )
    loss_mode = str(_get(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"))
    if loss_mode == "gspo":
        wide = {k: float(actor[k]) for k in ("clip_ratio_low", "clip_ratio_high")}
        wide = {k: v for k, v in wide.items() if v >= GSPO_WIDE_CLIP}
        if wide:
            shown = ", ".join(f"actor_rollout_ref.actor.{k}={v:g}" for k, v in wide.items())
            warnings.append(
                f"policy_loss.loss_mode=gspo with {shown}: verl allows this and clips the "
                "sequence-level ratio (a geometric mean of token ratios, usually closer to 1 "
                "than one token's) to that range as given: it clips fewer sequences than the "
                "paper's 3e-4 below and 4e-4 above would (watch actor/pg_clipfrac)"
            )
    warnings += _overlong_warnings(cfg)
    return warnings


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


def _overlong_buffer(cfg: Any) -> Any:
    """reward.reward_kwargs.overlong_buffer_cfg where it is enabled, else None."""
    buffer = _get(cfg, "reward.reward_kwargs.overlong_buffer_cfg")
    return buffer if buffer and bool(buffer.get("enable", False)) else None


def overlong_problems(cfg: Any) -> list[str]:
    """DAPO's overlong penalty: what verl's dapo reward manager asserts, only inside its reward
    workers (experimental/reward_loop/reward_manager/dapo.py ~39-50), and the manager it needs."""
    buffer = _overlong_buffer(cfg)
    if buffer is None:
        return []
    key = "reward.reward_kwargs"
    if str(_get(cfg, "reward.reward_manager.name", "naive")) != "dapo":
        return [
            f"{key}.overlong_buffer_cfg.enable=true is read only by the dapo reward manager; set "
            f"reward.reward_manager.name=dapo (now {cfg.reward.reward_manager.name})"
        ]
    # The manager reads reward_kwargs.max_resp_len (dapo.py ~35), not data.max_response_length,
    # and asserts in this order: max_resp_len set, max_resp_len >= len, len > 0.
    limit = _get(cfg, f"{key}.max_resp_len")
    if limit is None:
        return [f"{key}.max_resp_len is not set: verl's dapo reward manager asserts it"]
    length = int(buffer.get("len", 0) or 0)
    if not 0 < length <= int(limit):
        return [
            f"{key}.overlong_buffer_cfg.len={length} must be above 0 and at most "
            f"{key}.max_resp_len={limit}: verl's dapo reward manager asserts both (the penalty "
            "ramps over the last len tokens before max_resp_len)"
        ]
    return []


def _overlong_warnings(cfg: Any) -> list[str]:
    """A max_resp_len other than the generation limit: the dapo manager computes the penalty from
    max_resp_len alone (dapo.py ~108-114), whatever data.max_response_length cuts."""
    buffer = _overlong_buffer(cfg)
    if buffer is None or str(_get(cfg, "reward.reward_manager.name", "naive")) != "dapo":
        return []
    limit = _get(cfg, "reward.reward_kwargs.max_resp_len")
    generated = int(cfg.data.max_response_length)
    if limit is None or int(limit) == generated:
        return []
    length = int(buffer.get("len", 0) or 0)
    what = (
        "the penalty keeps growing past -penalty_factor (it has no floor) for a response longer "
        "than max_resp_len"
        if int(limit) < generated
        else "the longest response, cut at data.max_response_length, gets less than the full "
        "penalty, or none when the cut comes before the ramp"
    )
    return [
        f"reward.reward_kwargs.max_resp_len={limit} with data.max_response_length={generated}: "
        f"verl allows this and ramps the overlong penalty from token {int(limit) - length} to "
        f"token {limit} (max_resp_len), not to the generation limit: {what}"
    ]


KL_COEF_KEYS = ("algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.kl_loss_coef")


def unused_kl_warnings(cfg: Any, chosen: Mapping[str, str]) -> list[str]:
    """A KL coefficient the user chose (``chosen``: verl key -> the knob or key=value that set
    it) where the config charges no KL at all: verl reads neither coefficient then."""
    if bool(cfg.algorithm.use_kl_in_reward) or bool(cfg.actor_rollout_ref.actor.use_kl_loss):
        return []
    given = sorted({chosen[key] for key in KL_COEF_KEYS if key in chosen})
    if not given:
        return []
    return [
        f"{', '.join(given)} does nothing here: this config charges no KL "
        "(algorithm.use_kl_in_reward=false, actor_rollout_ref.actor.use_kl_loss=false), so verl "
        "reads neither algorithm.kl_ctrl.kl_coef nor actor_rollout_ref.actor.kl_loss_coef"
    ]


def check_algorithm(
    cfg: Any,
    report: Report,
    reward_keys: set[str] | None = None,
    chosen: Mapping[str, str] | None = None,
) -> None:
    problems = algorithm_problems(cfg, reward_keys) + overlong_problems(cfg)
    for problem in problems:
        report.error("algorithm", problem)
    if problems:
        return
    for warning in algorithm_warnings(cfg) + unused_kl_warnings(cfg, chosen or {}):
        report.warn("algorithm", warning)
    actor = cfg.actor_rollout_ref.actor
    kl = {
        (True, True): "KL in the reward and in the loss",
        (True, False): "KL in the reward",
        (False, True): "KL in the loss",
        (False, False): "no KL",
    }[(bool(cfg.algorithm.use_kl_in_reward), bool(actor.use_kl_loss))]
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

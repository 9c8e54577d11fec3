"""What each RL algorithm needs from a verl config (docs/algorithms.md): an error where verl fails
or trains something else; a warning where it runs as written."""

from collections.abc import Mapping
from typing import Any

from verl_gsm8k.preflight.lines import Report

RAW = "the raw score is the advantage (REINFORCE without a baseline)"
TOKEN = "the advantage is each token's return (the raw score for an outcome reward), no baseline"
# What each group estimator computes with one response per prompt, as verl's core_algos.py runs it.
GROUP_AT_ONE = {
    "grpo": f"verl gives it mean 0 and std 1: {RAW}",
    "grpo_vectorized": f"verl gives it mean 0 and std 1: {RAW}",
    "gdpo": "verl gives it mean 0 and std 1 and whitens over the batch: no group baseline",
    "grpo_passk": "verl raises ValueError('Pass@k requires at least 2 samples per group')",
    "reinforce_plus_plus_baseline": "verl gives it mean 0 and whitens over the batch: plain "
    "REINFORCE++, no group baseline",
    "rloo": f"verl leaves its score as it is (leave-one-out needs two): {RAW}",
    "rloo_vectorized": "verl multiplies it by (group size > 1): the advantage is 0 for every "
    "response, the policy gradient is zero",
    "opo": f"verl gives it baseline 0: {RAW}",
    "gpg": "verl gives it mean 0: the advantage is the raw score times the batch size over the "
    "count of non-zero scores, no baseline",
    "optimal_token_baseline": f"verl gives it baseline 0: {TOKEN}",
    "tir_optimal_token_baseline": f"verl gives it baseline 0: {TOKEN}",
}
REFUSED_AT_ONE = {"grpo_passk", "rloo_vectorized"}  # verl fails, or nothing is learned
STD_READERS = ("grpo", "grpo_passk")  # the estimators that read norm_adv_by_std_in_grpo
# GSPO's paper clips the sequence ratio to [1-3e-4, 1+4e-4]; verl clips to the range as given.
GSPO_WIDE_CLIP = 0.01
KL_COEF_KEYS = ("algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.kl_loss_coef")
FILTER, A = "algorithm.filter_groups", "actor_rollout_ref.actor"
RK = "reward.reward_kwargs"


def _get(cfg: Any, dotted: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, dotted, default=default)


def _kept(pairs: tuple[tuple[Any, str], ...]) -> list[str]:
    return [message for bad, message in pairs if bad]


def algorithm_problems(cfg: Any, reward_keys: set[str] | None = None) -> list[str]:
    """Combinations verl refuses or that train something else."""
    actor, est = cfg.actor_rollout_ref.actor, str(cfg.algorithm.adv_estimator)
    n, critic = int(cfg.actor_rollout_ref.rollout.n), _get(cfg, "critic.enable")
    return _kept((
        (est in REFUSED_AT_ONE and n < 2,
         f"actor_rollout_ref.rollout.n = {n}: algorithm.adv_estimator={est} compares the "
         f"responses within a prompt's group; with one response {GROUP_AT_ONE.get(est)}; set "
         "ROLLOUT_N >= 2"),
        (critic is True and est != "gae",
         f"critic.enable=true with algorithm.adv_estimator={est}: only gae reads the critic's "
         "values; remove critic.enable"),
        (critic is False and est == "gae",
         "critic.enable=false with algorithm.adv_estimator=gae: GAE needs the critic's values; "
         "pick a critic-free estimator or remove critic.enable"),
        (not cfg.algorithm.get("norm_adv_by_std_in_grpo", True) and est not in STD_READERS,
         f"algorithm.norm_adv_by_std_in_grpo=false is ignored by adv_estimator={est} (read only "
         f"by {', '.join(STD_READERS)})"),
        (actor.loss_agg_mode == "seq-mean-token-sum-norm" and actor.loss_scale_factor is None,
         "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm with loss_scale_factor "
         "null divides by each micro-batch's padded length; set "
         "actor_rollout_ref.actor.loss_scale_factor (Dr. GRPO: max_response_length)"),
        (est == "remax" and _get(cfg, "trainer.use_v1", True),
         "algorithm.adv_estimator=remax with trainer.use_v1=true: only the legacy trainer "
         "generates ReMax's greedy baseline; set trainer.use_v1=false"),
    )) + _filter_problems(cfg, n, reward_keys)  # fmt: skip


def _filter_problems(cfg: Any, n: int, reward_keys: set[str] | None) -> list[str]:
    """DAPO's dynamic sampling (algorithm.filter_groups), read by the v1 trainer only."""
    groups = _get(cfg, FILTER)
    if not groups or not groups.get("enable", False):
        return []
    if not _get(cfg, "trainer.use_v1", True):
        return [f"{FILTER}.enable=true with trainer.use_v1=false: the legacy trainer never reads "
                f"{FILTER}: no group is dropped"]  # fmt: skip
    metric, keys = str(groups.get("metric") or ""), sorted(reward_keys or ())
    reward = metric == "reward" and _overlong(cfg) is not None
    return _kept((
        (int(groups.get("max_num_gen_batches", 0) or 0) > 0,
         f"{FILTER}.max_num_gen_batches={groups.max_num_gen_batches} is ignored by the v1 "
         "trainer: nothing caps a step's generation; set it to 0"),
        (n < 2, f"{FILTER}.enable=true with actor_rollout_ref.rollout.n = {n}: a group of one "
         "response is never dropped; set ROLLOUT_N >= 2"),
        (reward, f"{FILTER}.metric=reward filters on the score the overlong penalty shapes; "
         f"filter on accuracy: {FILTER}.metric=acc"),
        (metric != "reward" and reward_keys is not None and metric not in keys,
         f"{FILTER}.metric={metric or 'null'} is not a key of the reward's result "
         f"({', '.join(keys)}): verl stops at the first filtered step"),
    ))  # fmt: skip


def _overlong(cfg: Any, manager: bool = True) -> Any:
    """DAPO's enabled overlong buffer (with verl's dapo reward manager unless not ``manager``)."""
    buffer = _get(cfg, f"{RK}.overlong_buffer_cfg")
    dapo = _get(cfg, "reward.reward_manager.name") == "dapo" or not manager
    return buffer if buffer and buffer.get("enable", False) and dapo else None


def overlong_problems(cfg: Any) -> list[str]:
    """What verl's dapo reward manager asserts, in its reward workers only."""
    buffer = _overlong(cfg, manager=False)
    if buffer is None:
        return []
    if _overlong(cfg) is None:
        return [f"{RK}.overlong_buffer_cfg.enable=true is read only by the dapo reward manager; "
                "set reward.reward_manager.name=dapo"]  # fmt: skip
    limit, length = _get(cfg, f"{RK}.max_resp_len"), int(buffer.get("len", 0) or 0)
    if limit is None:
        return [f"{RK}.max_resp_len is not set: verl's dapo reward manager asserts it"]
    return [] if 0 < length <= int(limit) else [
        f"{RK}.overlong_buffer_cfg.len={length} must be above 0 and at most {RK}.max_resp_len="
        f"{limit}: verl's dapo reward manager asserts both"]  # fmt: skip


def algorithm_warnings(cfg: Any) -> list[str]:
    """Combinations verl runs as written that are seldom meant."""
    actor, est = cfg.actor_rollout_ref.actor, str(cfg.algorithm.adv_estimator)
    n, gspo = int(cfg.actor_rollout_ref.rollout.n), _get(cfg, f"{A}.policy_loss.loss_mode")
    wide = [f"{A}.{k}={actor[k]:g}" for k in ("clip_ratio_low", "clip_ratio_high")
            if gspo == "gspo" and actor[k] >= GSPO_WIDE_CLIP]  # fmt: skip
    buffer, limit = _overlong(cfg), _get(cfg, f"{RK}.max_resp_len")
    generated, ramp = int(cfg.data.max_response_length), buffer is not None and limit is not None
    ramp = ramp and int(limit) != generated
    start = int(limit) - int(buffer.get("len", 0) or 0) if ramp else 0
    return _kept((
        (est in GROUP_AT_ONE and est not in REFUSED_AT_ONE and n < 2,
         f"actor_rollout_ref.rollout.n = {n}: algorithm.adv_estimator={est} compares the "
         "responses within a prompt's group; verl allows this: with one response "
         f"{GROUP_AT_ONE.get(est)}; set ROLLOUT_N >= 2 unless that is meant"),
        (cfg.algorithm.use_kl_in_reward and actor.use_kl_loss,
         "algorithm.use_kl_in_reward=true and actor_rollout_ref.actor.use_kl_loss=true: verl "
         "allows this and charges the KL to the reference twice, in the reward and in the loss; "
         "set one false unless both are meant"),
        (wide, f"policy_loss.loss_mode=gspo with {', '.join(wide)}: verl allows this and clips "
         "the sequence-level ratio to that range as given, far wider than the paper's 3e-4 and "
         "4e-4 (watch actor/pg_clipfrac)"),
        (ramp, f"{RK}.max_resp_len={limit} with data.max_response_length={generated}: verl allows"
         f" this and ramps the overlong penalty from token {start} to token {limit}: "
         + ("the penalty keeps growing past -penalty_factor past max_resp_len"
            if ramp and int(limit) < generated
            else "a response cut at the generation limit gets less than the full penalty")),
    ))  # fmt: skip


def unused_kl_warnings(cfg: Any, chosen: Mapping[str, str]) -> list[str]:
    """A KL coefficient the user chose where the config charges no KL."""
    given = sorted({chosen[key] for key in KL_COEF_KEYS if key in chosen})
    if not given or cfg.algorithm.use_kl_in_reward or cfg.actor_rollout_ref.actor.use_kl_loss:
        return []
    return [f"{', '.join(given)} does nothing here: this config charges no KL (use_kl_in_reward "
            "and use_kl_loss false), so verl reads neither coefficient"]  # fmt: skip


def check_algorithm(cfg: Any, report: Report, reward_keys: set[str] | None = None,
                    chosen: Mapping[str, str] | None = None) -> None:  # fmt: skip
    problems = algorithm_problems(cfg, reward_keys) + overlong_problems(cfg)
    if not report.verdict("algorithm", problems):
        return
    for warning in algorithm_warnings(cfg) + unused_kl_warnings(cfg, chosen or {}):
        report.warn("algorithm", warning)
    actor = cfg.actor_rollout_ref.actor
    kl = [w for w, on in (("the reward", cfg.algorithm.use_kl_in_reward),
                          ("the loss", actor.use_kl_loss)) if on]  # fmt: skip
    loss = _get(cfg, f"{A}.policy_loss.loss_mode", "vanilla")
    groups = _get(cfg, FILTER)
    extra = f", dynamic sampling on {groups.metric}" if groups and groups.get("enable") else ""
    report.ok("algorithm", f"{cfg.algorithm.adv_estimator} advantages, {loss} loss "
              f"({actor.loss_agg_mode}), {'KL in ' + ' and in '.join(kl) if kl else 'no KL'}, "
              f"rollout.n={cfg.actor_rollout_ref.rollout.n}{extra}")  # fmt: skip

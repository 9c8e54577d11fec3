"""One vocabulary for verl metrics: a canonical name per quantity, with the verl 0.9.1 key first
and the older keys after, plus the key patterns of validation and step-time phases.

Standard library only. ``parse`` maps a run's raw keys onto these names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# --------------------------------------------------------------------------------------------
# Vocabulary: one canonical name per quantity, with the verl 0.9.1 key first and older keys after.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricSpec:
    """A canonical metric: where it comes from and how to describe it."""

    name: str
    label: str
    keys: tuple[tuple[str, float], ...]  # (source key, scale factor); first key present wins
    unit: str = ""


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("score", "train score (mean)", (("critic/score/mean", 1.0),)),
    MetricSpec("reward", "train reward incl. KL penalty (mean)", (("critic/rewards/mean", 1.0),)),
    # The best and worst response of a step: together, the range the mean score can move in.
    MetricSpec("score_max", "train score (best response)", (("critic/score/max", 1.0),)),
    MetricSpec("score_min", "train score (worst response)", (("critic/score/min", 1.0),)),
    MetricSpec("reward_max", "train reward (best response)", (("critic/rewards/max", 1.0),)),
    MetricSpec("reward_min", "train reward (worst response)", (("critic/rewards/min", 1.0),)),
    MetricSpec(
        "kl", "KL to reference (in reward)", (("actor/reward_kl_penalty", 1.0), ("critic/kl", 1.0))
    ),
    MetricSpec(
        "kl_coef",
        "KL coefficient (in reward)",
        (("actor/reward_kl_penalty_coeff", 1.0), ("critic/kl_coeff", 1.0)),
    ),
    MetricSpec("kl_loss", "KL loss (actor, GRPO-style)", (("actor/kl_loss", 1.0),)),
    MetricSpec("ppo_kl", "KL old->new policy in the update", (("actor/ppo_kl", 1.0),)),
    MetricSpec("entropy", "policy entropy", (("actor/entropy", 1.0), ("actor/entropy_loss", 1.0))),
    MetricSpec("pg_loss", "policy-gradient loss", (("actor/pg_loss", 1.0),)),
    MetricSpec("pg_clipfrac", "PPO clip fraction (actor)", (("actor/pg_clipfrac", 1.0),)),
    MetricSpec("vf_loss", "value loss", (("critic/vf_loss", 1.0),)),
    MetricSpec("vf_clipfrac", "value clip fraction", (("critic/vf_clipfrac", 1.0),)),
    MetricSpec("vf_explained_var", "value explained variance", (("critic/vf_explained_var", 1.0),)),
    MetricSpec("actor_grad_norm", "actor grad norm", (("actor/grad_norm", 1.0),)),
    MetricSpec("critic_grad_norm", "critic grad norm", (("critic/grad_norm", 1.0),)),
    MetricSpec("actor_lr", "actor learning rate", (("actor/lr", 1.0), ("actor/lr(1e-4)", 1e-4))),
    MetricSpec(
        "critic_lr", "critic learning rate", (("critic/lr", 1.0), ("critic/lr(1e-4)", 1e-4))
    ),
    MetricSpec(
        "response_length_mean", "response length (mean)", (("response_length/mean", 1.0),), "tok"
    ),
    MetricSpec(
        "response_length_max", "response length (max)", (("response_length/max", 1.0),), "tok"
    ),
    # NOT the share cut at data.max_response_length: the share as long as the step's padded
    # length, which verl 0.9.1's v1 trainer sets to the longest response (parse.CUT_SHARE).
    MetricSpec(
        "response_length_clip_ratio",
        "share of responses as long as the step's longest (verl's clip_ratio, batch-relative)",
        (("response_length/clip_ratio", 1.0),),
    ),
    MetricSpec("prompt_length_mean", "prompt length (mean)", (("prompt_length/mean", 1.0),), "tok"),
    MetricSpec(
        "step_time", "step time", (("timing_s/step", 1.0), ("perf/time_per_step", 1.0)), "s"
    ),
    MetricSpec("throughput", "throughput per GPU", (("perf/throughput", 1.0),), "tok/s"),
    MetricSpec("total_tokens", "tokens per step", (("perf/total_num_tokens", 1.0),), "tok"),
    MetricSpec("values_mean", "critic value estimate (mean)", (("critic/values/mean", 1.0),)),
    # Engine metrics carry their role in verl 0.9.1 (actor/perf/..., critic/perf/...: the
    # trainer prefixes every key of an update's metrics with the role). Older verl logged one
    # unprefixed perf/max_memory_allocated_gb for whichever role wrote last.
    MetricSpec(
        "actor_max_memory_gb",
        "actor peak GPU memory allocated",
        (("actor/perf/max_memory_allocated_gb", 1.0),),
        "GiB",
    ),
    MetricSpec(
        "actor_max_memory_reserved_gb",
        "actor peak GPU memory reserved",
        (("actor/perf/max_memory_reserved_gb", 1.0),),
        "GiB",
    ),
    MetricSpec(
        "critic_max_memory_gb",
        "critic peak GPU memory allocated",
        (("critic/perf/max_memory_allocated_gb", 1.0),),
        "GiB",
    ),
    MetricSpec(
        "critic_max_memory_reserved_gb",
        "critic peak GPU memory reserved",
        (("critic/perf/max_memory_reserved_gb", 1.0),),
        "GiB",
    ),
    MetricSpec(
        "max_memory_gb",
        "peak GPU memory allocated (older verl, role not named)",
        (("perf/max_memory_allocated_gb", 1.0),),
        "GiB",
    ),
    MetricSpec(
        "max_memory_reserved_gb",
        "peak GPU memory reserved (older verl, role not named)",
        (("perf/max_memory_reserved_gb", 1.0),),
        "GiB",
    ),
    MetricSpec(
        "cpu_memory_used_gb",
        "host memory in use",
        (
            ("actor/perf/cpu_memory_used_gb", 1.0),
            ("critic/perf/cpu_memory_used_gb", 1.0),
            ("perf/cpu_memory_used_gb", 1.0),
        ),
        "GiB",
    ),
    # Rollout/training mismatch (verl/utils/debug/metrics.py, logged when
    # actor_rollout_ref.rollout.calculate_log_probs=True, the 0.9.1 default): token
    # probabilities of the inference engine (vLLM) against the training engine's recomputation.
    MetricSpec(
        "rollout_probs_diff_max",
        "largest |p_rollout - p_training| of a token",
        (("training/rollout_probs_diff_max", 1.0),),
    ),
    MetricSpec(
        "rollout_probs_diff_mean",
        "mean |p_rollout - p_training| per token",
        (("training/rollout_probs_diff_mean", 1.0),),
    ),
    MetricSpec(
        "rollout_probs_diff_std",
        "std of |p_rollout - p_training| per token",
        (("training/rollout_probs_diff_std", 1.0),),
    ),
    MetricSpec(
        "rollout_probs_corr",
        "Pearson correlation of rollout and training token probabilities",
        (("training/rollout_actor_probs_pearson_corr", 1.0),),
    ),
    MetricSpec(
        "rollout_kl",
        "KL rollout -> training policy (rollout correction)",
        (("rollout_corr/kl", 1.0),),
    ),
)

# Peak memory per role in the summary: role -> (allocated, reserved) canonical names.
MEMORY_ROLES: dict[str, tuple[str, str]] = {
    "actor": ("actor_max_memory_gb", "actor_max_memory_reserved_gb"),
    "critic": ("critic_max_memory_gb", "critic_max_memory_reserved_gb"),
    "role not named (older verl)": ("max_memory_gb", "max_memory_reserved_gb"),
}
METRICS_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


# Derived in parse.canonicalize, not read from one key.
CUT_SHARE = "response_cut_share"
DERIVED_LABELS = {CUT_SHARE: "share of responses cut at data.max_response_length"}


def metric_label(name: str) -> str:
    """Human-readable meaning of a canonical metric name."""
    if name == "val_acc":
        return "validation accuracy"
    if name in DERIVED_LABELS:
        return DERIVED_LABELS[name]
    if name.startswith(VAL_AUX_PREFIX):
        return f"validation mean of the reward's {name[len(VAL_AUX_PREFIX) :]!r} (val-aux)"
    spec = METRICS_BY_NAME.get(name)
    if spec is None:
        return name
    return f"{spec.label} [{spec.unit}]" if spec.unit else spec.label


# Validation accuracy. verl 0.9.1: val-core/<data source>/acc/mean@N (or reward/mean@N when the
# scorer returns no "acc"); older verl: val/test_score/<data source>.
VAL_CORE_KEY = re.compile(r"^val-core/(?P<src>.+)/(?P<var>acc|reward)/mean@(?P<n>\d+)$")
VAL_OLD_KEY = re.compile(r"^val/test_score/(?P<src>.+)$")
# The other keys a reward's dict returns (ours: score, acc, format, pred_found, clipped):
# val-aux/<data source>/<key>/mean@N, read for the data source and N of the accuracy key as
# canonical "val_<key>".
VAL_AUX_KEY = re.compile(r"^val-aux/(?P<src>.+)/(?P<var>[^/]+)/mean@(?P<n>\d+)$")
VAL_AUX_PREFIX = "val_"

# Step-time phases: timing_s/<phase> (0.9.1) or timing/<phase> (older). Nested keys such as
# timing_s/agent_loop/... are parts of "gen" and are not phases of their own.
PHASE_KEY = re.compile(r"^(?:timing_s|timing)/(?P<phase>[^/]+)$")
# Phases timed outside verl's "step" timer: validation, the profiler hooks, and the per-token
# trace (verl_gsm8k/trace/, timed in _compute_metrics, after the step).
OUTSIDE_STEP_PHASES: frozenset[str] = frozenset(
    {"testing", "start_profile", "stop_profile", "gsm8k_trace"}
)
# Display order of the usual phases; any other phase follows in name order.
PHASE_ORDER: tuple[str, ...] = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "save_checkpoint",
    "other",
    "testing",
)

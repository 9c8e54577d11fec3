"""verl's metric names, once: a canonical name per quantity (verl 0.9.1's key first, older keys
after) and the key patterns of validation and step-time phases."""

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricSpec:
    name: str
    label: str
    keys: tuple[tuple[str, float], ...]  # (source key, scale factor); first key present wins
    unit: str = ""


def _m(name: str, label: str, *keys: str, unit: str = "") -> MetricSpec:
    """A ``(1e-4)`` key is scaled back to its value."""
    scaled = tuple((key, 1e-4 if key.endswith("(1e-4)") else 1.0) for key in keys)
    return MetricSpec(name, label, scaled, unit)


_CPU = "perf/cpu_memory_used_gb"
# fmt: off
METRICS: tuple[MetricSpec, ...] = (
    _m("score", "train score (mean)", "critic/score/mean"),
    _m("reward", "train reward incl. KL penalty (mean)", "critic/rewards/mean"),
    _m("score_max", "train score (best response)", "critic/score/max"),
    _m("score_min", "train score (worst response)", "critic/score/min"),
    _m("reward_max", "train reward (best response)", "critic/rewards/max"),
    _m("reward_min", "train reward (worst response)", "critic/rewards/min"),
    _m("kl", "KL to reference (in reward)", "actor/reward_kl_penalty", "critic/kl"),
    _m("kl_coef", "KL coefficient (in reward)", "actor/reward_kl_penalty_coeff", "critic/kl_coeff"),
    _m("kl_loss", "KL loss (actor, GRPO-style)", "actor/kl_loss"),
    _m("ppo_kl", "KL old->new policy in the update", "actor/ppo_kl"),
    _m("entropy", "policy entropy", "actor/entropy", "actor/entropy_loss"),
    _m("pg_loss", "policy-gradient loss", "actor/pg_loss"),
    _m("pg_clipfrac", "PPO clip fraction (actor)", "actor/pg_clipfrac"),
    _m("vf_loss", "value loss", "critic/vf_loss"),
    _m("vf_clipfrac", "value clip fraction", "critic/vf_clipfrac"),
    _m("vf_explained_var", "value explained variance", "critic/vf_explained_var"),
    _m("actor_grad_norm", "actor grad norm", "actor/grad_norm"),
    _m("critic_grad_norm", "critic grad norm", "critic/grad_norm"),
    _m("actor_lr", "actor learning rate", "actor/lr", "actor/lr(1e-4)"),
    _m("critic_lr", "critic learning rate", "critic/lr", "critic/lr(1e-4)"),
    _m("response_length_mean", "response length (mean)", "response_length/mean", unit="tok"),
    _m("response_length_max", "response length (max)", "response_length/max", unit="tok"),
    _m("response_length_min", "response length (min)", "response_length/min", unit="tok"),
    _m("response_length_clip_ratio",
       "share of responses as long as the step's longest (verl's clip_ratio, batch-relative)",
       "response_length/clip_ratio"),
    _m("prompt_length_mean", "prompt length (mean)", "prompt_length/mean", unit="tok"),
    _m("step_time", "step time", "timing_s/step", "perf/time_per_step", unit="s"),
    _m("throughput", "throughput per GPU", "perf/throughput", unit="tok/s"),
    _m("total_tokens", "tokens per step", "perf/total_num_tokens", unit="tok"),
    _m("values_mean", "critic value estimate (mean)", "critic/values/mean"),
    # peak memory: verl 0.9.1 prefixes an engine's metrics with its role, older verl did not
    *(_m(f"{role}max_memory{'_reserved' * (kind == 'reserved')}_gb",
         f"{who or 'peak'} GPU memory {kind}" + ("" if who else " (older verl, role not named)"),
         f"{key}perf/max_memory_{kind}_gb", unit="GiB")
      for role, key, who in (("actor_", "actor/", "actor peak"),
                             ("critic_", "critic/", "critic peak"), ("", "", ""))
      for kind in ("allocated", "reserved")),
    _m("cpu_memory_used_gb", "host memory in use", f"actor/{_CPU}", f"critic/{_CPU}", _CPU,
       unit="GiB"),
    # vLLM's token probabilities against the trainer's recomputation
    _m("rollout_probs_diff_max", "largest |p_rollout - p_training| of a token",
       "training/rollout_probs_diff_max"),
    _m("rollout_probs_diff_mean", "mean |p_rollout - p_training| per token",
       "training/rollout_probs_diff_mean"),
    _m("rollout_probs_diff_std", "std of |p_rollout - p_training| per token",
       "training/rollout_probs_diff_std"),
    _m("rollout_probs_corr", "Pearson correlation of rollout and training token probabilities",
       "training/rollout_actor_probs_pearson_corr"),
    _m("rollout_kl", "KL rollout -> training policy (rollout correction)", "rollout_corr/kl"),
    # a tool launch's: verl's turns, and ppo_trainer/tool_stats.py's
    _m("num_turns", "turns per response (mean)", "num_turns/mean", "training/num_turns/mean"),
    _m("tool_called", "share of responses that called a tool", "tools/called"),
    _m("tool_calls", "tool calls per response (mean)", "tools/calls"),
    _m("tool_errors", "share of responses with a tool error", "tools/errors"),
    _m("tool_acc_called", "accuracy of the responses that called a tool", "tools/acc_called"),
    _m("tool_acc_not_called", "accuracy of the responses that did not", "tools/acc_not_called"),
)
# fmt: on
METRICS_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}
NAME_OF_KEY: dict[str, str] = {key: m.name for m in METRICS for key, _ in m.keys}


def keys_of(name: str) -> tuple[str, ...]:
    return tuple(key for key, _ in METRICS_BY_NAME[name].keys)


# role -> (allocated, reserved) canonical names
MEMORY_ROLES = {role: (f"{p}max_memory_gb", f"{p}max_memory_reserved_gb")
                for role, p in (("actor", "actor_"), ("critic", "critic_"),
                                ("role not named (older verl)", ""))}  # fmt: skip
CUT_SHARE = "response_cut_share"
DERIVED_LABELS = {CUT_SHARE: "share of responses cut at data.max_response_length",
                  "val_acc": "validation accuracy"}  # fmt: skip

# Validation accuracy: val-core/<source>/acc/mean@N (reward/mean@N without "acc"), older verl
# val/test_score/<source>; val-aux/<source>/<key>/mean@N is read as "val_<key>".
VAL_CORE_KEY = re.compile(r"^val-core/(?P<src>.+)/(?P<var>acc|reward)/mean@(?P<n>\d+)$")
VAL_OLD_KEY = re.compile(r"^val/test_score/(?P<src>.+)$")
VAL_AUX_KEY = re.compile(r"^val-aux/(?P<src>.+)/(?P<var>[^/]+)/mean@(?P<n>\d+)$")
VAL_AUX_PREFIX = "val_"


def metric_label(name: str) -> str:
    spec, aux = METRICS_BY_NAME.get(name), name.removeprefix(VAL_AUX_PREFIX)
    if name in DERIVED_LABELS or spec is None:
        val_aux = f"validation mean of the reward's {aux!r} (val-aux)"
        return DERIVED_LABELS.get(name) or (name if aux == name else val_aux)
    return f"{spec.label} [{spec.unit}]" if spec.unit else spec.label


# Step-time phases: timing_s/<phase> or (older) timing/<phase>; nested keys are parts of "gen".
# Some phases are timed outside verl's "step" timer.
PHASE_KEY = re.compile(r"^(?:timing_s|timing)/(?P<phase>[^/]+)$")
OUTSIDE_STEP_PHASES = frozenset({"testing", "start_profile", "stop_profile", "gsm8k_trace"})
PHASE_ORDER: tuple[str, ...] = ("gen", "reward", "old_log_prob", "ref", "values", "adv",
                                "update_critic", "update_actor", "update_weights",
                                "save_checkpoint", "other", "testing")  # fmt: skip


def phase_order(name: str) -> tuple[int, str]:
    return (PHASE_ORDER.index(name) if name in PHASE_ORDER else 99, name)

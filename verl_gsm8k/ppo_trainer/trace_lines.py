"""The per-token trace's lines, RUN_DIR/trace/<step>.jsonl (format: trace/record.py), from a step's
chosen samples, never fatal. Settings: gsm8k_trace.samples (0 = off), gsm8k_trace.dir."""

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from omegaconf import DictConfig
from verl.trainer.ppo.core_algos import kl_penalty

from verl_gsm8k.common.run_dir import TRACE_DIR
from verl_gsm8k.guard.rules import prompt_of
from verl_gsm8k.trace.record import TraceWriter, clean, sample_line, step_line
from verl_gsm8k.trace.select import session_of

TIMING_KEY = "timing_s/gsm8k_trace"  # logged every step with the step's other timings
logger = logging.getLogger(__name__)

# verl's per-token fields (v1's TransferQueue, the legacy batch) -> the trace's names
PER_TOKEN = {
    "rollout_log_probs": "rollout_log_prob", "old_log_probs": "old_log_prob",
    "entropy": "entropy", "ref_log_prob": "ref_log_prob", "values": "value",
    "rm_scores": "score", "token_level_scores": "score", "token_level_rewards": "reward",
    "advantages": "advantage", "returns": "return",
}  # fmt: skip
ABSENT_WHY = {
    "value": "no critic (algorithm.adv_estimator={estimator})",
    "rollout_log_prob": "vLLM's log-probs not kept (rollout.calculate_log_probs=false)",
    "ref_log_prob": "no reference model in this run",
    "entropy": "no entropy in this step",
}


def run_settings(config: DictConfig) -> dict[str, Any]:
    algo, actor = config.algorithm, config.actor_rollout_ref.actor
    rollout = config.actor_rollout_ref.rollout
    kl: dict[str, Any] = {"in": None}
    if algo.get("use_kl_in_reward", False):
        kl = {"in": "reward", "estimator": algo.kl_penalty, "coef": algo.kl_ctrl.kl_coef,
              "controller": algo.kl_ctrl.type}  # fmt: skip
    elif actor.get("use_kl_loss", False):
        kl = {"in": "loss", "estimator": actor.kl_loss_type, "coef": actor.kl_loss_coef}
    return {
        "project": config.trainer.project_name, "experiment": config.trainer.experiment_name,
        "run_dir": str(config.trainer.default_local_dir), "adv_estimator": str(algo.adv_estimator),
        "gamma": algo.gamma, "lam": algo.lam,
        "norm_adv_by_std_in_grpo": algo.get("norm_adv_by_std_in_grpo", True), "kl": kl,
        "rollout_n": rollout.n, "temperature": rollout.temperature,
        "max_response_length": config.data.max_response_length,
        "clip_ratio_low": actor.clip_ratio_low, "clip_ratio_high": actor.clip_ratio_high,
        "model": str(config.actor_rollout_ref.model.path),
        # the launch's metrics file (verl_gsm8k/launch/): ties the trace to its launch
        "metrics_file": os.path.basename(os.environ.get("VERL_FILE_LOGGER_PATH", "")) or None,
    }  # fmt: skip


class Tracer:
    """One launch's trace: its settings and writer."""

    def __init__(self, config: DictConfig, decode: Callable[[int], str]) -> None:
        block = config.get("gsm8k_trace") or {}
        self.samples = int(block.get("samples", 0) or 0)
        directory = block.get("dir") or os.path.join(config.trainer.default_local_dir, TRACE_DIR)
        self.writer, self.run = TraceWriter(str(directory)), run_settings(config)
        self.decode = decode
        print(f"gsm8k_trace: {self.samples} samples per step -> {directory}", flush=True)

    def record(self, step: int, metrics: dict, build: Callable[[], list[dict] | None]) -> None:
        if self.samples <= 0:
            return
        start = time.perf_counter()
        try:
            lines = build()
            if lines:
                self.writer.submit(step, lines)
        except Exception as err:  # a diagnostic never stops training
            logger.warning("gsm8k_trace: step %s not traced: %r", step, err)
        metrics[TIMING_KEY] = time.perf_counter() - start

    def close(self) -> None:
        self.writer.close()

    def lines(
        self, step: int, metrics: dict, keys: Sequence[str], cols: dict[str, Any], of: int,
        stats: dict[str, Any],
    ) -> list[dict]:  # fmt: skip
        """The step line, then one per sample of ``keys``; ``cols``: per sample, prompts, responses,
        verl's per-token fields and where known response_mask, ground_truth, data_source,
        reward_extra."""
        per = {ours: cols[name] for name, ours in PER_TOKEN.items() if cols.get(name) is not None}
        why = {k: v.format(estimator=self.run["adv_estimator"]) for k, v in ABSENT_WHY.items()}
        absent = {name: reason for name, reason in why.items() if name not in per}
        old, ref, kl = cols.get("old_log_probs"), cols.get("ref_log_prob"), self.run["kl"]
        if kl["in"] is None:
            absent["kl"] = "no KL term in this run (no KL in the reward, no KL loss)"
        elif old is None or ref is None:
            absent["kl"] = "no reference log-probs in this step"
        else:
            pairs = zip(old, ref, strict=True)
            per["kl"] = [kl_penalty(o.float(), r.float(), kl["estimator"]) for o, r in pairs]
        head = step_line(step, self.run, metrics, traced=len(keys), of=of)
        head["batch"] = clean(stats)  # a NaN score (a step the watchdog stops) is JSON's null
        lines = [head]
        for i, key in enumerate(keys):
            value = {name: (column[i] if column is not None else None) for name, column in
                     cols.items() if name not in PER_TOKEN}  # fmt: skip
            per_token = {name: as_list(values[i]) for name, values in per.items()}
            per_token.setdefault("reward", per_token.get("score"))  # no KL in the reward
            response = as_list(value["responses"])
            lines.append(sample_line(
                step=step, key=key, uid=prompt_of(key), session=session_of(key),
                prompt_ids=as_list(value["prompts"]), response_ids=response,
                response_mask=as_list(value.get("response_mask")) or [1] * len(response),
                per_token={k: v for k, v in per_token.items() if v is not None}, absent=absent,
                decode=self.decode, ground_truth=value.get("ground_truth"),
                data_source=value.get("data_source"), reward_extra=value.get("reward_extra") or {},
            ))  # fmt: skip
        return lines


def batch_stats(scores: dict[str, Sequence[float]], raw_advantage: torch.Tensor | None) -> dict:
    """Each response's length, the step's prompt groups (``scores`` by key) and the GAE whitening's
    input (``raw_advantage``: returns - values over every response token, as
    compute_gae_advantage_return does)."""
    by_prompt: dict[str, list[float]] = {}
    for key, row in scores.items():
        by_prompt.setdefault(prompt_of(key), []).append(float(sum(row)))
    totals = [s for group in by_prompt.values() for s in group]
    lo, hi = min(totals), max(totals)
    same = [g for g in by_prompt.values() if max(g) == min(g)]
    stats: dict[str, Any] = {
        "response_lengths": {key: len(row) for key, row in scores.items()},
        "groups": {
            "count": len(by_prompt), "size": max(len(g) for g in by_prompt.values()),
            "zero_spread": len(same), "all_max": sum(1 for g in same if g[0] == hi),
            "all_min": sum(1 for g in same if g[0] == lo), "score_min": lo, "score_max": hi,
        },
    }  # fmt: skip
    if raw_advantage is not None:
        raw = raw_advantage.float()
        stats["advantage_whitening"] = {"mean": raw.mean().item(), "var": raw.var().item(),
                                        "tokens": raw.numel(), "eps": 1e-8}  # fmt: skip
    return stats


def rows(value: Any) -> list[Any]:
    """One field's per-sample values (a jagged tensor, a tensor, an array, objects)."""
    if isinstance(value, torch.Tensor) and value.is_nested:
        return list(value.unbind())
    return list(value)


def as_list(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value

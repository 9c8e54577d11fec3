"""The per-token trace's lines, whichever of verl's trainers holds the step's tensors: the v1
trainer in TransferQueue (``traced.py``), the legacy one in its ``DataProto`` batch
(``legacy.py``). Each reads its samples into plain per-sample dicts; this module turns them into
the ``RUN_DIR/trace/<step>.jsonl`` lines (``verl_gsm8k/trace/record.py``: their format) on a
background writer, timed and never fatal.

Settings: ``gsm8k_trace.samples`` (TRACE_SAMPLES; 0 = off) and ``gsm8k_trace.dir`` (default
``<trainer.default_local_dir>/trace``).
"""

from __future__ import annotations

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

# Why a per-token quantity is missing from a sample line (its name in record.py's PER_TOKEN)
ABSENT_WHY = {
    "value": "no critic (algorithm.adv_estimator={estimator})",
    "rollout_log_prob": "vLLM's log-probs not kept (rollout.calculate_log_probs=false)",
    "ref_log_prob": "no reference model in this run",
    "entropy": "no entropy in this step",
}


def trace_settings(config: DictConfig) -> tuple[int, str]:
    """(samples per step, directory) from ``gsm8k_trace.*``; (0, "") when the block is absent."""
    block = config.get("gsm8k_trace") or {}
    samples = int(block.get("samples", 0) or 0)
    directory = block.get("dir") or os.path.join(config.trainer.default_local_dir, TRACE_DIR)
    return samples, str(directory)


def kl_setting(config: DictConfig) -> dict[str, Any]:
    """Where the run's KL to the reference acts, with which estimator and coefficient."""
    algo, actor = config.algorithm, config.actor_rollout_ref.actor
    if algo.get("use_kl_in_reward", False):
        return {"in": "reward", "estimator": algo.kl_penalty, "coef": algo.kl_ctrl.kl_coef,
                "controller": algo.kl_ctrl.type}  # fmt: skip
    if actor.get("use_kl_loss", False):
        return {"in": "loss", "estimator": actor.kl_loss_type, "coef": actor.kl_loss_coef}
    return {"in": None}


def run_settings(config: DictConfig) -> dict[str, Any]:
    algo = config.algorithm
    return {
        "project": config.trainer.project_name,
        "experiment": config.trainer.experiment_name,
        "run_dir": str(config.trainer.default_local_dir),
        "adv_estimator": str(algo.adv_estimator),
        "gamma": algo.gamma,
        "lam": algo.lam,
        "norm_adv_by_std_in_grpo": algo.get("norm_adv_by_std_in_grpo", True),
        "kl": kl_setting(config),
        "rollout_n": config.actor_rollout_ref.rollout.n,
        "temperature": config.actor_rollout_ref.rollout.temperature,
        "max_response_length": config.data.max_response_length,
        "clip_ratio_low": config.actor_rollout_ref.actor.clip_ratio_low,
        "clip_ratio_high": config.actor_rollout_ref.actor.clip_ratio_high,
        "model": str(config.actor_rollout_ref.model.path),
        # the launch's metrics file (verl_gsm8k/launch/): ties the trace to its run and launch
        "metrics_file": os.path.basename(os.environ.get("VERL_FILE_LOGGER_PATH", "")) or None,
    }


class Tracer:
    """One launch's trace: its settings, its writer, and each step's lines built by the trainer
    (``build``) and handed to the writer; what building costs the training thread is logged as
    ``timing_s/gsm8k_trace``."""

    def __init__(self, config: DictConfig, decode: Callable[[int], str]) -> None:
        self.samples, directory = trace_settings(config)
        self.writer = TraceWriter(directory)
        self.run = run_settings(config)
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

    def kl_rows(
        self, old: Sequence[Any] | None, ref: Sequence[Any] | None
    ) -> tuple[list[list[float]] | None, dict[str, str]]:
        """Per-token KL of each sample (the run's estimator), or why there is none."""
        setting = self.run["kl"]
        if setting["in"] is None:
            return None, {"kl": "no KL term in this run (no KL in the reward, no KL loss)"}
        if old is None or ref is None:
            return None, {"kl": "no reference log-probs in this step"}
        pairs = zip(old, ref, strict=True)
        estimator = setting["estimator"]
        return [kl_penalty(o.float(), r.float(), estimator).tolist() for o, r in pairs], {}

    def absent(self, present: set[str]) -> dict[str, str]:
        """Why each per-token quantity not in ``present`` is missing."""
        estimator = self.run["adv_estimator"]
        why = {name: text.format(estimator=estimator) for name, text in ABSENT_WHY.items()}
        return {name: reason for name, reason in why.items() if name not in present}

    def lines(
        self,
        step: int,
        metrics: dict,
        keys: Sequence[str],
        columns: dict[str, list | None],
        absent: dict[str, str],
        of: int,
        stats: dict[str, Any],
    ) -> list[dict]:
        """The step line, then a line per traced sample. ``keys``: {uid}_{session}_{index};
        ``columns``: per-sample lists in the order of ``keys``: ``prompt_ids``,
        ``response_ids``, ``per_token`` (dicts of record.py's names, a value per response
        token), and, None when unknown, ``response_mask``, ``ground_truth``, ``data_source``,
        ``reward_extra``; ``absent``: why a quantity is missing (the same for every sample)."""
        head = step_line(step, self.run, metrics, traced=len(keys), of=of)
        head["batch"] = clean(stats)  # a NaN score (the step a watchdog stops) is JSON's null
        lines = [head]
        for i, key in enumerate(keys):
            value = {name: column[i] if column else None for name, column in columns.items()}
            per_token = dict(value["per_token"])
            if "reward" not in per_token and "score" in per_token:
                per_token["reward"] = per_token["score"]  # no KL in the reward: reward = score
            responses = value["response_ids"]
            lines.append(
                sample_line(
                    step=step, key=key, uid=prompt_of(key), session=session_of(key),
                    prompt_ids=value["prompt_ids"], response_ids=responses,
                    response_mask=value.get("response_mask") or [1] * len(responses),
                    per_token=per_token, absent=absent, decode=self.decode,
                    ground_truth=value.get("ground_truth"), data_source=value.get("data_source"),
                    reward_extra=value.get("reward_extra") or {},
                )
            )  # fmt: skip
        return lines

    def per_token(
        self,
        count: int,
        named: dict[str, list],
        old: Sequence[Any] | None,
        ref: Sequence[Any] | None,
    ) -> tuple[list[dict[str, list]], dict[str, str]]:
        """Each of ``count`` samples' per-token dict (``named``: record.py's name -> per-sample
        rows, plus the KL from ``old`` and ``ref`` log-probs where the run has one) and why the
        others are missing."""
        kl, absent = self.kl_rows(old, ref)
        absent.update(self.absent(set(named)))
        if kl is not None:
            named = {**named, "kl": kl}
        return [{name: values[i] for name, values in named.items()} for i in range(count)], absent


def batch_stats(scores: dict[str, Sequence[float]], raw_advantage: torch.Tensor | None) -> dict:
    """What the traced samples alone cannot give: each response's length in tokens and the step's
    prompt groups (``scores``: every real response's per-token scores by key), and how verl
    whitened the step's GAE advantages (``raw_advantage``: returns - values over every response
    token of the batch, padding included, as ``core_algos.compute_gae_advantage_return`` does).
    """
    stats: dict[str, Any] = {}
    by_prompt: dict[str, list[float]] = {}
    for key, row in scores.items():
        by_prompt.setdefault(prompt_of(key), []).append(float(sum(row)))
    # every response's length: the rollout browser marks those cut at data.max_response_length
    stats["response_lengths"] = {key: len(row) for key, row in scores.items()}
    totals = [s for group in by_prompt.values() for s in group]
    lo, hi = min(totals), max(totals)
    same = [g for g in by_prompt.values() if max(g) == min(g)]
    stats["groups"] = {
        "count": len(by_prompt), "size": max(len(g) for g in by_prompt.values()),
        "zero_spread": len(same), "all_max": sum(1 for g in same if g[0] == hi),
        "all_min": sum(1 for g in same if g[0] == lo), "score_min": lo, "score_max": hi,
    }  # fmt: skip
    if raw_advantage is not None:
        raw = raw_advantage.float()
        stats["advantage_whitening"] = {
            "mean": raw.mean().item(), "var": raw.var(unbiased=True).item(),
            "tokens": raw.numel(), "eps": 1e-8,
        }  # fmt: skip
    return stats


def rows(value: Any) -> list[Any]:
    """Per-sample Python values of one field (jagged tensor, tensor, array or objects)."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return [row.tolist() for row in value.unbind()]
        return value.tolist()
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return list(value)

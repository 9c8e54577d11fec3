"""The trainer every PPO launch runs (registered as ``gsm8k``): verl's v1 ``sync`` PPO trainer,
guarded (``guarded.py``), plus the per-token trace (``verl_gsm8k/trace/``).

Imported in verl's TaskRunner process by ``verl_gsm8k.verl_plugins.register_trainer`` as soon as
verl's ``verl.trainer.ppo.v1`` is; ``trainer.v1.trainer_mode=gsm8k`` (set by the launcher for
every PPO launch) then makes verl's ``get_trainer_cls`` (``verl/trainer/ppo/v1/trainer_base.py``
~2017, called by ``TaskRunnerV1.run`` in ``verl/trainer/main_ppo.py`` ~141) build this class.
Besides the guard's additions it changes two methods, both calling verl's own first:

- ``__init__`` sets ``trainer.v1.trainer_mode`` back to ``sync`` before verl reads it: verl
  branches on that name (replay buffer, refill, checkpoints: trainer_base.py ~129-157, ~731,
  ~902-1004, ~1499), and this trainer must behave exactly as ``sync``;
- ``_compute_metrics`` (called once per step after the update and before verl clears the step's
  data, trainer_base.py ~503-511) reads the chosen samples' tensors from TransferQueue and hands
  the lines to a background writer.

Settings: ``gsm8k_trace.samples`` (TRACE_SAMPLES; 0 = off) and ``gsm8k_trace.dir`` (default
``<trainer.default_local_dir>/trace``); the guard's in ``gsm8k_guard``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.core_algos import kl_penalty
from verl.trainer.ppo.v1.trainer_base import register_trainer

from verl_gsm8k.common.run_dir import TRACE_DIR
from verl_gsm8k.ppo_trainer.guarded import GuardedTrainer
from verl_gsm8k.trace.record import TraceWriter, sample_line, step_line
from verl_gsm8k.trace.select import choose, prompt_of

MODE = "gsm8k"
TIMING_KEY = "timing_s/gsm8k_trace"  # logged every step with the step's other timings
logger = logging.getLogger(__name__)

# verl's TransferQueue field -> our per-token name (verl/trainer/ppo/v1/trainer_base.py writes them)
TQ_PER_TOKEN = {
    "rollout_log_probs": "rollout_log_prob",
    "old_log_probs": "old_log_prob",
    "entropy": "entropy",
    "ref_log_prob": "ref_log_prob",
    "values": "value",
    "rm_scores": "score",
    "token_level_rewards": "reward",
    "advantages": "advantage",
    "returns": "return",
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


def _rows(value: Any) -> list[Any]:
    """Per-sample Python values of one TransferQueue field (jagged tensor, tensor or objects)."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return [row.tolist() for row in value.unbind()]
        return value.tolist()
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return list(value)


@register_trainer(MODE)
class TracingTrainer(GuardedTrainer):
    """The guarded sync trainer that also writes ``<run dir>/trace/<step>.jsonl``."""

    def __init__(self, config: DictConfig) -> None:
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        self.trace_samples, trace_dir = trace_settings(config)
        self.trace_writer = TraceWriter(trace_dir)
        self.trace_run = run_settings(config)
        print(f"gsm8k_trace: {self.trace_samples} samples per step -> {trace_dir}", flush=True)

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().fit(*args, **kwargs)
        finally:
            self.trace_writer.close()

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):  # noqa: ANN001
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        if self.trace_samples <= 0:
            return
        start = time.perf_counter()
        try:
            self._trace_step(batch, metrics, global_steps)
        except Exception as err:  # a diagnostic never stops training
            logger.warning("gsm8k_trace: step %s not traced: %r", global_steps, err)
        # what the trace costs the training thread (reading, converting; the write is not on it)
        metrics[TIMING_KEY] = time.perf_counter() - start

    def _trace_step(self, batch: Any, metrics: dict, step: int) -> None:
        tags = zip(batch.keys, batch.tags, strict=True)
        real = [key for key, tag in tags if not tag.get("is_padding", False)]
        keys = choose(real, step, self.trace_samples)
        if not keys:
            return
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id)
        fields = set(data.keys())
        rows = {name: _rows(data[name]) for name in fields if name in TQ_PER_TOKEN}
        prompts, responses = _rows(data["prompts"]), _rows(data["responses"])
        masks = _rows(data["response_mask"]) if "response_mask" in fields else None
        kl, absent = self._kl_rows(data, fields)
        absent.update(self._absent(fields))
        extras = _rows(data["extra_fields"]) if "extra_fields" in fields else [{}] * len(keys)
        models = _rows(data["reward_model"]) if "reward_model" in fields else [{}] * len(keys)
        sources = _rows(data["data_source"]) if "data_source" in fields else [None] * len(keys)
        decode = self._decode_one
        head = step_line(step, self.trace_run, metrics, traced=len(keys), of=len(real))
        head["batch"] = self._batch_stats(batch, real)
        lines = [head]
        for i, key in enumerate(keys):
            per_token = {TQ_PER_TOKEN[name]: values[i] for name, values in rows.items()}
            if "reward" not in per_token and "score" in per_token:
                per_token["reward"] = per_token["score"]  # no KL in the reward: reward = score
            if kl is not None:
                per_token["kl"] = kl[i]
            extra = extras[i] if isinstance(extras[i], dict) else {}
            model = models[i] if isinstance(models[i], dict) else {}
            lines.append(
                sample_line(
                    step=step, key=key, uid=prompt_of(key), session=_session(key),
                    prompt_ids=prompts[i], response_ids=responses[i],
                    response_mask=masks[i] if masks else [1] * len(responses[i]),
                    per_token=per_token, absent=absent, decode=decode,
                    ground_truth=model.get("ground_truth"), data_source=sources[i],
                    reward_extra=extra.get("reward_extra_info") or {},
                )
            )  # fmt: skip
        self.trace_writer.submit(step, lines)

    def _batch_stats(self, batch: Any, real: list[str]) -> dict[str, Any]:
        """What the traced samples alone cannot give: how verl whitened the step's GAE advantages
        (mean and unbiased variance of the raw advantage, returns - values, over every response
        token of the batch, padding included, as ``core_algos.compute_gae_advantage_return``
        does), how many prompt groups of the step had the same score in every response, and
        every response's length."""
        stats: dict[str, Any] = {}
        scores = tq.kv_batch_get(keys=real, partition_id=batch.partition_id,
                                 select_fields=["rm_scores"])["rm_scores"]  # fmt: skip
        by_prompt: dict[str, list[float]] = {}
        lengths: dict[str, int] = {}
        for key, row in zip(real, _rows(scores), strict=True):
            by_prompt.setdefault(prompt_of(key), []).append(float(sum(row)))
            lengths[key] = len(row)
        # every response's length in tokens: the rollout browser marks those cut at
        # data.max_response_length (verl's dump has the text only, without its EOS)
        stats["response_lengths"] = lengths
        totals = [s for group in by_prompt.values() for s in group]
        lo, hi = min(totals), max(totals)
        same = [g for g in by_prompt.values() if max(g) == min(g)]
        stats["groups"] = {
            "count": len(by_prompt), "size": max(len(g) for g in by_prompt.values()),
            "zero_spread": len(same), "all_max": sum(1 for g in same if g[0] == hi),
            "all_min": sum(1 for g in same if g[0] == lo), "score_min": lo, "score_max": hi,
        }  # fmt: skip
        if self.trace_run["adv_estimator"] == "gae" and self.use_critic:
            fields = ["returns", "values", "response_mask"]
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=fields)  # fmt: skip
            rows = zip(data["returns"].unbind(), data["values"].unbind(),
                       data["response_mask"].unbind(), strict=True)  # fmt: skip
            raw = torch.cat([(r - v).float()[m.bool()] for r, v, m in rows])
            stats["advantage_whitening"] = {
                "mean": raw.mean().item(), "var": raw.var(unbiased=True).item(),
                "tokens": raw.numel(), "eps": 1e-8,
            }  # fmt: skip
        return stats

    def _kl_rows(self, data: Any, fields: set[str]) -> tuple[list[list[float]] | None, dict]:
        setting = self.trace_run["kl"]
        if setting["in"] is None:
            return None, {"kl": "no KL term in this run (no KL in the reward, no KL loss)"}
        if not {"old_log_probs", "ref_log_prob"} <= fields:
            return None, {"kl": "no reference log-probs in this step"}
        old, ref = data["old_log_probs"], data["ref_log_prob"]
        if old.is_nested:
            old, ref = old.unbind(), ref.unbind()
        pairs = zip(old, ref, strict=True)
        estimator = setting["estimator"]
        return [kl_penalty(o.float(), r.float(), estimator).tolist() for o, r in pairs], {}

    def _absent(self, fields: set[str]) -> dict[str, str]:
        why = {
            "value": f"no critic (algorithm.adv_estimator={self.trace_run['adv_estimator']})",
            "rollout_log_prob": "vLLM's log-probs not kept (rollout.calculate_log_probs=false)",
            "ref_log_prob": "no reference model in this run",
            "entropy": "no entropy in this step",
        }
        present = {TQ_PER_TOKEN[name] for name in fields if name in TQ_PER_TOKEN}
        return {name: reason for name, reason in why.items() if name not in present}

    def _decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])


def _session(key: str) -> int:
    parts = key.rsplit("_", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0


__all__ = ["MODE", "TracingTrainer"]

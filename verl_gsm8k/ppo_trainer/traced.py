"""verl's v1 sync trainer (registered as gsm8k) with the guard and the trace, on trainer_base.py:
__init__ sets trainer_mode back to sync (verl branches on it, ~129-157, ~731, ~902-1004, ~1499);
step (~533, before the save) runs the guard and ends a run by lowering the total (~467); the
validate/train hooks prepare the loggers and honour a stop; _compute_metrics (~503-511) traces."""

import time
from typing import Any

import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_gsm8k.guard.rules import prompt_of
from verl_gsm8k.ppo_trainer import MODE
from verl_gsm8k.ppo_trainer.guard_base import GuardBase, Observed, numeric
from verl_gsm8k.ppo_trainer.tool_stats import tool_metrics
from verl_gsm8k.ppo_trainer.trace_lines import PER_TOKEN, Tracer, as_list, batch_stats, rows
from verl_gsm8k.trace.select import choose

COLUMNS = ("prompts", "responses", "response_mask", "data_source")


@register_trainer(MODE)
class TracingTrainer(GuardBase, PPOTrainerSync):
    def __init__(self, config: DictConfig) -> None:
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        self._init_guard(config)
        self.tracer = Tracer(config, lambda token: self.tokenizer.decode([token]))

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        self._begin(self.global_steps)
        try:
            return super().fit(*args, **kwargs)
        finally:
            self.tracer.close()

    def on_validate_begin(self) -> None:
        self._prepare_logger(self.logger.logger)  # step 0's validation logs first
        super().on_validate_begin()

    def on_train_begin(self) -> None:
        self._prepare_logger(self.logger.logger)
        super().on_train_begin()
        self._stop_if_requested(self.global_steps - 1)  # nothing trained here: nothing saved

    def step(self, metrics: dict, timing_raw: dict) -> Any:
        started = time.time()
        batch = super().step(metrics, timing_raw)
        self._after_update(self.global_steps, started, lambda: self._observe(batch, metrics))
        return batch

    def on_validate_end(self) -> None:
        super().on_validate_end()
        if self.sick_step is None:
            self._stop_if_requested(self.global_steps)

    def _end_after(self, step: int) -> None:
        super()._end_after(step)
        self.total_training_steps = step

    def _get(self, batch: Any, keys: list[str], fields: list[str] | None = None) -> Any:
        return tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)

    def _observe(self, batch: Any, metrics: dict) -> Observed:
        """The step's metrics and its real responses and scores."""
        real = _real(batch)
        fields = ["responses", "response_mask", "rm_scores"]
        data = self._get(batch, real, fields)
        responses, scores = [], []
        for ids, mask, score in zip(*(rows(data[n]) for n in fields), strict=True):
            pairs = zip(ids.tolist(), mask.tolist(), strict=False)
            responses.append([int(token) for token, on in pairs if on])
            scores.append(float(score.float().sum()))
        return numeric(metrics), responses, scores, [prompt_of(key) for key in real]

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        if self.config.actor_rollout_ref.rollout.multi_turn.get("tool_config_path"):
            extras = rows(self._get(batch, _real(batch), ["extra_fields"])["extra_fields"])
            metrics.update(tool_metrics([_of(e, "reward_extra_info") for e in extras]))
        self.tracer.record(global_steps, metrics, lambda: self._trace(batch, metrics, global_steps))

    def _trace(self, batch: Any, metrics: dict, step: int) -> list[dict] | None:
        real = _real(batch)
        keys = choose(real, step, self.tracer.samples)
        if not keys:
            return None
        data = self._get(batch, keys)
        fields = set(data.keys())
        wanted = {*COLUMNS, *PER_TOKEN} - {"token_level_scores"}
        cols = {name: rows(data[name]) for name in fields & wanted}
        got = {name: rows(data[name]) if name in fields else [] for name in
               ("reward_model", "extra_fields")}  # fmt: skip
        cols["ground_truth"] = [_of(m, "ground_truth") for m in got["reward_model"]] or None
        cols["reward_extra"] = [_of(e, "reward_extra_info") for e in got["extra_fields"]] or None
        scores = self._get(batch, real, ["rm_scores"])["rm_scores"]
        raw = None
        if self.tracer.run["adv_estimator"] == "gae" and self.use_critic:
            full = self._get(batch, batch.keys, ["returns", "values", "response_mask"])
            triples = zip(*(full[n].unbind() for n in ("returns", "values", "response_mask")),
                          strict=True)  # fmt: skip
            raw = torch.cat([(r - v).float()[m.bool()] for r, v, m in triples])
        stats = batch_stats({k: as_list(s) for k, s in zip(real, rows(scores), strict=True)}, raw)
        return self.tracer.lines(step, metrics, keys, cols, len(real), stats)


def _real(batch: Any) -> list[str]:
    """The batch's keys but its padding samples."""
    tags = zip(batch.keys, batch.tags, strict=True)
    return [key for key, tag in tags if not tag.get("is_padding", False)]


def _of(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else None

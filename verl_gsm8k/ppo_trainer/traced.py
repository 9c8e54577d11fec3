"""The trainer every v1 PPO launch runs (registered as ``gsm8k``): verl's v1 ``sync`` PPO trainer,
guarded (``guarded.py``), plus the per-token trace (``trace_lines.py``, ``verl_gsm8k/trace/``).

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
"""

from __future__ import annotations

from typing import Any

import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer

from verl_gsm8k.ppo_trainer import MODE
from verl_gsm8k.ppo_trainer.guarded import GuardedTrainer
from verl_gsm8k.ppo_trainer.trace_lines import Tracer, batch_stats, rows
from verl_gsm8k.trace.select import choose

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


@register_trainer(MODE)
class TracingTrainer(GuardedTrainer):
    """The guarded sync trainer that also writes ``<run dir>/trace/<step>.jsonl``."""

    def __init__(self, config: DictConfig) -> None:
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        self.tracer = Tracer(config, lambda token: self.tokenizer.decode([token]))

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().fit(*args, **kwargs)
        finally:
            self.tracer.close()

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):  # noqa: ANN001
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        self.tracer.record(global_steps, metrics, lambda: self._trace(batch, metrics, global_steps))

    def _trace(self, batch: Any, metrics: dict, step: int) -> list[dict] | None:
        tags = zip(batch.keys, batch.tags, strict=True)
        real = [key for key, tag in tags if not tag.get("is_padding", False)]
        keys = choose(real, step, self.tracer.samples)
        if not keys:
            return None
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id)
        fields = set(data.keys())

        def column(name: str) -> list | None:
            return rows(data[name]) if name in fields else None

        named = {TQ_PER_TOKEN[name]: rows(data[name]) for name in fields & set(TQ_PER_TOKEN)}
        old, ref = (data[name] if name in fields else None
                    for name in ("old_log_probs", "ref_log_prob"))  # fmt: skip
        if old is not None and ref is not None and old.is_nested:
            old, ref = old.unbind(), ref.unbind()
        per_token, absent = self.tracer.per_token(len(keys), named, old, ref)
        models, extras = column("reward_model") or [], column("extra_fields") or []
        columns = {
            "prompt_ids": column("prompts"), "response_ids": column("responses"),
            "per_token": per_token,
            "response_mask": column("response_mask"), "data_source": column("data_source"),
            "ground_truth": [_of(model, "ground_truth") for model in models] or None,
            "reward_extra": [_of(extra, "reward_extra_info") for extra in extras] or None,
        }  # fmt: skip
        stats = self._batch_stats(batch, real)
        return self.tracer.lines(step, metrics, keys, columns, absent, len(real), stats)

    def _batch_stats(self, batch: Any, real: list[str]) -> dict[str, Any]:
        scores = tq.kv_batch_get(keys=real, partition_id=batch.partition_id,
                                 select_fields=["rm_scores"])["rm_scores"]  # fmt: skip
        raw = None
        if self.tracer.run["adv_estimator"] == "gae" and self.use_critic:
            fields = ["returns", "values", "response_mask"]
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=fields)  # fmt: skip
            triples = zip(data["returns"].unbind(), data["values"].unbind(),
                          data["response_mask"].unbind(), strict=True)  # fmt: skip
            raw = torch.cat([(r - v).float()[m.bool()] for r, v, m in triples])
        return batch_stats(dict(zip(real, rows(scores), strict=True)), raw)


def _of(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else None


__all__ = ["MODE", "TracingTrainer"]

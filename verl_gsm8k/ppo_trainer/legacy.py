"""verl's legacy PPO trainer (``RayPPOTrainer``, ``trainer.use_v1=false``: the LoRA and ReMax
recipes) with the same guard (``guard_base.py``) and per-token trace (``trace_lines.py``) as the
v1 trainer the other recipes run.

The legacy trainer has no trainer registry: ``verl_plugins/register_trainer.py`` puts this class
in place of ``RayPPOTrainer`` in ``verl.trainer.main_ppo_v0``, whose ``TaskRunner.run`` builds the
trainer by that module-level name (``verl/trainer/main_ppo_v0.py`` ~218). Its ``fit``
(``verl/trainer/ppo/ray_trainer.py`` ~1405-1800) is one long loop with no hooks, so each addition
sits on a method that loop calls:

- ``_load_checkpoint`` (called by ``fit`` ~1427 after it sets ``global_steps`` to 0): the step
  the run resumes from (``GuardBase._begin``).
- the training dataloader, wrapped (``_StoppingLoader``): before each batch it reads the stop
  request (one that came during start-up or a validation saves the last step if needed and ends
  ``fit``: the loader yields no more batches, in this epoch or the next), and once the run is to
  end after a step it yields nothing more. ``len``, ``state_dict`` and ``load_state_dict`` are
  the loader's own (nothing is fetched ahead, so ``data.pt`` is right).
- ``_compute_old_log_prob`` and ``_update_critic``: ``fit`` keeps the step's metrics in a local
  dict, so the entropy (aggregated as ``fit`` does, ~1590) and the critic's metrics are kept
  for the watchdog; the per-token entropy for the trace.
- ``_update_actor`` (``fit`` saves right after it, ~1712): the step's metrics as ``fit`` will log
  them (``compute_data_metrics``, the actor's and critic's, the KL in the reward as
  ``apply_kl_penalty`` computes it), its responses and scores from the batch; then the trace,
  the watchdog, a stop request, the deadline and the time save (``GuardBase._after_update``).
  verl's own save of the step then meets ``GuardBase._save_checkpoint``. Critic warm-up steps
  (``trainer.critic_warmup``) update no actor: they are not watched.
- ``fit``: verl builds its ``Tracking`` inside ``fit`` (~1417, imported there), so for the
  length of ``fit`` ``verl.utils.tracking.Tracking`` is a subclass that prepares the loggers
  before its first ``log`` (``GuardBase._prepare_logger``), and the original is put back after.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
import verl.utils.tracking as tracking
from verl import DataProto
from verl.trainer.ppo.core_algos import agg_loss, kl_penalty
from verl.trainer.ppo.metric_utils import compute_data_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.metric import reduce_metrics
from verl.utils.torch_functional import masked_mean

from verl_gsm8k.common.pause import pause_point
from verl_gsm8k.ppo_trainer.guard_base import GuardBase, Observed, numeric
from verl_gsm8k.ppo_trainer.trace_lines import Tracer, batch_stats
from verl_gsm8k.trace.select import choose

# the legacy batch's per-token tensors -> the trace's names (verl_gsm8k/trace/record.py)
BATCH_PER_TOKEN = {
    "rollout_log_probs": "rollout_log_prob",
    "old_log_probs": "old_log_prob",
    "ref_log_prob": "ref_log_prob",
    "values": "value",
    "token_level_scores": "score",
    "token_level_rewards": "reward",
    "advantages": "advantage",
    "returns": "return",
}


class _StoppingLoader:
    """The training dataloader, ending the loop where the guard ends the run (module docstring)."""

    def __init__(self, loader: Any, trainer: GuardedLegacyTrainer) -> None:
        self.loader, self.trainer = loader, trainer

    def __iter__(self) -> Iterator[Any]:
        trainer = self.trainer
        batches = iter(self.loader)
        # fit has already counted the step just trained (~1790): the stop request is after the one
        # before, and its save names that step
        while not trainer._stop_if_requested(trainer.global_steps - 1):
            pause_point(f"rollout:{trainer.global_steps}")  # tests: a signal lands before it
            batch = next(batches, None)
            if batch is None:
                return
            trainer.step_started = time.time()
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:  # state_dict, load_state_dict, ...
        return getattr(self.loader, name)


class GuardedLegacyTrainer(GuardBase, RayPPOTrainer):
    """verl's legacy PPO trainer, guarded and traced (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_guard(self.config)
        self.train_dataloader = _StoppingLoader(self.train_dataloader, self)
        self.tracer = Tracer(self.config, lambda token: self.tokenizer.decode([token]))
        self.step_started = time.time()
        self.kept: dict[str, float] = {}  # this step's metrics fit holds in a local dict
        self.entropy: torch.Tensor | None = None  # this step's per-token entropy

    def fit(self) -> Any:
        trainer, verls = self, tracking.Tracking

        class PreparedTracking(verls):  # type: ignore[misc, valid-type]
            def log(self, data: dict, step: int, backend: Any = None) -> None:
                trainer._prepare_logger(self.logger)
                super().log(data=data, step=step, backend=backend)

        tracking.Tracking = PreparedTracking
        try:
            return super().fit()
        finally:
            tracking.Tracking = verls
            self.tracer.close()

    def _load_checkpoint(self) -> Any:
        loaded = super()._load_checkpoint()
        self._begin(self.global_steps)  # 0, or the step of the checkpoint just loaded
        return loaded

    def _compute_old_log_prob(self, batch: DataProto) -> Any:
        old_log_prob, mfu = super()._compute_old_log_prob(batch)
        self.entropy = old_log_prob.batch["entropys"]
        actor = self.config.actor_rollout_ref.actor
        entropy = agg_loss(loss_mat=self.entropy, loss_mask=batch.batch["response_mask"],
                           loss_agg_mode=actor.loss_agg_mode,
                           loss_scale_factor=actor.loss_scale_factor)  # fmt: skip
        self.kept["actor/entropy"] = entropy.detach().item()
        return old_log_prob, mfu

    def _update_critic(self, batch: DataProto) -> DataProto:
        output = super()._update_critic(batch)
        self.kept.update(numeric(reduce_metrics(dict(output.meta_info["metrics"]))))
        return output

    def _update_actor(self, batch: DataProto) -> DataProto:
        output = super()._update_actor(batch)
        step, logged = self.global_steps, output.meta_info["metrics"]
        metrics = {**self.kept, **numeric(reduce_metrics(dict(logged)))}
        metrics.update(numeric(compute_data_metrics(batch=batch, use_critic=self.use_critic)))
        metrics.update(self._reward_kl(batch))
        self.kept = {}
        traced: dict[str, float] = {}
        self.tracer.record(step, traced, lambda: self._trace(batch, metrics, step))
        logged.update(traced)  # fit logs the actor's metrics: the trace's cost with them
        self._after_update(step, self.step_started, lambda: self._observe(batch, metrics))
        return output

    def _reward_kl(self, batch: DataProto) -> dict[str, float]:
        """``actor/reward_kl_penalty`` as verl's ``apply_kl_penalty`` logs it (ray_trainer.py
        ~78-117), when the KL is in the reward."""
        algorithm, tensors = self.config.algorithm, batch.batch
        if not algorithm.use_kl_in_reward or "ref_log_prob" not in set(tensors.keys()):
            return {}
        mask = tensors["response_mask"]
        kld = kl_penalty(tensors["old_log_probs"], tensors["ref_log_prob"],
                         kl_penalty=algorithm.kl_penalty) * mask  # fmt: skip
        return {"actor/reward_kl_penalty": masked_mean(kld, mask=mask, axis=-1).mean().item()}

    def _observe(self, batch: DataProto, metrics: dict[str, float]) -> Observed:
        pairs = zip(batch.batch["responses"], batch.batch["response_mask"], strict=True)
        responses = [[int(t) for t, on in zip(ids.tolist(), mask.tolist(), strict=True) if on]
                     for ids, mask in pairs]  # fmt: skip
        scores = batch.batch["token_level_scores"].sum(-1).tolist()
        return metrics, responses, scores, [str(uid) for uid in batch.non_tensor_batch["uid"]]

    # ---- the trace -----------------------------------------------------------------------
    def _trace(self, batch: DataProto, metrics: dict, step: int) -> list[dict] | None:
        keys = _keys(batch)
        chosen = choose(keys, step, self.tracer.samples)
        if not chosen:
            return None
        index = {key: i for i, key in enumerate(keys)}
        rows = [index[key] for key in chosen]
        tensors, other = batch.batch, batch.non_tensor_batch
        present = set(tensors.keys())
        lengths = [int(n) for n in tensors["response_mask"].sum(-1).tolist()]

        def cut(values: torch.Tensor, at: list[int] = rows) -> list[torch.Tensor]:
            return [values[i, : lengths[i]] for i in at]

        def listed(values: torch.Tensor) -> list[list]:
            return [row.tolist() for row in cut(values)]

        named = {ours: listed(tensors[name]) for name, ours in BATCH_PER_TOKEN.items()
                 if name in present}  # fmt: skip
        if self.entropy is not None:
            named["entropy"] = listed(self.entropy)
        with_ref = {"old_log_probs", "ref_log_prob"} <= present
        old, ref = (cut(tensors[name]) if with_ref else None
                    for name in ("old_log_probs", "ref_log_prob"))  # fmt: skip
        per_token, absent = self.tracer.per_token(len(rows), named, old, ref)
        prompt_mask = tensors["attention_mask"][:, : tensors["prompts"].shape[-1]].bool()
        extra_keys = [key for key in batch.meta_info.get("reward_extra_keys", []) if key in other]
        columns = {
            "prompt_ids": [tensors["prompts"][i][prompt_mask[i]].tolist() for i in rows],
            "response_ids": listed(tensors["responses"]),
            "response_mask": listed(tensors["response_mask"]),
            "per_token": per_token,
            "ground_truth": [_ground_truth(other, i) for i in rows],
            "data_source": [other["data_source"][i] for i in rows] if "data_source" in other
            else None,
            "reward_extra": [{key: other[key][i] for key in extra_keys} for i in rows],
        }  # fmt: skip
        scores = cut(tensors["token_level_scores"], list(range(len(keys))))
        raw = None
        if self.tracer.run["adv_estimator"] == "gae" and self.use_critic:
            raw = (tensors["returns"] - tensors["values"])[tensors["response_mask"].bool()]
        stats = batch_stats({key: row.tolist() for key, row in zip(keys, scores, strict=True)}, raw)
        return self.tracer.lines(step, metrics, chosen, columns, absent, len(keys), stats)


def _keys(batch: DataProto) -> list[str]:
    """verl's v1 keys for the batch's responses, ``{uid}_{n}_0``: the n-th response to prompt
    ``uid`` (the trace selects and names samples by them)."""
    seen: Counter[str] = Counter()
    keys = []
    for uid in batch.non_tensor_batch["uid"]:
        keys.append(f"{uid}_{seen[str(uid)]}_0")
        seen[str(uid)] += 1
    return keys


def _ground_truth(other: dict[str, Any], i: int) -> Any:
    model = other["reward_model"][i] if "reward_model" in other else None
    return model.get("ground_truth") if isinstance(model, dict) else None


__all__ = ["GuardedLegacyTrainer"]

"""verl's legacy PPO trainer (RayPPOTrainer: LoRA, ReMax) with the guard and the trace. Its fit
(ray_trainer.py ~1405-1800) has no hooks, so each addition wraps a method it calls: _load_checkpoint
(~1427); the dataloader stops yielding on a stop; _compute_old_log_prob and _update_critic keep
fit's local metrics (entropy as ~1590); _update_actor (save follows, ~1712) runs trace and guard;
Tracking (~1417) is swapped for a subclass that prepares the loggers."""

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

from verl_gsm8k.ppo_trainer.guard_base import GuardBase, Observed, numeric
from verl_gsm8k.ppo_trainer.trace_lines import PER_TOKEN, Tracer, batch_stats
from verl_gsm8k.trace.select import choose


class _StoppingLoader:
    """The training dataloader, ending verl's loop where the guard ends the run."""

    def __init__(self, loader: Any, trainer: "GuardedLegacyTrainer") -> None:
        self.loader, self.trainer = loader, trainer

    def __iter__(self) -> Iterator[Any]:
        trainer, batches = self.trainer, iter(self.loader)
        # fit has counted the step just trained (~1790): a stop saves the one before
        while not trainer._stop_if_requested(trainer.global_steps - 1):
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
        self._begin(self.global_steps)  # 0, or the step just loaded
        return loaded

    def _compute_old_log_prob(self, batch: DataProto) -> Any:
        old_log_prob, mfu = super()._compute_old_log_prob(batch)
        self.entropy, actor = old_log_prob.batch["entropys"], self.config.actor_rollout_ref.actor
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
        self.kept, traced = {}, {}
        self.tracer.record(step, traced, lambda: self._trace(batch, metrics, step))
        logged.update(traced)  # fit logs the actor's metrics: the trace's cost with them
        self._after_update(step, self.step_started, lambda: self._observe(batch, metrics))
        return output

    def _reward_kl(self, batch: DataProto) -> dict[str, float]:
        """``actor/reward_kl_penalty`` as verl's ``apply_kl_penalty`` logs it (~78-117)."""
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

    def _trace(self, batch: DataProto, metrics: dict, step: int) -> list[dict] | None:
        keys = _keys(batch)
        chosen = choose(keys, step, self.tracer.samples)
        if not chosen:
            return None
        at = [keys.index(key) for key in chosen]
        tensors, other = batch.batch, batch.non_tensor_batch
        lengths = tensors["response_mask"].sum(-1).tolist()

        def cut(values: torch.Tensor, rows: list[int] = at) -> list[torch.Tensor]:
            return [values[i, : int(lengths[i])] for i in rows]

        present = set(tensors.keys()) - {"rm_scores"}
        cols: dict[str, Any] = {name: cut(tensors[name]) for name in PER_TOKEN if name in present}
        if self.entropy is not None:
            cols["entropy"] = cut(self.entropy)
        prompts = tensors["prompts"]
        prompt_mask = tensors["attention_mask"][:, : prompts.shape[-1]].bool()
        extra = [key for key in batch.meta_info.get("reward_extra_keys", []) if key in other]
        models = [other["reward_model"][i] if "reward_model" in other else None for i in at]
        cols.update(
            prompts=[prompts[i][prompt_mask[i]] for i in at], responses=cut(tensors["responses"]),
            response_mask=cut(tensors["response_mask"]),
            ground_truth=[m.get("ground_truth") if isinstance(m, dict) else None for m in models],
            data_source=[other["data_source"][i] for i in at] if "data_source" in other else None,
            reward_extra=[{key: other[key][i] for key in extra} for i in at],
        )  # fmt: skip
        scores = cut(tensors["token_level_scores"], list(range(len(keys))))
        raw = None
        if self.tracer.run["adv_estimator"] == "gae" and self.use_critic:
            raw = (tensors["returns"] - tensors["values"])[tensors["response_mask"].bool()]
        stats = batch_stats({k: s.tolist() for k, s in zip(keys, scores, strict=True)}, raw)
        return self.tracer.lines(step, metrics, chosen, cols, len(keys), stats)


def _keys(batch: DataProto) -> list[str]:
    """v1's key of each response, ``{uid}_{n}_0`` (the trace names samples by them)."""
    seen: Counter[str] = Counter()
    keys = []
    for uid in batch.non_tensor_batch["uid"]:
        keys.append(f"{uid}_{seen[str(uid)]}_0")
        seen[str(uid)] += 1
    return keys

"""TOKEN_BUDGET=auto: where the recipe's token budgets pass 90 % of the card in some phase,
every budget key set to the largest power of two under the recipe's at which every phase fits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.preflight.memory import MEMORY_WARN_FRACTION, estimate_phases

BUDGET_KEYS = ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
               "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
               "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
               "critic.ppo_max_token_len_per_gpu",
               "critic.ppo_infer_max_token_len_per_gpu")  # fmt: skip
SMALLEST_BUDGET = 1024  # below this a GSM8K prompt and its answer (768 tokens) barely fit


def with_budget(cfg: Any, budget: int) -> Any:
    """A copy of ``cfg`` with every micro-batch budget set to ``budget``."""
    from omegaconf import OmegaConf

    cfg = cfg.copy()
    for key in BUDGET_KEYS:
        OmegaConf.update(cfg, key, budget, force_add=True)
    return cfg


def overrides(budget: int) -> list[str]:
    return [f"{key}={budget}" for key in BUDGET_KEYS]


def heaviest(cfg: Any, hf_configs: dict[str, Any], card: float) -> tuple[float, str]:
    top = max(estimate_phases(cfg, hf_configs), key=lambda p: p.gib(card))
    return top.gib(card), top.name


def choose(cfg: Any, hf_configs: dict[str, Any], card: float, out: Path, report: Any) -> Any:
    """Write the fitting budget's overrides to ``out`` (or nothing); ``cfg`` at it."""
    write_atomic(out, "")
    if not cfg.actor_rollout_ref.actor.get("use_dynamic_bsz", False):
        return cfg  # micro-batches counted in sequences: the budgets do not apply
    gib, phase = heaviest(cfg, hf_configs, card)
    limit = MEMORY_WARN_FRACTION * card
    if gib <= limit:
        return cfg
    recipe = int(cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu)
    need = (f"the recipe's {recipe} tokens per micro-batch need ~{gib:.1f} GiB ({phase}) of this "
            f"{card:.0f} GiB card")  # fmt: skip
    budget = recipe // 2  # halved until every phase fits under 90 % of the card
    while (
        budget >= SMALLEST_BUDGET
        and heaviest(with_budget(cfg, budget), hf_configs, card)[0] > limit
    ):
        budget //= 2
    if budget < SMALLEST_BUDGET:
        report.note("budget", f"{need}, and no budget down to {SMALLEST_BUDGET} fits: kept")
        return cfg
    report.ok("budget", f"{need}: using {budget}, the largest power of two that fits "
              f"(TOKEN_BUDGET=recipe keeps {recipe})")  # fmt: skip
    write_atomic(out, "\n".join(overrides(budget)) + "\n")
    return with_budget(cfg, budget)

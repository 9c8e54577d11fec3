"""A token budget that fits the card: where a recipe's micro-batch budgets would pass 90 % of the
card in some phase (memory.py's estimate), the largest power-of-two budget below the recipe's
under which every phase stays below 90 %, every micro-batch budget of the run set to it.

The launcher asks for it with ``TOKEN_BUDGET=auto`` (its default; the launcher passes
``--fit-budget FILE`` to the preflight unless the launch's own ``key=value`` overrides set a
budget key): the preflight prints what it chose and why, checks the memory again at that budget,
and writes the overrides to FILE for the launcher to put before the user's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.preflight.memory import MEMORY_WARN_FRACTION, Phase, estimate_phases

# Every micro-batch token budget of a PPO/GRPO run under dynamic batching (configs/gsm8k_base.yaml)
BUDGET_KEYS = (
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    "critic.ppo_max_token_len_per_gpu",
    "critic.ppo_infer_max_token_len_per_gpu",
)
SMALLEST_BUDGET = 1024  # below this a GSM8K prompt and its answer (768 tokens) barely fit


def recipe_budget(cfg: Any) -> int:
    return int(cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu)


def with_budget(cfg: Any, budget: int) -> Any:
    """A copy of ``cfg`` with every micro-batch budget set to ``budget``."""
    from omegaconf import open_dict

    cfg = cfg.copy()
    with open_dict(cfg):
        for key in BUDGET_KEYS:
            node, _, leaf = key.rpartition(".")
            target = cfg
            for part in node.split("."):
                target = target[part]
            target[leaf] = budget
    return cfg


def overrides(budget: int) -> list[str]:
    return [f"{key}={budget}" for key in BUDGET_KEYS]


def heaviest(phases: list[Phase], card: float) -> tuple[float, str]:
    """GiB and name of the heaviest phase on ``card``."""
    top = max(phases, key=lambda p: p.gib(card))
    return top.gib(card), top.name


def fits(phases: list[Phase], card: float) -> bool:
    return heaviest(phases, card)[0] <= MEMORY_WARN_FRACTION * card


def smaller_budgets(cfg: Any) -> list[int]:
    """The recipe's budget halved down to SMALLEST_BUDGET, largest first."""
    budgets, budget = [], recipe_budget(cfg) // 2
    while budget >= SMALLEST_BUDGET:
        budgets.append(budget)
        budget //= 2
    return budgets


def fitting_budget(cfg: Any, hf_configs: dict[str, Any], card: float) -> int | None:
    """The largest budget of smaller_budgets() under which every phase fits below 90 % of
    ``card``; None when none does (the states or vLLM's share alone are too large)."""
    for budget in smaller_budgets(cfg):
        if fits(estimate_phases(with_budget(cfg, budget), hf_configs), card):
            return budget
    return None


def choose(cfg: Any, hf_configs: dict[str, Any], card: float, out: Path, report: Any) -> Any:
    """TOKEN_BUDGET=auto: where the recipe's budgets pass 90 % of ``card`` in some phase and a
    smaller one fits, say so, write its overrides to ``out`` (one per line) and return ``cfg`` at
    that budget; otherwise leave ``out`` empty and ``cfg`` as it is (the memory lines then say
    what does not fit and what to change)."""
    write_atomic(out, "")
    if not cfg.actor_rollout_ref.actor.get("use_dynamic_bsz", False):
        return cfg  # micro-batches counted in sequences: the budgets do not apply
    gib, phase = heaviest(estimate_phases(cfg, hf_configs), card)
    if gib <= MEMORY_WARN_FRACTION * card:
        return cfg
    recipe = recipe_budget(cfg)
    need = (
        f"the recipe's {recipe} tokens per micro-batch need ~{gib:.1f} GiB ({phase}) of this "
        f"{card:.0f} GiB card, above {MEMORY_WARN_FRACTION:.0%}"
    )
    budget = fitting_budget(cfg, hf_configs, card)
    if budget is None:
        report.note("budget", f"{need}, and no budget down to {SMALLEST_BUDGET} fits: kept")
        return cfg
    report.ok(
        "budget",
        f"{need}: using {budget}, the largest power of two under which every phase fits (every "
        f"*_max_token_len_per_gpu key; TOKEN_BUDGET=recipe keeps {recipe})",
    )
    write_atomic(out, "\n".join(overrides(budget)) + "\n")
    return with_budget(cfg, budget)

"""Which recipe fits which card: the preflight's memory per phase (memory.py) for each PPO/GRPO
recipe's composed config, on each Qwen2.5 shape (qwen25.py: offline), under each attention path,
on 24, 40 and 80 GB cards, one GPU. A cell is the heaviest phase's estimate; where it does not fit
(or passes 90 % of the card), the token budget the launcher picks there (preflight/budget.py:
the largest power of two below the recipe's under which every phase fits).

    python -m verl_gsm8k.cards                  # print the table (markdown)
    python -m verl_gsm8k.cards --write docs/gpu.md   # between its markers

tests/test_cards.py regenerates it and fails when docs/gpu.md is stale.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.qwen25 import SHAPES, qwen25_config
from verl_gsm8k.launch.plan import recipe_plan
from verl_gsm8k.preflight.budget import fitting_budget, heaviest, with_budget
from verl_gsm8k.preflight.compose import compose
from verl_gsm8k.preflight.memory import MEMORY_WARN_FRACTION, Phase, estimate_phases

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- cards:begin (python -m verl_gsm8k.cards) -->", "<!-- cards:end -->"
# recipe -> (its config, its model's size)
RECIPES = {
    "ppo_qwen2.5-0.5b_gsm8k": ("gsm8k_ppo", "0.5B"),
    "grpo_qwen2.5-0.5b_gsm8k": ("gsm8k_grpo", "0.5B"),
    "ppo_lora_qwen2.5-1.5b_gsm8k": ("gsm8k_ppo_lora", "1.5B"),
}
# attention path -> overrides over the recipe's (the GPU configs compose flash-attn 2 by default):
# the launcher's own overlays (configs/attention/; verl_gsm8k/common/attention.py chooses one)
ATTENTION = {
    "sdpa, padded": ["+attention=sdpa"],
    "sdpa, packed": ["+attention=sdpa_packed"],
    "flash-attn 2": [],
}
# GiB of each card as nvidia-smi lists it: RTX 4090 24564 MiB, A100 40GB 40960 MiB,
# H100 80GB 81559 MiB.
CARDS = {"24 GB": 24564 / 1024, "40 GB": 40960 / 1024, "80 GB": 81559 / 1024}


def recipe_overrides(recipe: str, config_name: str) -> list[str]:
    """The recipe's overrides on a GPU node (its knob defaults and its own overrides, the plan
    the launch makes), without the device and attention overlays the machine adds."""
    env = {  # the recipe's defaults only: none of this shell's knobs
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "DEVICE": "gpu",
        "MODEL_PATH": "/models/m",
    }
    plan = recipe_plan(ROOT / "recipes" / f"{recipe}.sh", env, gpu=True)
    if plan.recipe.config != config_name:
        raise ValueError(f"{recipe}: its config is {plan.recipe.config}, not {config_name}")
    return [*plan.overrides, *plan.recipe.overrides]


def phases_at(cfg: Any, hf_config: Any, budget: int | None = None) -> list[Phase]:
    """The phases' estimates, every micro-batch budget set to ``budget`` (None: the recipe's)."""
    return estimate_phases(
        cfg if budget is None else with_budget(cfg, budget), {"actor": hf_config}
    )


def row_cells(cfg: Any, hf_config: Any) -> list[str]:
    """A cell per card: the heaviest phase in GiB; past 90 % of the card also "tight" or "no",
    the phase, and the budget the launcher would choose there (budget.fitting_budget)."""
    recipe = phases_at(cfg, hf_config)
    cells = []
    for card in CARDS.values():
        gib, phase = heaviest(recipe, card)
        if gib <= MEMORY_WARN_FRACTION * card:
            cells.append(f"{gib:.1f}")
            continue
        verdict = "tight" if gib <= card else "no"
        fitting = fitting_budget(cfg, {"actor": hf_config}, card)
        what = f"{fitting} tokens fit" if fitting else "no budget fits"
        cells.append(f"{gib:.1f} {verdict} ({phase}; {what})")
    return cells


def table(config_dir: Path = ROOT / "configs") -> str:
    """The markdown table: a row per recipe, model size and attention path; a column per card."""
    warnings.filterwarnings("ignore", message="Disabled critic")  # verl's note for GRPO
    lines = [
        "| recipe | model | attention | " + " | ".join(CARDS) + " |",
        "|---|---|---|" + "---:|" * len(CARDS),
    ]
    for recipe, (config_name, own) in RECIPES.items():
        base = recipe_overrides(recipe, config_name)
        paths = ["actor_rollout_ref.model.path=/models/m", "critic.model.path=/models/m"]
        one_gpu = ["trainer.n_gpus_per_node=1", "trainer.nnodes=1"]
        cfgs = {
            attention: compose(config_dir, config_name, [*base, *paths, *one_gpu, *extra])
            for attention, extra in ATTENTION.items()
        }
        for size in SHAPES:
            hf_config = qwen25_config(size)
            for attention, cfg in cfgs.items():
                cells = row_cells(cfg, hf_config)
                model = f"**{size}**" if size == own else size
                lines.append(f"| {recipe} | {model} | {attention} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def replace_between_markers(doc: str, generated: str) -> str:
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"markers '{BEGIN}' and '{END}' not found")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{generated}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.cards", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="DOC",
        help="replace the table between the markers in DOC (docs/gpu.md) instead of printing it",
    )
    args = parser.parse_args(argv)
    generated = table()
    if args.write is None:
        print(generated, end="")
        return 0
    try:
        text = replace_between_markers(args.write.read_text(), generated)
    except (OSError, ValueError) as exc:
        print(f"cards: {args.write}: {exc}", file=sys.stderr)
        return 1
    write_atomic(args.write, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

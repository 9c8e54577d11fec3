"""Which recipe fits which card: the preflight's memory per phase (memory.py) for each PPO/GRPO
recipe's composed config, on each Qwen2.5 shape (qwen25.py: offline), under each attention path,
on 24, 40 and 80 GB cards, one GPU. A cell is the heaviest phase's estimate; where it does not fit
(or passes 90 % of the card), the token budget the launcher picks there (preflight/budget.py:
the largest power of two below the recipe's under which every phase fits).

    python -m verl_gsm8k.cards                  # print the table (markdown)
    python -m verl_gsm8k.cards --write docs/gpu.md --write README.md   # between their markers

README.md holds one line per recipe from the same cells, in words (the figures' home is
docs/gpu.md). tests/test_cards.py regenerates both and fails when either is stale.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import dataclass
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
README_BEGIN = "<!-- cards-readme:begin (python -m verl_gsm8k.cards) -->"
README_END = "<!-- cards-readme:end -->"
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


@dataclass(frozen=True)
class Cell:
    """One recipe, model and attention path on one card."""

    gib: float  # the heaviest phase per GPU
    phase: str
    card: float  # the card's GiB
    budget: int | None  # past 90 %: the largest budget under which every phase fits, or None

    @property
    def fits(self) -> bool:
        return self.gib <= MEMORY_WARN_FRACTION * self.card

    def text(self) -> str:
        if self.fits:
            return f"{self.gib:.1f}"
        verdict = "tight" if self.gib <= self.card else "no"
        what = f"{self.budget} tokens fit" if self.budget else "no budget fits"
        return f"{self.gib:.1f} {verdict} ({self.phase}; {what})"

    def words(self) -> str:
        """What a launch does on this card, without the figures (the README's line)."""
        if self.fits:
            return "fits"
        if self.budget:
            return f"runs at {self.budget} tokens a micro-batch"
        return "is tight (no budget fits)" if self.gib <= self.card else "does not fit"


def cells_of(cfg: Any, hf_config: Any) -> list[Cell]:
    """A cell per card: the heaviest phase, and past 90 % of the card the budget the launcher
    would choose there (budget.fitting_budget)."""
    recipe = phases_at(cfg, hf_config)
    cells = []
    for card in CARDS.values():
        gib, phase = heaviest(recipe, card)
        fitting = None
        if gib > MEMORY_WARN_FRACTION * card:
            fitting = fitting_budget(cfg, {"actor": hf_config}, card)
        cells.append(Cell(gib, phase, card, fitting))
    return cells


def row_cells(cfg: Any, hf_config: Any) -> list[str]:
    """The table's cells of one row: the heaviest phase in GiB; past 90 % of the card also
    "tight" or "no", the phase, and the budget the launcher would choose there."""
    return [cell.text() for cell in cells_of(cfg, hf_config)]


# (recipe, model size, attention path) -> a cell per card
Rows = dict[tuple[str, str, str], list[Cell]]


def rows(config_dir: Path = ROOT / "configs") -> Rows:
    """Every row's cells: a row per recipe, model size and attention path."""
    warnings.filterwarnings("ignore", message="Disabled critic")  # verl's note for GRPO
    out: Rows = {}
    for recipe, (config_name, _) in RECIPES.items():
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
                out[recipe, size, attention] = cells_of(cfg, hf_config)
    return out


def table(made: Rows | None = None) -> str:
    """The markdown table: a row per recipe, model size and attention path; a column per card."""
    made = rows() if made is None else made
    lines = [
        "| recipe | model | attention | " + " | ".join(CARDS) + " |",
        "|---|---|---|" + "---:|" * len(CARDS),
    ]
    for (recipe, size, attention), cells in made.items():
        model = f"**{size}**" if size == RECIPES[recipe][1] else size
        texts = " | ".join(cell.text() for cell in cells)
        lines.append(f"| {recipe} | {model} | {attention} | {texts} |")
    return "\n".join(lines) + "\n"


def readme_lines(made: Rows | None = None) -> str:
    """One line per recipe at its own model: what each card does under the two attention paths
    a GPU launch takes (flash-attn 2 where it loads, else packed sdpa: common/attention.py)."""
    made = rows() if made is None else made
    lines = []
    for recipe, (_, own) in RECIPES.items():
        paths = [
            f"{attention}: {_on_cards(made[recipe, own, attention])}"
            for attention in ("sdpa, packed", "flash-attn 2")
        ]
        lines.append(f"- `{recipe}` ({own}) with " + "; with ".join(paths))
    return "\n".join(lines) + "\n"


def _on_cards(cells: list[Cell]) -> str:
    """ "fits on 40 and 80 GB cards, runs at 8192 tokens a micro-batch on 24 GB cards"."""
    groups: dict[str, list[str]] = {}
    for name, cell in zip(CARDS, cells, strict=True):
        groups.setdefault(cell.words(), []).append(name.removesuffix(" GB"))
    said = []
    for words, sizes in groups.items():
        listed = sizes[0] if len(sizes) == 1 else f"{', '.join(sizes[:-1])} and {sizes[-1]}"
        said.append(f"{words} on {listed} GB cards")
    return ", ".join(said)


def replace_between_markers(doc: str, generated: str, begin: str = BEGIN, end: str = END) -> str:
    if begin not in doc or end not in doc:
        raise ValueError(f"markers '{begin}' and '{end}' not found")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{generated}{end}{tail}"


def write(doc: Path, made: Rows) -> None:
    """Replace each generated block whose markers ``doc`` holds (the table, the README lines)."""
    text = doc.read_text()
    blocks = [(BEGIN, END, table), (README_BEGIN, README_END, readme_lines)]
    held = [(begin, end, render) for begin, end, render in blocks if begin in text]
    if not held:
        raise ValueError(f"neither '{BEGIN}' nor '{README_BEGIN}' found")
    for begin, end, render in held:
        text = replace_between_markers(text, render(made), begin, end)
    write_atomic(doc, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.cards", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--write",
        type=Path,
        action="append",
        default=[],
        metavar="DOC",
        help="replace what is between the markers in DOC instead of printing the table: the table "
        "in docs/gpu.md, one line per recipe in README.md (repeat for both)",
    )
    args = parser.parse_args(argv)
    made = rows()
    if not args.write:
        print(table(made), end="")
        return 0
    for doc in args.write:
        try:
            write(doc, made)
        except (OSError, ValueError) as exc:
            print(f"cards: {doc}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

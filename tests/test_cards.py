"""The per-card table in docs/gpu.md (python -m verl_gsm8k.cards): regenerated here, it
must equal the doc's; its cells are the preflight's own verdicts (check_memory on the same
config and card); a budget it says fits does fit, and the next one up does not."""

from __future__ import annotations

import re

import pytest
from helpers import ROOT

from verl_gsm8k.cards import table as cards
from verl_gsm8k.common.qwen25 import qwen25_config
from verl_gsm8k.preflight.lines import Report
from verl_gsm8k.preflight.memory import MEMORY_WARN_FRACTION, check_memory

# Composes 9 configs and estimates 36 rows x 3 cards: 20-35 s on the 2 CI cores.
pytestmark = pytest.mark.slow


STALE = "python -m verl_gsm8k.cards --write docs/gpu.md --write README.md"


@pytest.fixture(scope="module")
def made() -> cards.Rows:
    return cards.rows()


def _inside(doc: str, begin: str, end: str) -> str:
    return doc.split(begin, 1)[1].split(end, 1)[0].strip()


def test_docs_gpu_md_holds_the_current_table(made):
    generated = cards.table(made)
    doc = (ROOT / "docs" / "gpu.md").read_text()
    assert _inside(doc, cards.BEGIN, cards.END) == generated.strip(), f"stale table: {STALE}"
    rows = [ln for ln in generated.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) == len(cards.RECIPES) * 4 * len(cards.ATTENTION)


def test_the_readmes_card_lines_are_the_tables(made):
    """README.md's line per recipe says, in words, what the table's cells of the recipe's own
    model say under packed sdpa and flash-attn 2."""
    readme = (ROOT / "README.md").read_text()
    assert _inside(readme, cards.README_BEGIN, cards.README_END) == (
        cards.readme_lines(made).strip()
    ), f"stale card lines: {STALE}"
    lines = cards.readme_lines(made).splitlines()
    assert len(lines) == len(cards.RECIPES)
    cell = made["ppo_lora_qwen2.5-1.5b_gsm8k", "1.5B", "sdpa, packed"][0]  # 24 GB, over 90 %
    assert f"runs at {cell.budget} tokens a micro-batch on 24 GB cards" in lines[2], lines[2]


def lora_cfg(attention: str):
    config_name, _ = cards.RECIPES["ppo_lora_qwen2.5-1.5b_gsm8k"]
    base = cards.recipe_overrides("ppo_lora_qwen2.5-1.5b_gsm8k", config_name)
    one_gpu = ["trainer.n_gpus_per_node=1", "trainer.nnodes=1"]
    return cards.compose(
        ROOT / "configs", config_name, [*base, *one_gpu, *cards.ATTENTION[attention]]
    )


def test_a_cell_is_the_preflights_verdict_on_that_card():
    """The LoRA recipe with flash-attn on a 24 GB card: the cell holds the preflight's own
    heaviest phase and verdict (tests/test_memory.py: it fits, since the H100 probe settled the
    compiled entropy's term)."""
    cfg = lora_cfg("flash-attn 2")
    hf = qwen25_config("1.5B")
    card = cards.CARDS["24 GB"]
    report = Report()
    check_memory(cfg, {"actor": hf}, card, report)
    totals = [float(re.search(r": ~(\d+\.\d) GiB", line)[1]) for line in report.lines]
    cell = cards.row_cells(cfg, hf)[0]
    assert cell.split()[0] == f"{max(totals):.1f}", (cell, totals)
    worst = next(line for line in report.lines if f"~{max(totals):.1f} GiB" in line)
    assert ("[warn]" in worst) == ("tight" in cell) and ("[error]" in worst) == (" no " in cell)


def test_the_budget_said_to_fit_fits_and_twice_it_does_not():
    cfg = lora_cfg("sdpa, packed")
    hf = qwen25_config("1.5B")
    card = cards.CARDS["24 GB"]
    cell = cards.row_cells(cfg, hf)[0]
    match = re.search(r"(?:no|tight) \(actor update; (\d+) tokens fit\)", cell)
    assert match, cell  # packed under sdpa: torch's log-probs make the update the heaviest phase
    budget = int(match[1])
    assert cards.heaviest(cards.phases_at(cfg, hf, budget), card)[0] <= MEMORY_WARN_FRACTION * card
    over = cards.heaviest(cards.phases_at(cfg, hf, 2 * budget), card)[0]
    assert over > MEMORY_WARN_FRACTION * card


def test_write_replaces_only_between_the_markers(tmp_path):
    doc = tmp_path / "gpu.md"
    doc.write_text(f"head\n{cards.BEGIN}\nold\n{cards.END}\ntail\n")
    assert cards.replace_between_markers(doc.read_text(), "new\n") == (
        f"head\n{cards.BEGIN}\nnew\n{cards.END}\ntail\n"
    )
    with pytest.raises(ValueError, match="markers"):
        cards.replace_between_markers("no markers here", "new\n")


def test_write_fills_each_block_a_doc_holds(tmp_path, made):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{cards.README_BEGIN}\nold\n{cards.README_END}\nrest\n")
    cards.write(readme, made)
    assert readme.read_text() == (
        f"# x\n{cards.README_BEGIN}\n{cards.readme_lines(made)}{cards.README_END}\nrest\n"
    )
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    with pytest.raises(ValueError, match="neither"):
        cards.write(plain, made)
    assert plain.read_text() == "no markers\n"

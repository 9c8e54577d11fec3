"""TOKEN_BUDGET=auto (verl_gsm8k/preflight/budget.py, verl_gsm8k/launch/cli.py preflight): where the
recipe's micro-batch budgets would pass 90 % of the card, the launch runs at the largest power of
two that fits, says so, and the user's own budget key or TOKEN_BUDGET=recipe keep what was asked.
The card is a fake nvidia-smi; the model the real Qwen2.5-0.5B shape (its config.json from
common/qwen25.py, the tiny model's tokenizer beside it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import (
    ROOT,
    composed_config,
    fake_nvidia_smi,
    get,
    gpu_recipe_overrides,
    launch_in_process,
    recipe_env,
)

from verl_gsm8k.common.qwen25 import qwen25_config
from verl_gsm8k.preflight import budget
from verl_gsm8k.preflight.compose import compose
from verl_gsm8k.preflight.lines import Report
from verl_gsm8k.preflight.memory import MEMORY_WARN_FRACTION, estimate_phases

CARD_24GB = ("NVIDIA GeForce RTX 4090", 24564)
PACKED = ["+attention=sdpa_packed"]  # what a GPU without flash-attn 2 runs (docs/gpu.md)
ONE_GPU = ["trainer.n_gpus_per_node=1", "trainer.nnodes=1"]
PATHS = ["actor_rollout_ref.model.path=/models/m", "critic.model.path=/models/m"]


def test_choose_writes_the_largest_budget_that_fits(tmp_path):
    recipe = gpu_recipe_overrides("ppo_qwen2.5-0.5b_gsm8k")
    cfg = compose(ROOT / "configs", "gsm8k_ppo", [*recipe, *PATHS, *ONE_GPU, *PACKED])
    hf = {"actor": qwen25_config("0.5B")}
    card = CARD_24GB[1] / 1024
    out, report = tmp_path / "budget", Report()
    chosen = budget.choose(cfg, hf, card, out, report)
    lines = out.read_text().split()
    assert lines == budget.overrides(8192), lines
    assert all(int(get(chosen, key)) == 8192 for key in budget.BUDGET_KEYS)
    phases = estimate_phases(chosen, hf)
    assert max(p.gib(card) for p in phases) <= MEMORY_WARN_FRACTION * card
    twice = estimate_phases(budget.with_budget(cfg, 16384), hf)
    assert max(p.gib(card) for p in twice) > MEMORY_WARN_FRACTION * card
    (line,) = report.lines
    assert "[ok] budget: the recipe's 16384 tokens per micro-batch need ~" in line
    assert "using 8192" in line and "TOKEN_BUDGET=recipe keeps 16384" in line
    # on an 80 GB card the recipe's budget stands: nothing written, nothing said
    out80, report80 = tmp_path / "budget80", Report()
    assert budget.choose(cfg, hf, 81559 / 1024, out80, report80) is cfg
    assert out80.read_text() == "" and report80.lines == []


@pytest.fixture(scope="module")
def qwen_shaped_model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model's tokenizer beside Qwen2.5-0.5B's config.json (the preflight reads the
    shapes; nothing is loaded)."""
    model = tmp_path_factory.mktemp("qwen-0.5b-shape") / "model"
    shutil.copytree(tiny_model_dir, model)
    for weights in model.glob("*.safetensors"):
        weights.unlink()
    config = qwen25_config("0.5B")
    config.architectures = ["Qwen2ForCausalLM"]
    config.to_json_file(model / "config.json")
    return model


@pytest.mark.slow
def test_the_launch_runs_at_the_budget_that_fits_the_card(
    qwen_shaped_model, prepared_gsm8k_dir, tmp_path
):
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [CARD_24GB])

    def dry_run(*args: str, **knobs: str):
        env = recipe_env(  # no checkpoint: the disk check would read this machine's free space
            qwen_shaped_model, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1", SAVE_FREQ="-1"
        )
        env.update(knobs, PATH=f"{bin_dir}:{env['PATH']}")
        return launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env, *args)

    picked = dry_run()  # ATTENTION=auto: packed rows under sdpa on this GPU without flash-attn 2
    assert "attention: sdpa, padding removal on" in picked.stdout, picked.stdout[-3000:]
    assert picked.returncode == 0, picked.stdout[-3000:] + picked.stderr[-3000:]
    assert "preflight: [ok] budget: the recipe's 16384 tokens" in picked.stdout
    cfg = composed_config(picked.stdout)
    for key in budget.BUDGET_KEYS:
        assert get(cfg, key) == 8192, key
    # the user's own budget key wins: the preflight checks it and stops, as without the knob
    own = dry_run("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384")
    assert own.returncode == 1 and "budget:" not in own.stdout, own.stdout[-3000:]
    assert "memory: actor update: ~" in own.stdout and "does not fit" in own.stdout
    # TOKEN_BUDGET=recipe keeps the recipe's budgets
    kept = dry_run(TOKEN_BUDGET="recipe")
    assert kept.returncode == 1 and "budget:" not in kept.stdout, kept.stdout[-3000:]

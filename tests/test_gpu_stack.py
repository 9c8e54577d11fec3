"""The GPU user's stack (.venv-gpu, `make setup-gpu-stack`) on this CPU machine: every check
that needs no GPU; without it these tests skip, and fail under CI=true."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import (
    ROOT,
    composed_config,
    fake_nvidia_smi,
    prepare,
    recipe_env,
    require_path,
    run_recipe,
    write_synthetic_gsm8k,
)

GPU_PYTHON = ROOT / ".venv-gpu" / "bin" / "python"
CARDS = {"80GB": ("NVIDIA H100 80GB HBM3", 81559), "24GB": ("NVIDIA GeForce RTX 4090", 24564)}


@pytest.fixture(scope="module")
def gpu_python() -> Path:
    return require_path(GPU_PYTHON, f"no GPU-stack environment at {GPU_PYTHON} "
                                    "(make setup-gpu-stack)")  # fmt: skip


def under(python: Path, *args: str, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
    )  # fmt: skip


def test_it_is_the_gpu_extras_stack_its_plugins_import_and_the_fallback_loads_a_model(
    gpu_python: Path, tiny_model_dir: Path
):
    code = (
        "import importlib.metadata as m, json\n"
        "print(json.dumps({p: m.version(p) for p in ('verl', 'torch', 'vllm', 'transformers')}))\n"
        "import verl_gsm8k.verl_plugins.attention_fallback as fallback, "
        "verl_gsm8k.verl_plugins.cpu_platform, verl_gsm8k.verl_plugins.register_trainer\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "print(get_trainer_cls('gsm8k').__name__)\n"
        "from transformers import AutoModelForCausalLM\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r}, "
        "attn_implementation='flash_attention_2')\n"
        "print(model.config._attn_implementation)\n"
    )
    out = under(gpu_python, "-c", code)
    assert out.returncode == 0, out.stderr[-3000:]
    versions = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("{")))
    assert versions["verl"] == "0.9.1"
    assert versions["torch"].startswith("2.11.") and versions["vllm"].startswith("0.24.")
    assert versions["transformers"].startswith("5.9."), versions
    assert out.stdout.split()[-2:] == ["TracingTrainer", "sdpa"], out.stdout[-1000:]
    print("GPU stack:", versions)


def test_knobs_reward_and_data_prep(gpu_python: Path, tmp_path: Path):
    bad = under(gpu_python, "-m", "verl_gsm8k.launch.knobs", "ACTOR_LR=fast")
    assert bad.returncode == 2 and "knobs: ACTOR_LR=fast is not" in bad.stderr
    prep = under(gpu_python, "-m", "data_prep.gsm8k", "--source", str(ROOT / "data_prep" /
                 "sample"), "--out-dir", str(tmp_path / "data"))  # fmt: skip
    assert prep.returncode == 0 and (tmp_path / "data" / "test.parquet").is_file(), prep.stderr
    reward = under(gpu_python, "-c", "from rewards.gsm8k import compute_score as f; "
                   "print(f('openai/gsm8k', '6 + 7 = 13\\n#### 13', '13')['score'])")  # fmt: skip
    assert reward.stdout.strip() == "1.0", reward.stderr


# Recipes on the simulated card each is sized for: PPO on verl's legacy trainer (LoRA) and its v1
# trainer (smoke), GRPO with verl's tool loop; the PPO and GRPO recipes' configs on the CPU stack:
# tests/test_recipes.py::test_every_recipe_passes_its_dry_run.
CARD_OF = {
    "ppo_lora_qwen2.5-1.5b_gsm8k": "24GB",
    "smoke_tiny": "24GB",
    "grpo_calculator_qwen2.5-0.5b_gsm8k": "80GB",  # on rows written for the calculator
}


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "card"), list(CARD_OF.items()))
def test_every_recipe_dry_runs_on_a_simulated_gpu(
    gpu_python: Path, tiny_model_dir, prepared_gsm8k_dir, tmp_path, recipe: str, card: str
):
    data, extra = prepared_gsm8k_dir, {}
    if "calculator" in recipe:  # the tiny tokenizer spells the tools block out (~640 tokens)
        data = prepare(write_synthetic_gsm8k(tmp_path / "src"), tmp_path / "rows", "--tools",
                       "calculator")  # fmt: skip
        extra = {"MAX_PROMPT_LENGTH": "1024"}
    env = recipe_env(tiny_model_dir, data, tmp_path / "runs", DRY_RUN="1",
                     PYTHON=str(gpu_python), TRAIN_BATCH_SIZE="16",
                     PPO_MINI_BATCH_SIZE="8", **extra)  # fmt: skip
    env["PATH"] = f"{fake_nvidia_smi(tmp_path / 'bin', [CARDS[card]])}:{env['PATH']}"
    result = run_recipe(recipe, env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "preflight: passed" in result.stdout
    assert f"preflight: [ok] gpu: 1 x {CARDS[card][0]}" in result.stdout
    if "calculator" in recipe:  # verl composes its tool loop
        from verl_gsm8k.tools import config_path

        rollout = composed_config(result.stdout)["actor_rollout_ref"]["rollout"]
        assert rollout["multi_turn"]["tool_config_path"] == str(config_path("calculator"))
        assert rollout["multi_turn"]["max_assistant_turns"] == 3 and rollout["n"] == 5
        assert rollout["agent"]["default_agent_loop"] == "tool_agent"
        said = "tools: train file train.parquet: every row runs verl's tool_agent loop"
        assert said in result.stdout


def test_vllm_serve_flags_parse_with_vllms_own_parser(gpu_python: Path, tiny_model_dir: Path):
    code = (
        "import json\n"
        "import vllm.platforms as platforms\n"
        "from vllm.platforms.interface import UnspecifiedPlatform\n"
        "class Parsing(UnspecifiedPlatform):\n"
        "    device_type = 'cuda'\n"
        "platforms.current_platform = Parsing()\n"
        "from verl_gsm8k.evaluate.server import vllm_serve_command\n"
        "from vllm.entrypoints.openai.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "from verl_gsm8k.evaluate.tool_mode import VLLM_TOOL_ARGS\n"
        f"cmd = vllm_serve_command('vllm', {str(tiny_model_dir)!r}, 8123, 'step-0', "
        "['--dtype', 'float32', '--max-model-len', '1024', *VLLM_TOOL_ARGS])\n"
        "parser = make_arg_parser(FlexibleArgumentParser())\n"
        "args = parser.parse_args(cmd[2:])\n"
        "print(json.dumps({k: getattr(args, k) for k in ('model_tag', 'host', 'port', "
        "'served_model_name', 'dtype', 'max_model_len', 'enable_auto_tool_choice', "
        "'tool_call_parser')}))\n"
        "try:\n"
        "    parser.parse_args([*cmd[2:], '--no-such-flag', '1'])\n"
        "except SystemExit as refused:\n"
        "    print('refused', refused.code)\n"
    )
    out = under(gpu_python, "-c", code)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    parsed = json.loads(lines[-2])
    assert parsed["model_tag"] == str(tiny_model_dir) and parsed["host"] == "127.0.0.1"
    assert parsed["port"] == 8123 and parsed["served_model_name"] == ["step-0"]
    assert parsed["dtype"] == "float32" and parsed["max_model_len"] == 1024
    assert parsed["enable_auto_tool_choice"] and parsed["tool_call_parser"] == "hermes"
    assert lines[-1] == "refused 2"


@pytest.mark.slow
def test_a_checkpoint_reshards_under_the_gpu_stack(
    gpu_python: Path, tiny_model_dir: Path, tmp_path: Path
):
    from test_reshard import ranks, resharded_and_resumed

    saved = tmp_path / "ws2"
    ranks("save", tiny_model_dir, saved, 2, python=gpu_python)
    resharded_and_resumed(saved, 2, 1, tiny_model_dir, tmp_path, python=gpu_python)

"""PPO with a LoRA actor trains on the CPU too (DEVICE=cpu, the tiny model, the shipped sample), and
its merged model carries the adapter exactly (W + B·A·alpha/r, computed here independently of the
merge). GRPO's training on the CPU (no critic, KL as a loss) is proven on the learning run of
tests/learn_runs.py (test_learn_cpu.py), which composes the same config
(configs/gsm8k_grpo.yaml)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT
from test_train_cpu import ONE_SMALL_STEP, cpu_env, launch, output

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_ppo_lora_trains_and_its_merge_carries_the_adapter(tmp_path: Path):
    import torch
    from safetensors.torch import load_file

    env = cpu_env(
        tmp_path / "home", tmp_path / "runs", LORA_RANK="8", LORA_ALPHA="16", ACTOR_LR="1e-2",
        **ONE_SMALL_STEP,
    )  # fmt: skip
    run = launch("ppo_lora_qwen2.5-1.5b_gsm8k", env, "data.val_max_samples=8")
    assert run.result.returncode == 0, output(run)[-6000:]
    run_dir = tmp_path / "runs" / "ppo_lora_qwen2.5-1.5b_gsm8k"
    assert (run_dir / "global_step_1" / "critic").is_dir()  # PPO: a full critic beside LoRA
    meta = json.loads((run_dir / "global_step_1" / "actor" / "lora_train_meta.json").read_text())
    assert meta["r"] == 8 and meta["lora_alpha"] == 16

    target = tmp_path / "merged"
    merged_run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "merge.sh"), str(run_dir), str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert merged_run.returncode == 0, merged_run.stdout[-3000:] + merged_run.stderr[-3000:]
    manifest = json.loads((target / "merge_manifest.json").read_text())
    assert manifest["lora"]["merged"] is True
    assert manifest["lora"]["rank"] == 8 and manifest["lora"]["alpha"] == 16

    # Independently: base weights + B @ A * alpha / r, from the adapter verl saved.
    base = load_file(
        tmp_path / "home" / ".cache" / "verl-gsm8k" / "tiny-qwen2" / "model.safetensors"
    )
    adapter = load_file(target / "lora_adapter" / "adapter_model.safetensors")
    merged = {}
    for shard in target.glob("model*.safetensors"):
        merged.update(load_file(shard))
    checked = 0
    for key_a in (k for k in adapter if k.endswith("lora_A.weight")):
        module = key_a.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        a = adapter[key_a].float()
        b = adapter[key_a.replace("lora_A", "lora_B")].float()
        expected = base[f"{module}.weight"].float() + b @ a * (16 / 8)
        got = merged[f"{module}.weight"].float()
        assert not torch.equal(got, base[f"{module}.weight"].float()), module
        assert torch.allclose(got, expected.to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2), (
            module
        )
        checked += 1
    assert checked >= 14  # q, k, v, o, gate, up, down in each of the 2 layers

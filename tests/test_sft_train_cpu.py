"""verl's real SFT loop on this CPU, end to end: `DEVICE=cpu bash recipes/sft_qwen2.5-0.5b_gsm8k.sh`
trains the tiny model on synthetic transcripts; a SIGTERM to every process while step 4 trains
saves step 4 and exits 5, the same command resumes and ends after step 6, saved, its step-5
validation loss under gsm8k_sft.stop_val_loss; the merged model moved away from the start and the
PPO preflight accepts it as MODEL_PATH.
"""

import json
import math
import re
import sys
import time
from pathlib import Path

import killing
import pause_points
import pytest
from helpers import (
    ROOT,
    assert_loads_as_torch,
    merge_run,
    prepare_sft,
    recipe_env,
    run_recipe,
    write_synthetic_gsm8k,
)

from verl_gsm8k.launch.plan import bare_overrides as recipe_overrides
from verl_gsm8k.preflight import cli as preflight

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RECIPE = "sft_qwen2.5-0.5b_gsm8k"
STEPS = 6  # 96 problems in batches of 32, 3 steps an epoch: of 8, the run ends after step 6
STOP_AT = 4  # the step in flight when the first launch is stopped: the second epoch's first
EARLY_END = ("gsm8k_sft.stop_val_loss=100",)  # any loss: the validation of step 5 ends the run


def metric_steps(run_dir) -> dict[int, dict[str, float]]:
    """Every step's metrics over the run's launches (one file each); a step trained twice fails."""
    steps: dict[int, dict[str, float]] = {}
    for path in sorted((run_dir / "metrics").glob("metrics-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "train/loss" in record["data"]:
                assert record["step"] not in steps, f"step {record['step']} trained twice"
            steps.setdefault(record["step"], {}).update(record["data"])
    return steps


def metrics_file(run_dir, output: str):
    """The metrics file the launcher names in its output."""
    (path,) = re.findall(r"recipe: metrics -> (\S+)", output)
    return Path(path)


def test_sft_recipe_trains_on_the_cpu_and_merges_into_a_ppo_model_path(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    data = prepare_sft(write_synthetic_gsm8k(tmp_path / "source", 96, 32), tmp_path / "sft")
    run_dir = tmp_path / "run"
    env = recipe_env(tiny_model_dir, data, tmp_path / "runs", DEVICE="cpu", TRAIN_BATCH_SIZE="32",
                     SFT_LR="3e-3", TOTAL_TRAINING_STEPS="8", SAVE_FREQ="8", TEST_FREQ="5",
                     RUN_DIR=str(run_dir))  # fmt: skip
    for name in [k for k in env if k.startswith("VERL_")]:
        del env[name]  # the recipe sets what verl needs on a CPU
    start = time.monotonic()

    # held before step 4 trains, SIGTERM to every process of the first launch
    paused = tmp_path / "paused"
    held = pause_points.env(f"sft_step:{STOP_AT}", paused, env)
    first = killing.start(RECIPE, held, tmp_path / "first.log", *EARLY_END)
    killing.wait_until(f"step {STOP_AT} held", paused.exists, first, timeout=300)
    signalled = killing.term_all(first)
    paused.unlink()  # the step goes on, the signal already there
    code = killing.finish(first, timeout=200)
    output = first.output()
    assert code == 5, output[-6000:]
    assert "device: cpu (DEVICE=cpu)" in output and "preflight: passed" in output
    assert f"stop requested (SIGTERM): saving step {STOP_AT}, then stopping" in output
    assert f"recipe: stopped on SIGTERM after saving step {STOP_AT}" in output
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == str(STOP_AT)
    assert len(signalled) >= 2 and not killing.session(first), killing.names(first)
    stamp = (run_dir / f"global_step_{STOP_AT}" / "launch_stamp.txt").read_text().strip()
    assert (run_dir / "metrics" / f"metrics-{stamp}.jsonl").is_file()
    assert_loads_as_torch(run_dir)  # the SFT checkpoint, by the checked load: bit for bit

    # the same command resumes from step 4, validates step 5 and ends after step 6
    result = run_recipe(RECIPE, env, *EARLY_END, timeout=400)
    trained_s = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    second = {
        json.loads(line)["step"] for line in metrics_file(run_dir, output).read_text().splitlines()
    }
    assert second == set(range(STOP_AT + 1, STEPS + 1)), second  # resumed after step 4
    assert f"validation loss under 100: saving step {STEPS}, then stopping" in output

    # the checkpoint: the SFT trainer's layout, the last step
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)
    step_dir = run_dir / f"global_step_{STEPS}"
    assert (step_dir / "model_world_size_1_rank_0.pt").is_file()
    assert not (step_dir / "actor").exists()

    # the metrics file of this launch: the loss of every step, falling; validation at the end
    steps = metric_steps(run_dir)
    losses = [steps[step]["train/loss"] for step in range(1, STEPS + 1)]
    assert all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < 0.8 * losses[0], losses
    assert math.isfinite(steps[5]["val/loss"])
    lrs = [steps[step]["train/lr"] for step in range(1, STEPS + 1)]
    assert 0.9 * 3e-3 < max(lrs) <= 3e-3  # SFT_LR is the peak of the cosine schedule
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < max(lrs)

    # the run directory -> a Hugging Face model, said to be the SFT model of the last step
    start = time.monotonic()
    target = tmp_path / "merged"
    merge = merge_run(run_dir, target, env, timeout=300)
    merged_s = time.monotonic() - start
    assert f"merge: SFT model of step {STEPS} (world size 1)" in merge.stdout
    manifest = json.loads((target / "merge_manifest.json").read_text())
    assert (manifest["role"], manifest["step"]) == ("sft", STEPS)

    # transformers loads it, and training moved its weights away from the start
    model = AutoModelForCausalLM.from_pretrained(target)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    base = load_file(tiny_model_dir / "model.safetensors")
    merged: dict = {}
    for shard in target.glob("*.safetensors"):
        merged.update(load_file(shard))
    common = sorted(set(base) & set(merged))
    assert len(common) >= 20
    moved = [k for k in common if not torch.equal(base[k].to(merged[k].dtype), merged[k])]
    assert len(moved) >= len(common) // 2, f"only {len(moved)} of {len(common)} tensors moved"

    # the PPO recipes' preflight passes on it as MODEL_PATH
    ppo_env = recipe_env(target, prepared_gsm8k_dir, tmp_path / "ppo-runs", TRACE_SAMPLES="0")
    overrides = recipe_overrides("gsm8k_ppo", ppo_env)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERL_USE_EXTERNAL_MODULES", "verl_gsm8k.verl_plugins.register_trainer")
        report = preflight.run("gsm8k_ppo", ROOT / "configs", overrides, None)
    assert report.errors == 0, "\n".join(report.lines)
    assert any("[ok] model: actor: verl loads qwen2" in line for line in report.lines)
    print(
        f"\nSFT: {STEPS} steps trained in {trained_s:.0f} s (two launches, stopped after step "
        f"{STOP_AT}), merged in "
        f"{merged_s:.0f} s; loss {losses[0]:.2f} -> {losses[-1]:.2f}",
        file=sys.stderr,
    )

"""PPO with a LoRA actor trains on the CPU (DEVICE=cpu, the tiny model, the shipped sample) on
verl's legacy trainer, guarded and traced as the v1 recipes are: a NaN reward stops the run before
its step is saved, every step is traced, and the kept best merges with the adapter exactly.

One launch: the legacy trainer's stop and resume are proven by tests/test_guard_trainer.py, a
SIGTERM to every process by tests/test_slurm_nodes_cpu.py, GRPO by tests/test_learn_cpu.py."""

import json
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, assert_loads_as_torch
from test_train_cpu import NAN_REWARD, ONE_SMALL_STEP, TRAIN_TIMEOUT_S, cpu_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_ppo_lora_is_guarded_traced_and_its_best_merge_carries_the_adapter(tmp_path: Path):
    """3 steps; step 3's reward turns NaN: step 3 unsaved, exit 4, checkpoint 2 sick, the tracker
    names 1; every step traced; ``merge --best`` merges step 1 (accuracy stays 0, so the first
    validated step stays the best)."""
    import pause_points
    import torch
    from killing import finish, start, wait_until
    from safetensors.torch import load_file

    from verl_gsm8k.common.run_dir import read_best, read_trips

    marker, reward, held = tmp_path / "nan-now", tmp_path / "nan_reward.py", tmp_path / "held"
    reward.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'rewards')!r})\n"
                      + NAN_REWARD.format(marker=str(marker)))  # fmt: skip
    env = cpu_env(
        tmp_path / "home", tmp_path / "runs", LORA_RANK="8", LORA_ALPHA="16", ACTOR_LR="1e-2",
        **dict(ONE_SMALL_STEP, TOTAL_TRAINING_STEPS="3"), REWARD_FILE=str(reward),
    )  # fmt: skip
    env = pause_points.env("rollout:3", held, env)  # held before step 3's rollout
    args = ("data.val_max_samples=8", "trainer.val_before_train=False")
    run_dir = tmp_path / "runs" / "ppo_lora_qwen2.5-1.5b_gsm8k"
    tracker = run_dir / "latest_checkpointed_iteration.txt"

    running = start("ppo_lora_qwen2.5-1.5b_gsm8k", env, tmp_path / "launch.log", *args)
    wait_until("step 3's rollout held", held.exists, running, TRAIN_TIMEOUT_S)
    assert tracker.read_text().strip() == "2" and (read_best(run_dir) or {}).get("step") == 1
    marker.touch()  # step 3's rewards are NaN
    held.unlink()
    assert finish(running, TRAIN_TIMEOUT_S) == 4, running.output()[-6000:]
    trip = next(t for t in read_trips(run_dir) if t["action"] == "stop")
    assert (trip["step"], trip["sick_checkpoint"], trip["last_healthy_checkpoint"]) == (3, 2, 1)
    assert not (run_dir / "global_step_3").exists() and tracker.read_text().strip() == "1"
    assert (run_dir / "global_step_2" / "watchdog_sick.json").is_file()
    assert (read_best(run_dir) or {}).get("step") == 1
    assert_loads_as_torch(run_dir)  # the LoRA checkpoint, by the checked load: bit for bit
    meta = json.loads((run_dir / "global_step_1" / "actor" / "lora_train_meta.json").read_text())
    assert meta["r"] == 8 and meta["lora_alpha"] == 16
    # traced: each step's chosen responses, with the critic's values and the KL in the reward
    for step in (1, 2):
        lines = [json.loads(line) for line in (run_dir / "trace" / f"{step}.jsonl").open()]
        samples = [line for line in lines if line["kind"] == "sample"]
        assert lines[0]["kind"] == "step" and samples, lines[0]
        for sample in samples:
            width = len(sample["response"]["ids"])
            for name in ("old_log_prob", "ref_log_prob", "value", "advantage", "kl", "entropy"):
                assert len(sample["per_token"][name]) == width, (step, name, sample["absent"])
            assert sample["score"] == pytest.approx(sum(sample["per_token"]["score"]), abs=1e-5)
    head = json.loads((run_dir / "trace" / "3.jsonl").open().readline())  # the sick step traced
    assert head["metrics"]["critic/score/mean"] is None and head["batch"]["groups"]["count"] == 8

    target = tmp_path / "merged"
    merged_run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "merge.sh"), str(run_dir), str(target), "--best"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert merged_run.returncode == 0, merged_run.stdout[-3000:] + merged_run.stderr[-3000:]
    manifest = json.loads((target / "merge_manifest.json").read_text())
    assert manifest["step"] == 1, manifest
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
        # the adapter trained: B starts at zero (an untrained adapter merges to the base exactly)
        assert b.abs().max() > 0, f"{module}: lora_B is still zero"
        assert torch.allclose(got, expected.to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2), (
            module)  # fmt: skip
        checked += 1
    assert checked >= 14  # q, k, v, o, gate, up, down in each of the 2 layers

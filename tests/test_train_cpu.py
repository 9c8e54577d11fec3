"""verl's real PPO loop on this CPU, end to end: `bash recipes/smoke_tiny.sh` trains (vLLM CPU
rollouts, our reward, reference, critic, GAE, FSDP2 updates, weight sync, checkpoint), then the
report, the merge, the evaluation and a resume run on what it wrote.

The launch sets nothing but a fresh HOME and run root (so the tiny model and the shipped GSM8K
sample are built on first use, as for a new user) and a high actor learning rate (so training
visibly moves the weights). One training run at a time: the tests of this module share it, in
file order, and the resume test comes last because it extends the same run directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT, USER_KNOBS, merge_run, require_path, run_recipe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TRAIN_TIMEOUT_S = 1200
FAKE_KEY = "wandb-fake-key-0123456789abcdef"
EVAL_PYTHON = ROOT / ".venv-eval" / "bin" / "python"
# A run root with a space and a quote: paths users really have reach verl intact.
RUNS_DIRNAME = "run's dir"
# One short step on the CPU, for the recipes other than smoke_tiny (and smoke_tiny on two nodes).
ONE_SMALL_STEP = dict(
    DEVICE="cpu",
    TRAIN_BATCH_SIZE="8",
    PPO_MINI_BATCH_SIZE="4",
    MAX_RESPONSE_LENGTH="32",
    TOTAL_TRAINING_STEPS="1",
    SAVE_FREQ="1",
    TEST_FREQ="1",
)


@dataclass
class Launch:
    result: subprocess.CompletedProcess
    seconds: float


@dataclass
class Smoke:
    home: Path
    run_dir: Path
    env: dict[str, str]
    first: Launch


def cpu_env(home: Path, runs_root: Path, **knobs: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in USER_KNOBS and not k.startswith(("VERL_", "GSM8K_", "MODEL_", "RAY_"))
    }
    env.update(HOME=str(home), RUNS_ROOT=str(runs_root), PYTHON=sys.executable)
    env.pop("XDG_CACHE_HOME", None)
    env.pop("CACHE_DIR", None)
    env.update(knobs)
    return env


def launch(recipe: str, env: dict[str, str], *args: str, timeout: int = TRAIN_TIMEOUT_S) -> Launch:
    start = time.monotonic()
    result = run_recipe(recipe, env, *args, timeout=timeout)
    return Launch(result, time.monotonic() - start)


def output(launch_: Launch) -> str:
    return launch_.result.stdout + launch_.result.stderr


def metric_segments(run_dir: Path) -> list[dict[int, dict[str, float]]]:
    """One {step: metrics} per launch, oldest first (verl's file logger, one file per launch)."""
    segments = []
    for path in sorted((run_dir / "metrics").glob("metrics-*.jsonl")):
        steps: dict[int, dict[str, float]] = {}
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(record["step"], {}).update(record["data"])
        segments.append(steps)
    return segments


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Smoke:
    base = tmp_path_factory.mktemp("cpu-train")
    # wandb offline beside the file logger (no key needed, no network); a key in the
    # environment must still never be printed
    env = cpu_env(
        base / "home",
        base / RUNS_DIRNAME,
        ACTOR_LR="1e-2",
        LOGGER="console,file,wandb",
        WANDB_MODE="offline",
        WANDB_API_KEY=FAKE_KEY,
    )
    first = launch("smoke_tiny", env)
    assert first.result.returncode == 0, output(first)[-6000:]
    return Smoke(base / "home", base / RUNS_DIRNAME / "smoke_tiny", env, first)


def test_smoke_trains_two_ppo_steps_and_checkpoints(smoke: Smoke):
    out = smoke.first.result.stdout
    assert "device: cpu (DEVICE=auto)" in out
    assert "TINY RANDOM model" in out and "accuracy means nothing" in out
    cache = smoke.home / ".cache" / "verl-gsm8k"
    assert (cache / "tiny-qwen2" / "config.json").is_file()  # built offline on first use
    assert (cache / "gsm8k-sample" / "train.parquet").is_file()  # the shipped sample, prepared
    assert "preflight: passed" in out
    assert (smoke.run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    for role in ("actor", "critic"):
        shard = smoke.run_dir / "global_step_2" / role / "model_world_size_1_rank_0.pt"
        assert shard.is_file() and shard.stat().st_size > 100_000


def test_wandb_offline_run_holds_the_file_loggers_metrics_and_no_key(smoke: Smoke):
    from wandb_offline import history

    out = output(smoke.first)
    (run_file,) = (smoke.run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    assert f"wandb offline: this run is logged under {smoke.run_dir}/wandb/offline-run-*" in out
    assert f"wandb sync {smoke.run_dir}/wandb/offline-run-*" in out
    logged = history(run_file)
    (steps,) = metric_segments(smoke.run_dir)
    assert sorted(logged) == sorted(steps) == [0, 1, 2]
    for step, metrics in steps.items():
        shared = set(metrics) & set(logged[step])
        assert len(shared) >= 0.9 * len(metrics), sorted(set(metrics) - set(logged[step]))[:10]
        for key in shared:
            assert logged[step][key] == pytest.approx(metrics[key], rel=1e-6), (step, key)
    texts = [out] + [
        p.read_text(errors="replace")
        for p in smoke.run_dir.rglob("*")
        if p.is_file() and p.suffix in (".log", ".jsonl", ".yaml", ".json", ".txt")
    ]
    assert not [t for t in texts if FAKE_KEY in t]


def test_metrics_validation_at_0_and_2_training_at_1_and_2(smoke: Smoke):
    (steps,) = metric_segments(smoke.run_dir)
    val = "val-core/openai/gsm8k/acc/mean@1"
    assert sorted(s for s, m in steps.items() if val in m) == [0, 2]
    for key in ("actor/pg_loss", "critic/vf_loss", "critic/score/mean", "actor/ppo_kl"):
        assert sorted(s for s, m in steps.items() if key in m) == [1, 2], key
    # entropy is logged without calculate_entropy (the v1 trainer computes it anyway)
    assert all("actor/entropy" in steps[s] for s in (1, 2))
    # the critic's token budget reached the run (critic.ppo_infer_max_token_len_per_gpu)
    log = next((smoke.run_dir / "logs").glob("console-*.log")).read_text()
    assert "'ppo_infer_max_token_len_per_gpu': 16384" in log
    # OUR reward ran: its diagnostics (not returned by verl's built-in scorer) are averaged
    for key in ("pred_found", "format", "clipped", "hedged"):
        assert f"val-aux/openai/gsm8k/{key}/mean@1" in steps[0], key
    # the weights vLLM generated with match the trained actor (the weight sync works)
    assert steps[2]["training/rollout_actor_probs_pearson_corr"] > 0.99


def test_rollout_and_validation_dumps(smoke: Smoke):
    for name in ("1.jsonl", "2.jsonl"):
        rows = [json.loads(x) for x in (smoke.run_dir / "rollouts" / name).read_text().splitlines()]
        assert len(rows) == 16 and {"input", "output", "score", "gts"} <= set(rows[0])
    for name in ("0.jsonl", "2.jsonl"):
        text = (smoke.run_dir / "validation" / name).read_text().splitlines()
        row = json.loads(text[0])
        assert len(text) == 24 and "pred_found" in row and "hedged" in row


def test_report_reads_the_real_run(smoke: Smoke, tmp_path: Path):
    out = tmp_path / "report"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_gsm8k.report",
            str(smoke.run_dir),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"]["first"] == 0 and summary["steps"]["last"] == 2
    # verl 0.9.1's role-prefixed engine metrics (actor/perf/max_memory_allocated_gb, ...)
    assert {"actor", "critic"} <= set(summary["memory"]["gpu"])
    assert summary["memory"]["gpu"]["actor"]["allocated"]["key"].startswith("actor/perf/")
    assert not [f for f in summary["health"] if "mismatch" in json.dumps(f)]
    html = (out / "report.html").read_text()
    assert "Rollout vs training: Pearson correlation" in html


def test_merge_carries_the_training(smoke: Smoke, tmp_path: Path):
    import torch
    from safetensors.torch import load_file

    target = tmp_path / "merged"
    merge_run(smoke.run_dir, target, smoke.env)
    base = load_file(smoke.home / ".cache" / "verl-gsm8k" / "tiny-qwen2" / "model.safetensors")
    merged = {}
    for shard in target.glob("*.safetensors"):
        merged.update(load_file(shard))
    common = sorted(set(base) & set(merged))
    assert len(common) >= 20
    moved = [k for k in common if not torch.equal(base[k].float(), merged[k].float())]
    assert len(moved) >= len(common) // 2, f"only {len(moved)} of {len(common)} tensors moved"
    manifest = json.loads((target / "merge_manifest.json").read_text())
    assert manifest["step"] == 2 and manifest["role"] == "actor"


def test_eval_compares_base_and_merged(smoke: Smoke, tmp_path: Path):
    require_path(EVAL_PYTHON, f"no EvalScope environment at {EVAL_PYTHON} (make setup)")
    merged = tmp_path / "merged"
    merge_run(smoke.run_dir, merged, smoke.env)
    base = smoke.home / ".cache" / "verl-gsm8k" / "tiny-qwen2"
    out = tmp_path / "eval"
    env = dict(smoke.env, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "eval.sh"), "--model", f"base={base}",
         "--model", f"ppo={merged}", "--data", str(ROOT / "data_prep" / "sample"),
         "--modes", "training", "--limit", "3", "--max-tokens", "16",
         "--backend", "transformers", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = (out / "comparison.md").read_text()
    assert "| base (baseline) | training |" in table and "| ppo | training |" in table
    rows = json.loads((out / "comparison.json").read_text())["results"]
    assert {r["model"] for r in rows} == {"base", "ppo"} and all(r["n"] == 3 for r in rows)


def test_planted_mistake_stops_a_cpu_run_in_the_preflight(smoke: Smoke, tmp_path: Path):
    env = dict(smoke.env, RUNS_ROOT=str(tmp_path / "runs"), REWARD_FILE=str(tmp_path / "no.py"))
    stopped = launch("smoke_tiny", env, timeout=180)
    assert stopped.result.returncode == 1
    assert stopped.seconds < 60
    errors = [line for line in stopped.result.stdout.splitlines() if "[error]" in line]
    assert len(errors) == 1 and str(tmp_path / "no.py") in errors[0]
    assert "device: cpu" in stopped.result.stdout  # the preflight checked the CPU config
    assert "Started a local Ray instance" not in output(stopped)  # stopped before Ray
    assert not (tmp_path / "runs").exists()


def test_relaunch_resumes_to_step_4_and_keeps_max_ckpt(smoke: Smoke):
    """Last: it extends the shared run directory."""
    env = dict(smoke.env, TOTAL_TRAINING_STEPS="4", MAX_CKPT_TO_KEEP="1")
    second = launch("smoke_tiny", env)
    assert second.result.returncode == 0, output(second)[-6000:]
    log = output(second)
    assert "global_step_2" in log and "Training from scratch" not in log
    first_seg, second_seg = metric_segments(smoke.run_dir)
    trained = sorted(s for s, m in second_seg.items() if "actor/pg_loss" in m)
    assert trained == [3, 4], "steps 1-2 must not be trained again"
    assert (smoke.run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    kept = sorted(p.name for p in smoke.run_dir.glob("global_step_*"))
    assert kept == ["global_step_4"], kept  # verl alone would have kept global_step_2 too
    # the report stitches both launches: steps 0-4, each once
    result = subprocess.run(
        [sys.executable, "-m", "verl_gsm8k.report", str(smoke.run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((smoke.run_dir / "report" / "summary.json").read_text())
    assert summary["steps"]["first"] == 0 and summary["steps"]["last"] == 4
    assert summary["steps"]["count"] == 5

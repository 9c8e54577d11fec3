"""verl's real PPO loop on this CPU, end to end: `bash recipes/smoke_tiny.sh` trains, then the
report, the merge, the evaluation and a resume run on what it wrote.

A fresh HOME (the tiny model and GSM8K sample built on first use) and a high actor learning rate
(training visibly moves the weights). The tests share one run in file order; the kill test is last.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from helpers import (
    ROOT,
    USER_KNOBS,
    assert_loads_as_torch,
    launch_in_process,
    merge_run,
    run_recipe,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TRAIN_TIMEOUT_S = 1200
FAKE_KEY = "wandb-fake-key-0123456789abcdef"
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
    # the grace a SIGTERM gives the trainer, said at launch (guard/stop.py): a fresh run directory
    assert "recipe: STOP_GRACE_S=30 s (the default; nothing measured in this run directory" in out
    assert (smoke.run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    for role in ("actor", "critic"):
        shard = smoke.run_dir / "global_step_2" / role / "model_world_size_1_rank_0.pt"
        assert shard.is_file() and shard.stat().st_size > 100_000
    assert assert_loads_as_torch(smoke.run_dir) >= 7  # the checked load, bit for bit


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
    from verl_gsm8k.report import cli as report

    out = tmp_path / "report"
    assert report.main([str(smoke.run_dir), "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"]["first"] == 0 and summary["steps"]["last"] == 2
    # verl 0.9.1's role-prefixed engine metrics (actor/perf/max_memory_allocated_gb, ...)
    assert {"actor", "critic"} <= set(summary["memory"]["gpu"])
    assert summary["memory"]["gpu"]["actor"]["allocated"]["key"].startswith("actor/perf/")
    assert not [f for f in summary["health"] if "mismatch" in json.dumps(f)]
    html = (out / "report.html").read_text()
    assert "Rollout vs training: Pearson correlation" in html


def test_the_saved_actor_carries_the_training(smoke: Smoke):
    import torch
    from safetensors.torch import load_file

    from verl_gsm8k.common.checkpoint_files import load

    base = load_file(smoke.home / ".cache" / "verl-gsm8k" / "tiny-qwen2" / "model.safetensors")
    # the checkpoint's own weights (fp32 here): at world size 1 each DTensor's local part is whole
    shard = load(smoke.run_dir / "global_step_2" / "actor" / "model_world_size_1_rank_0.pt")
    trained = {name: tensor.to_local() for name, tensor in shard.items()}
    common = sorted(set(base) & set(trained))
    assert len(common) >= 20
    moved = [k for k in common if not torch.equal(base[k].to(trained[k].dtype), trained[k])]
    assert len(moved) >= len(common) // 2, f"only {len(moved)} of {len(common)} tensors trained"


def test_planted_mistake_stops_a_cpu_run_in_the_preflight(smoke: Smoke, tmp_path: Path):
    env = dict(smoke.env, RUNS_ROOT=str(tmp_path / "runs"), REWARD_FILE=str(tmp_path / "no.py"))
    stopped = launch_in_process("smoke_tiny", env)  # fails if it reached verl's start
    assert stopped.returncode == 1
    errors = [line for line in stopped.stdout.splitlines() if "[error]" in line]
    assert len(errors) == 1 and str(tmp_path / "no.py") in errors[0]
    assert "device: cpu" in stopped.stdout  # the preflight checked the CPU config
    assert not (tmp_path / "runs").exists()


NAN_REWARD = """
import os
from pathlib import Path

from gsm8k import compute_score as gsm8k_score  # rewards/gsm8k.py, on sys.path below

MARKER = Path({marker!r})


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    # a reward that turns NaN once the test plants the marker (after the preflight's own check)
    if MARKER.exists():
        return float("nan")
    return gsm8k_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
"""


def test_killed_and_relaunched_the_run_ends_whole(smoke: Smoke, tmp_path: Path):
    """Last: it extends the smoke run to step 7, a time save every step, MAX_CKPT_TO_KEEP=2.

    1. SIGKILL to the launcher alone mid-save of step 5: the relaunch stops what is left;
    2. the newest two whole steps damaged: the relaunch falls back past them, a second launch
       refuses in one line, a real actor worker loads through the check; steps 3-5 retrained,
       then a NaN reward: step 6 unsaved, exit 4, checkpoint 5 marked sick, 4 tracked and merged.
    SIGTERM paths: tests/test_slurm_nodes_cpu.py.
    """
    import pause_points
    from killing import finish, logged_steps, newest_metrics, start, wait_until

    from verl_gsm8k.common import procs
    from verl_gsm8k.common.run_dir import read_best, read_trips
    from verl_gsm8k.launch import reap
    from verl_gsm8k.report import cli as report
    from verl_gsm8k.resume.verify import problem

    def open_files(pid: int) -> set[str]:
        try:
            return {f.path for f in psutil.Process(pid).open_files()}
        except psutil.Error:
            return set()

    run_dir, roles = smoke.run_dir, ("actor", "critic")
    tracker = run_dir / "latest_checkpointed_iteration.txt"
    marker = tmp_path / "nan-now"
    reward = tmp_path / "nan_reward.py"
    reward.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'rewards')!r})\n"
                      + NAN_REWARD.format(marker=str(marker)))  # fmt: skip
    # every checkpoint a time save (SAVE_FREQ past the run's end); the preflight ran in the smoke
    # fixture's launch (on the CPU it picks no token budget: the launches are the same without it)
    env = dict(smoke.env, TOTAL_TRAINING_STEPS="7", SAVE_FREQ="100", SAVE_EVERY_MIN="0.001",
               TEST_FREQ="4", MAX_CKPT_TO_KEEP="2", STOP_GRACE_S="600",
               REWARD_FILE=str(reward), RESUME="force", SKIP_PREFLIGHT="1")  # fmt: skip
    # the tiny model's KL nears the ceiling by step 9: off, so only the NaN trips
    quick = ("trainer.val_before_train=False", "gsm8k_guard.watchdog.kl_ceiling=0")
    figures: list[str] = []
    limit = float(TRAIN_TIMEOUT_S)

    def begin(name: str, environment: dict[str, str] = env):
        before = set((run_dir / "metrics").glob("metrics-*.jsonl"))
        running = start("smoke_tiny", environment, tmp_path / f"{name}.log", *quick)
        return running, lambda: newest_metrics(run_dir, before)

    def steps_of(metrics) -> set[int]:
        path = metrics()
        return logged_steps(path) if path else set()

    # 1. SIGKILL in the save of step 5: the trainer holds between the actor's shards and the
    #    critic's (tests/pause_points.py), so the kill lands mid-save every time
    paused = tmp_path / "paused-mid-save"
    hold = pause_points.env("save:5:after_actor", paused, env)
    r1, m1 = begin("kill-mid-save", hold)
    first = wait_until("a step logged", lambda: bool(steps_of(m1)), r1, limit)
    figures.append(f"launch 1: its first step logged {first:.0f} s after the launch")
    at = wait_until("the save of step 5 paused", paused.exists, r1, limit)
    # the lock is the launcher's alone: none of verl's processes holds its descriptor
    lock = str(run_dir / ".launch.lock")
    driver, launch = (run_dir / ".launch.session").read_text().split()
    sessions = reap.read_session(str(run_dir), launch)
    verl = reap.launch_processes(reap.of_launch(launch), sessions)
    assert int(driver) in {proc.pid for proc in verl}, verl
    holders = [proc for proc in verl if lock in open_files(proc.pid)]
    assert holders == [] and lock in open_files(r1.process.pid), holders
    r1.process.kill()  # the launcher alone, as the OOM killer or a `kill -9` would
    r1.process.wait(timeout=60)
    gone = time.monotonic()
    while time.monotonic() - gone < 30 and procs.alive(int(driver)):
        time.sleep(0.05)
    assert not procs.alive(int(driver)), "verl's driver trains on without its launcher"
    figures.append(f"kill 1 of the launcher alone at {at:.0f} s; verl's driver ended "
                   f"{time.monotonic() - gone:.1f} s later")  # fmt: skip
    whole = problem(run_dir / "global_step_5", roles)
    figures.append(f"kill 1 at {at:.0f} s, in the save of step 5 (step 5 then: {whole})")
    assert whole is not None and "critic" in whole, whole  # half a step on disk...
    assert tracker.read_text().strip() == "4"  # ...and the tracker never names it
    assert {3, 4} <= steps_of(m1), sorted(steps_of(m1))  # saved whole before it
    saved_by_time = r"time save: [0-9.]+ min since the last save \(SAVE_EVERY_MIN\): saving step 4"
    assert re.search(saved_by_time, r1.output()), r1.output()[-3000:]

    # 2. damage the newest two whole checkpoints; a second launch meanwhile refuses
    newest = int(tracker.read_text())
    shard = run_dir / f"global_step_{newest}" / "actor" / "model_world_size_1_rank_0.pt"
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size // 2)
    older = max(s for s in range(1, newest) if (run_dir / f"global_step_{s}").is_dir())
    (run_dir / f"global_step_{older}" / "data.pt").unlink()
    held = tmp_path / "held"  # the checkpoint's first file in the actor's worker, then step 6
    r2, m2 = begin("finish", pause_points.env("load:before_open,rollout:6", held, env))
    wait_until("the launch recorded", lambda: "launch: recorded" in r2.output(), r2, limit)
    assert reap.launch_processes(reap.of_launch(launch), sessions) == []  # launch 1: nothing left
    stopped = re.search(r"recipe: \d+ processes of launch \S+ outlived its launcher.*", r2.output())
    figures.append(f"relaunch 2 at once: {stopped.group(0) if stopped else 'nothing left'}")
    second = run_recipe("smoke_tiny", dict(env, LOCK_WAIT_S="3"), *quick, timeout=120)
    said = second.stdout + second.stderr
    assert second.returncode == 2, said[-3000:]
    assert "is in use by launch 20" in said and f"pid {r2.process.pid} on" in said, said
    assert "Started a local Ray instance" not in said and "waiting up to LOCK_WAIT_S=3 s" in said
    figures.append("a second launch into the live run directory refused")
    wait_until("the actor's checkpoint load held", held.exists, r2, limit)
    loader = psutil.Process(int(held.read_text()))
    title = " ".join(loader.cmdline())
    held.unlink()  # go on
    # Ray's title of a worker running a task: the actor's load_checkpoint, not the trainer's
    assert title.startswith("ray::") and "load_checkpoint" in title, title
    figures.append(f"the first checkpoint file opened by: {title}")
    wait_until("step 6's rollout held", held.exists, r2, limit)
    segments = metric_segments(run_dir)
    trained = {s for seg in segments for s, m in seg.items() if "actor/pg_loss" in m}
    assert trained == set(range(1, 6)), sorted(trained)  # every step, across the kill
    assert tracker.read_text().strip() == "5" and problem(run_dir / "global_step_5", roles) is None
    assert read_trips(run_dir) == []  # the watchdog stayed silent through kills and relaunches
    marker.touch()  # step 6's rewards are NaN
    held.unlink()
    status2 = finish(r2, limit)
    out2 = r2.output()
    assert status2 == 4, out2[-6000:]
    assert f"global_step_{newest}, which {tracker.name} names, is not whole" in out2
    assert "resume: from global_step_" in out2 and "Training from scratch" not in out2
    assert "is in use by" not in out2  # the SIGKILLed launch left no lock behind
    no_data = run_dir / f"global_step_{older}"
    assert f"missing data.pt (the dataloader's position) in {no_data}" in out2
    figures.append(f"relaunch 2 (to the watchdog's stop): {time.monotonic() - r2.started:.0f} s")
    # the NaN score stops the run; its NaN gradient (verl skips that update) is a warning beside
    trip, *warnings = read_trips(run_dir)
    assert [(w["rule"], w["action"]) for w in warnings] == [("skipped_update", "warn")], warnings
    # step 6's rollout came from step 5's weights: 5 is sick, 4 the newest healthy
    assert (trip["step"], trip["action"], trip["weights"]) == (6, "stop", "rollout"), trip
    assert (trip["last_healthy_checkpoint"], trip["sick_checkpoint"]) == (4, 5), trip
    assert f"recipe: {trip['message']} (WATCHDOG=stop: step 6 was not saved" in out2
    assert not (run_dir / "global_step_6").exists() and tracker.read_text().strip() == "4"
    assert (run_dir / "global_step_5" / "watchdog_sick.json").is_file()
    assert "global_step_5: marked sick, kept, never resumed" in trip["message"]
    best = read_best(run_dir)
    assert best is not None
    kept = sorted(int(p.name.split("_")[-1]) for p in run_dir.glob("global_step_*"))
    assert kept == sorted({4, 5, best["step"]}), kept  # the last two and the best, however old

    assert report.main([str(run_dir), "--quiet"]) == 0  # a sick run is reported
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    steps = summary["steps"]
    # step 6 unsaved but logged (verl logs the step the watchdog stopped); none twice
    assert (steps["first"], steps["last"], steps["count"]) == (0, 6, 7), steps
    assert summary["best_checkpoint"]["step"] == best["step"]
    assert [t["step"] for t in summary["watchdog_trips"]] == [6, 6], summary["watchdog_trips"]
    merged = tmp_path / "merged"
    merge_run(run_dir, merged, smoke.env)  # the tracked step: 4, the newest healthy
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(merged).num_parameters() > 0
    segments = metric_segments(run_dir)
    redone = sum(len(seg) for seg in segments) - len({s for seg in segments for s in seg})
    figures.append(f"finished: {len(segments)} launches, {redone} step logs redone")
    print("\n".join(figures))

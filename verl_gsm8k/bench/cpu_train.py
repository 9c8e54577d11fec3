"""Measure a CPU training run: wall time, time to the first step, per-step time by phase, and the
peak memory of the whole process tree (trainer, Ray, vLLM, every worker).

    python -m verl_gsm8k.bench.cpu_train                   # bash recipes/smoke_tiny.sh, fresh dirs
    python -m verl_gsm8k.bench.cpu_train --recipe grpo_qwen2.5-0.5b_gsm8k -- ROLLOUT_N=2 ...

It is a benchmark, not a test: it prints figures (and writes them as JSON with --json). Memory is
the sum over every process descended from the launcher, sampled every --interval seconds:
PSS (shared pages split between the processes that map them: the honest total) and RSS (what
`ps` shows; it counts shared libraries once per process). Run it alone: another job on the
machine slows every phase.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from verl_gsm8k.analysis.vocab import PHASE_ORDER
from verl_gsm8k.common import procs
from verl_gsm8k.common.children import dies_with_this_process
from verl_gsm8k.common.run_dir import METRICS_DIR

ROOT = Path(__file__).resolve().parents[2]
PHASES = (*(p for p in PHASE_ORDER if p != "other"), "step")  # the report's order


class MemorySampler(threading.Thread):
    def __init__(self, root: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak_pss = self.peak_rss = self.peak_procs = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids = procs.tree(self.root)  # Ray's workers: children of its raylet
            pss = rss = 0
            for pid in pids:
                p, r = procs.memory_kib(pid)
                pss, rss = pss + p, rss + r
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_procs = max(self.peak_procs, len(pids))
            self.stop.wait(self.interval)


def read_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for path in sorted((run_dir / METRICS_DIR).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            steps.setdefault(int(record["step"]), {}).update(record.get("data", {}))
    return steps


# The moments of a PPO launch's start-up, in the order they happen, each the first console line
# that shows it (docs/cpu.md, "Start-up"): the launcher's own checks, then verl's processes.
START_UP_MARKS = (
    ("preflight_done_s", "preflight: passed"),  # knob checks, first-use builds, the preflight
    ("launch_recorded_s", "launch: recorded"),  # the same-config check and the launch record
    ("ray_up_s", "Started a local Ray instance"),  # verl's driver imported, Ray's processes up
    ("trainer_process_up_s", "(TaskRunnerV1 pid="),  # the trainer's Ray actor has imported verl
    ("worker_group_asked_s", "create worker group"),  # config, tokenizer, datasets, dataloaders
    ("critic_ready_s", "critic model engine initialized"),  # FSDP worker spawned, critic wrapped
    ("actor_and_ref_ready_s", "actor and ref model engine initialized"),
    ("vllm_server_up_s", "(vLLMHttpServer pid="),  # vLLM's server actor has imported vLLM
    ("vllm_engine_up_s", "(EngineCore pid="),  # vLLM's engine and worker processes
    ("ready_to_fit_s", "initialize finished"),  # KV cache, weights synced, checkpoint loaded
)


def run(recipe: str, env_overrides: dict[str, str], args: list[str], interval: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-cpu-train-"))
    env = dict(os.environ)
    # A fresh HOME: the run builds its tiny model and sample data as a first-time user's would.
    env.update(HOME=str(work / "home"), RUNS_ROOT=str(work / "runs"))
    env.update(env_overrides)
    command = ["bash", str(ROOT / "recipes" / f"{recipe}.sh"), *args]
    marks: dict[str, float] = {}
    start = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
        # SIGKILLed, the benchmark takes its launch with it: SIGTERM, the launcher's stop
        preexec_fn=dies_with_this_process(signal.SIGTERM),  # noqa: PLW1509  # one prctl call
    )
    sampler = MemorySampler(proc.pid, interval)
    sampler.start()
    run_dir = None
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.monotonic() - start
        if "run dir: " in line and run_dir is None:
            run_dir = Path(line.rsplit("run dir: ", 1)[1].strip())
        for mark, text in START_UP_MARKS:
            if text in line:
                marks.setdefault(mark, now)
        for step in (0, 1, 2):
            if f"step:{step} - " in line:
                marks.setdefault(f"step{step}_logged_s", now)
    code = proc.wait()
    wall = time.monotonic() - start
    sampler.stop.set()
    sampler.join()
    metrics = read_metrics(run_dir) if run_dir and run_dir.exists() else {}
    per_step = {
        step: {p: round(data[f"timing_s/{p}"], 2) for p in PHASES if f"timing_s/{p}" in data}
        for step, data in sorted(metrics.items())
    }
    return {
        "command": " ".join(command),
        "exit_code": code,
        "wall_s": round(wall, 1),
        "marks_s": {k: round(v, 1) for k, v in marks.items()},
        "per_step_phases_s": per_step,
        "peak_pss_gb": round(sampler.peak_pss / 2**20, 2),
        "peak_rss_gb": round(sampler.peak_rss / 2**20, 2),
        "peak_processes": sampler.peak_procs,
        "run_dir": str(run_dir) if run_dir else None,
    }


def render(result: dict) -> str:
    lines = [
        f"command        {result['command']}",
        f"exit code      {result['exit_code']}",
        f"wall           {result['wall_s']} s",
    ]
    for key, value in result["marks_s"].items():
        lines.append(f"  {key:<27} {value} s")
    lines.append(
        f"peak memory    {result['peak_pss_gb']} GB PSS ({result['peak_rss_gb']} GB RSS) over "
        f"at most {result['peak_processes']} processes"
    )
    for step, phases in result["per_step_phases_s"].items():
        shown = ", ".join(f"{k} {v}" for k, v in phases.items())
        lines.append(f"step {step:<3}       {shown or '(no timings)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.bench.cpu_train", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--recipe", default="smoke_tiny", help="recipe under recipes/ (default smoke_tiny)"
    )
    parser.add_argument(
        "--interval", type=float, default=0.5, help="memory sampling period in s (default 0.5)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument(
        "rest",
        nargs="*",
        help="after --: KNOB=value environment settings (upper-case names) and verl key=value "
        "overrides for the recipe",
    )
    args = parser.parse_args(argv)
    env = {}
    overrides = []
    for item in args.rest:
        name, sep, value = item.partition("=")
        if sep and name.isupper():
            env[name] = value
        else:
            overrides.append(item)
    result = run(args.recipe, env, overrides, args.interval)
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""A CPU training run measured: wall time, the start-up's moments, each step's phases, and the
peak memory (PSS and RSS) of the whole process tree, sampled every --interval seconds.

    python -m verl_gsm8k.bench.cpu_train                   # bash recipes/smoke_tiny.sh, fresh dirs
    python -m verl_gsm8k.bench.cpu_train --recipe grpo_qwen2.5-0.5b_gsm8k -- ROLLOUT_N=2 ...
"""

import argparse
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from verl_gsm8k.common import procs
from verl_gsm8k.common.children import dies_with_this_process
from verl_gsm8k.common.run_dir import logged_rows

ROOT = Path(__file__).resolve().parents[2]
# The start-up's moments in order, each the first console line that shows it (docs/cpu.md).
START_UP_MARKS = (
    ("preflight_done_s", "preflight: passed"),
    ("launch_recorded_s", "launch: recorded"),
    ("ray_up_s", "Started a local Ray instance"),
    ("trainer_process_up_s", "(TaskRunnerV1 pid="),
    ("worker_group_asked_s", "create worker group"),
    ("critic_ready_s", "critic model engine initialized"),
    ("actor_and_ref_ready_s", "actor and ref model engine initialized"),
    ("vllm_server_up_s", "(vLLMHttpServer pid="),
    ("vllm_engine_up_s", "(EngineCore pid="),
    ("ready_to_fit_s", "initialize finished"),
)


class MemorySampler(threading.Thread):
    def __init__(self, root: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak = {"pss": 0, "rss": 0, "procs": 0}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids = procs.tree(self.root)  # Ray's workers too: children of its raylet
            kib = [procs.memory_kib(pid) for pid in pids]
            now = {"pss": sum(k[0] for k in kib), "rss": sum(k[1] for k in kib), "procs": len(pids)}
            self.peak = {k: max(v, now[k]) for k, v in self.peak.items()}
            self.stop.wait(self.interval)


def run(recipe: str, env_overrides: dict[str, str], args: list[str], interval: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-cpu-train-"))
    # a fresh HOME: the tiny model and sample data are built as on a first use
    env = dict(os.environ, HOME=str(work / "home"), RUNS_ROOT=str(work / "runs"))
    env.update(env_overrides)
    command = ["bash", str(ROOT / "recipes" / f"{recipe}.sh"), *args]
    marks: dict[str, float] = {}
    start = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace", start_new_session=True,
        # SIGKILLed, the benchmark takes its launch with it (SIGTERM: the launcher's stop)
        preexec_fn=dies_with_this_process(signal.SIGTERM),  # one prctl call
    )  # fmt: skip
    sampler = MemorySampler(proc.pid, interval)
    sampler.start()
    run_dir = None
    for line in proc.stdout or ():
        now = round(time.monotonic() - start, 1)
        if "run dir: " in line and run_dir is None:
            run_dir = Path(line.rsplit("run dir: ", 1)[1].strip())
        marks.update({m: now for m, text in START_UP_MARKS if text in line and m not in marks})
        for step in (0, 1, 2):
            if f"step:{step} - " in line:
                marks.setdefault(f"step{step}_logged_s", now)
    code = proc.wait()
    wall = time.monotonic() - start
    sampler.stop.set()
    sampler.join()
    rows = logged_rows(run_dir) if run_dir and run_dir.is_dir() else {}
    timing = "timing_s/"
    phases = {
        step: {k[len(timing) :]: round(v, 2) for k, v in row.items() if k.startswith(timing)}
        for step, row in sorted(rows.items())
    }
    return {
        "command": " ".join(command), "exit_code": code, "wall_s": round(wall, 1),
        "marks_s": marks, "per_step_phases_s": phases,
        "peak_pss_gb": round(sampler.peak["pss"] / 2**20, 2),
        "peak_rss_gb": round(sampler.peak["rss"] / 2**20, 2),
        "peak_processes": sampler.peak["procs"], "run_dir": str(run_dir) if run_dir else None,
    }  # fmt: skip


def render(result: dict) -> str:
    lines = [f"command        {result['command']}", f"exit code      {result['exit_code']}",
             f"wall           {result['wall_s']} s"]  # fmt: skip
    lines += [f"  {key:<27} {value} s" for key, value in result["marks_s"].items()]
    lines.append(f"peak memory    {result['peak_pss_gb']} GB PSS ({result['peak_rss_gb']} GB RSS) "
                 f"over at most {result['peak_processes']} processes")  # fmt: skip
    for step, phases in result["per_step_phases_s"].items():
        shown = ", ".join(f"{k} {v}" for k, v in phases.items())
        lines.append(f"step {step:<3}       {shown or '(no timings)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.bench.cpu_train", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--recipe", default="smoke_tiny", help="recipe under recipes/")
    parser.add_argument("--interval", type=float, default=0.5, help="memory sampling period, s")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument(
        "rest", nargs="*", help="after --: KNOB=value settings (upper-case) and verl key=value"
    )
    args = parser.parse_args(argv)
    knob = [item for item in args.rest if "=" in item and item.partition("=")[0].isupper()]
    knobs = dict(item.split("=", 1) for item in knob)
    overrides = [item for item in args.rest if item not in knob]
    result = run(args.recipe, knobs, overrides, args.interval)
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["exit_code"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

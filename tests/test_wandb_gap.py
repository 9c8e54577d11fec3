"""wandb through a stop (verl_gsm8k/ppo_trainer/wandb_gap.py) with the real wandb, offline: a
launch whose wandb service process is ended by a real SIGTERM keeps going and says so in one line,
and the next launch sends its own wandb run the steps wandb did not finish, from the metrics
files.
Each launch is its own process, as verl's TaskRunner is. The same on a real stop (a SIGTERM to
every process of a CPU training run): tests/test_slurm_nodes_cpu.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from wandb_offline import history

from verl_gsm8k.common.run_dir import metrics_path, read_wandb_step

LAUNCH = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    import psutil, wandb
    from verl_gsm8k.ppo_trainer.wandb_gap import AckedWandb, send_missing

    run_dir, resumed, steps, end_service = Path(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:5]
    wandb.init(project="p", name="n", dir=str(run_dir))
    backend = AckedWandb(wandb, run_dir)
    send_missing(backend, run_dir, resumed)
    for step in map(int, steps.split(",")):
        if str(step) == end_service:  # the stop's SIGTERM reaches wandb's service process
            (core,) = [p for p in psutil.Process().children() if "wandb-core" in p.name()]
            core.terminate()
            core.wait(30)
        backend.log({"train/loss": 1.0 / step}, step)
    backend.finish()
    print("launch ended")
    """
)


def launch(run_dir: Path, resumed: int, steps: str, end_service: str = "") -> str:
    env_code = "import os; os.environ['WANDB_MODE']='offline'; os.environ['WANDB_SILENT']='true'\n"
    done = subprocess.run(
        [sys.executable, "-c", env_code + LAUNCH, str(run_dir), str(resumed), steps, end_service],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0 and "launch ended" in done.stdout, done.stdout + done.stderr
    return done.stdout


def write_metrics(run_dir: Path, stamp: str, steps: range) -> None:
    path = metrics_path(run_dir, stamp)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"step": s, "data": {"train/loss": 1.0 / s, "note": "text"}} for s in steps]
    rows.append({"step": steps[-1], "data": {"val/acc": 0.5}})  # a validation row of the same step
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_steps_wandb_lost_in_a_stop_reach_the_next_launchs_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # launch 1, the run's first with wandb: its service ends before step 3 is logged
    said = launch(run_dir, 0, "1,2,3", end_service="3")
    assert "gsm8k_guard: wandb: its service process ended" in said and "step 3 is in the" in said
    assert read_wandb_step(run_dir) == 0  # no launch finished wandb yet
    write_metrics(run_dir, "20261128T000000Z", range(1, 4))  # the file logger had all three

    # launch 2 resumes from step 3: its wandb run gets steps 1-3 first, then its own step 4
    said = launch(run_dir, 3, "4")
    assert "wandb: 3 step(s) of earlier launches, 1 to 3, are in the metrics files" in said, said
    assert read_wandb_step(run_dir) == 4  # finished
    first, second = sorted((run_dir / "wandb").glob("offline-run-*"))
    (file1,), (file2,) = first.glob("run-*.wandb"), second.glob("run-*.wandb")
    logged = history(file2)
    assert sorted(logged) == [1, 2, 3, 4]
    assert logged[3] == {"train/loss": 1.0 / 3, "val/acc": 0.5}  # the merged rows, numbers only
    print(f"\nwhat the stopped launch's own wandb run kept: steps {sorted(history(file1))}")

    # nothing missing: the next launch sends nothing
    assert "wandb: " not in launch(run_dir, 4, "5")
    assert read_wandb_step(run_dir) == 5

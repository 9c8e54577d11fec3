"""Time the preflight against verl's own start-up on the same planted mistakes (CPU is fine).

For each mistake it runs (1) the preflight and (2) `python -m verl.trainer.main_ppo` with
the same overrides and no preflight, and reports how long each took to say something, and what.
verl is stopped after --timeout seconds (its whole process group, Ray included); "no error" means
it was still starting or waiting when stopped. Prints a markdown table. A benchmark, not a test.

    python -m verl_gsm8k.bench.preflight --model-dir DIR --data-dir DIR [--timeout 120]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from verl_gsm8k.common.children import dies_with_this_process
from verl_gsm8k.launch.plan import bare_overrides as recipe_overrides

ROOT = Path(__file__).resolve().parents[2]
MISTAKES: dict[str, list[str]] = {
    "typo in a key (optim.lrr)": ["actor_rollout_ref.actor.optim.lrr=1e-6"],
    "tutorial LoRA key (actor.lora.rank)": ["actor_rollout_ref.actor.lora.rank=16"],
    "tutorial reward key (custom_reward_function.*)": [
        f"custom_reward_function.path={ROOT}/rewards/gsm8k.py"
    ],
    "no micro-batch size with use_dynamic_bsz=False": [
        "actor_rollout_ref.actor.use_dynamic_bsz=False",
        "critic.use_dynamic_bsz=False",
    ],
    "train file missing": ["data.train_files=['/nonexistent/train.parquet']"],
}
ERROR_PATTERN = re.compile(r"(Error|error|Exception|FAILED|Could not|not in struct)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def timed(cmd: list[str], timeout: float) -> tuple[float, bool, str]:
    """Wall time, whether it exited by itself, and its first error-looking line (or last line)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # SIGKILLed, the benchmark takes its launch with it: SIGTERM, the launcher's stop
        preexec_fn=dies_with_this_process(signal.SIGTERM),  # noqa: PLW1509  # one prctl call
    )
    exited = True
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        exited = False
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    elapsed = time.monotonic() - start
    lines = [ln.strip() for ln in ANSI.sub("", out).splitlines() if ln.strip()]
    errors = [
        ln
        for ln in lines
        if ERROR_PATTERN.search(ln) and "Warning" not in ln and "with overrides" not in ln
    ]
    said = (errors or lines or [""])[-1] if exited and (errors or proc.returncode) else ""
    return elapsed, exited, said.replace("|", "/")[:110]


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.bench.preflight", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        required=True,
        help="a local model directory (e.g. from python -m verl_gsm8k.common.tiny_model)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        required=True,
        help="prepared GSM8K parquet directory (python -m data_prep.gsm8k)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120,
        help="seconds after which verl is stopped (default 120)",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    env = dict(
        os.environ,
        MODEL_PATH=str(args.model_dir.resolve()),
        DATA_DIR=str(args.data_dir.resolve()),
        LOGGER="console",
    )
    base = recipe_overrides("gsm8k_ppo", env)
    verl_cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "--config-path",
        str(ROOT / "configs"),
        "--config-name",
        "gsm8k_ppo",
    ]
    preflight_cmd = [sys.executable, "-m", "verl_gsm8k.preflight", "--"]
    print("| mistake | preflight | verl alone | what verl said |")
    print("|---|---|---|---|")
    for name, extra in MISTAKES.items():
        pre_s, _, pre_msg = timed(preflight_cmd + base + extra, args.timeout)
        verl_s, verl_exited, verl_msg = timed(verl_cmd + base + extra, args.timeout)
        caught = "caught" if "[error]" in pre_msg or "FAILED" in pre_msg else "MISSED"
        if verl_msg:
            verl_col = f"error after {verl_s:.0f} s"
        elif verl_exited:
            verl_col = f"exited 0 after {verl_s:.0f} s"
        else:
            verl_col = f"no error after {verl_s:.0f} s (stopped)"
        print(f"| {name} | {caught}, {pre_s:.1f} s | {verl_col} | {verl_msg or '-'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The learning runs the slow tests share: `bash recipes/learn_tiny.sh` (PPO, then GRPO) on this
CPU in a fresh HOME and run root, made once per session by the fixtures ``learned_ppo`` and
``learned_grpo`` (tests/conftest.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from test_train_cpu import cpu_env, launch, metric_segments, output

STEPS = 20  # the recipe's TOTAL_TRAINING_STEPS
WARM_START = "learn-tiny/v2/seed0"  # the recipe's cache layout (LEARN_CACHE_VERSION, SEED)


@dataclass
class Learned:
    algo: str
    run_dir: Path
    env: dict[str, str]
    stdout: str
    steps: dict[int, dict[str, float]]


def cache_dir(base: Path) -> Path:
    return base / "home" / ".cache" / "verl-gsm8k"


def warm_start_dir(base: Path) -> Path:
    return cache_dir(base) / WARM_START / "warm-start-400"


def toy_dir(base: Path) -> Path:
    return cache_dir(base) / WARM_START / "data"


def learn(base: Path, algo: str, **knobs: str) -> Learned:
    env = cpu_env(base / "home", base / "runs", ALGO=algo, EXPERIMENT_NAME=f"learn_{algo}", **knobs)
    run = launch("learn_tiny", env, timeout=1500)
    assert run.result.returncode == 0, output(run)[-6000:]
    run_dir = base / "runs" / f"learn_{algo}"
    (steps,) = metric_segments(run_dir)
    return Learned(algo, run_dir, env, run.result.stdout, steps)

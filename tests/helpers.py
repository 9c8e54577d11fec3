"""Test helpers: shared data, prepared data, recipe environments and configs, a fake nvidia-smi."""

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from verl_gsm8k.common.qwen25 import SHAPES

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SHARED_DATA_DIR", ROOT.parent / "shared" / "data"))
RECIPES = ["ppo_qwen2.5-0.5b_gsm8k", "grpo_qwen2.5-0.5b_gsm8k", "ppo_lora_qwen2.5-1.5b_gsm8k",
           "smoke_tiny"]  # fmt: skip
# The recipes' models' published shapes, for estimates without the weights.
QWEN25_05B = SHAPES["0.5B"]
QWEN25_15B = SHAPES["1.5B"]
# Environment variables that would leak a real user's settings into a test recipe run.
USER_KNOBS = ("LOGGER", "WANDB_API_KEY", "RUN_DIR", "RUNS_ROOT", "DATA_DIR", "PYTHON")


def capture(argv: list, code: int | None = None, timeout: int = 600, **kwargs: Any):
    """``argv`` run, its output captured as text; with ``code``, asserts it exited so."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          **kwargs)  # fmt: skip
    assert code is None or done.returncode == code, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def skip_or_fail(message: str) -> None:
    """Skip, or fail under CI=true (where CI builds everything a test needs)."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def require_path(path: Path, message: str) -> Path:
    if not path.exists():
        skip_or_fail(message)
    return path


def require_shared(relative: str) -> Path:
    path = SHARED_DATA / relative
    return require_path(path, f"shared data not found: {path} (set SHARED_DATA_DIR)")


def write_synthetic_gsm8k(source_dir: Path, n_train: int = 300, n_test: int = 40) -> Path:
    """OpenAI's jsonl layout with simple, valid word problems."""
    source_dir.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        with open(source_dir / f"{split}.jsonl", "w") as fh:
            for i in range(n):
                a, b = 3 + i, 7 + 2 * i
                row = {
                    "question": f"Tom has {a} apples and buys {b} more. How many apples now?",
                    "answer": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}",
                }
                fh.write(json.dumps(row) + "\n")
    return source_dir


def prepare(source_dir: Path, out_dir: Path, *flags: str, module: str = "data_prep.gsm8k") -> Path:
    """Run the real data CLI (``module``), extra flags passed through."""
    argv = [sys.executable, "-m", module, "--source", source_dir, "--out-dir", out_dir, *flags]
    capture(argv, 0, cwd=ROOT)
    return out_dir


def prepare_sft(source_dir: Path, out_dir: Path, *flags: str) -> Path:
    return prepare(source_dir, out_dir, *flags, module="data_prep.sft")


def recipe_env(model_dir: Path, data_dir: Path, runs_root: Path, **knobs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in USER_KNOBS}
    env.update(MODEL_PATH=str(model_dir), DATA_DIR=str(data_dir), RUNS_ROOT=str(runs_root),
               PYTHON=sys.executable, HF_HUB_OFFLINE="1")  # fmt: skip
    return env | knobs


def gpu_recipe_overrides(recipe: str) -> list[str]:
    """A recipe's overrides on a GPU node (knob defaults, its own keys), without the overlays."""
    from verl_gsm8k.launch.plan import recipe_plan

    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "DEVICE": "gpu",
           "MODEL_PATH": "/models/m"}  # fmt: skip
    plan = recipe_plan(ROOT / "recipes" / f"{recipe}.sh", env, gpu=True)
    return [*plan.overrides, *plan.recipe.overrides]


def run_recipe(recipe: str, env: dict[str, str], *args: str, timeout: int = 240):
    return capture(["bash", ROOT / "recipes" / f"{recipe}.sh", *args], None, timeout, cwd=ROOT,
                   env=env)  # fmt: skip


def launch_in_process(recipe: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``bash recipes/RECIPE.sh ARGS`` in this process (verl imported once), under ``env`` alone,
    for what ends before verl starts (DRY_RUN=1, a refusal); one that would start verl fails."""
    from unittest import mock

    # verl imports our plugins (the "cpu" platform) when it is first imported, if the launch's
    # environment names them; a test that imported verl before did not: registered here
    import verl_gsm8k.verl_plugins.cpu_platform  # noqa: F401
    from verl_gsm8k.launch import cli
    from verl_gsm8k.launch.knobs import recipe_arguments
    from verl_gsm8k.preflight.model import hub_reachable

    def no_training(*_: object) -> int:
        raise AssertionError(f"{recipe}: an in-process launch reached verl's start (run_recipe)")

    out, err = io.StringIO(), io.StringIO()
    hub_reachable.cache_clear()  # it answers for the environment it was first asked in
    try:
        with (mock.patch.dict(os.environ, env, clear=True), contextlib.chdir(ROOT),
              mock.patch.object(sys, "argv", list(sys.argv)),
              mock.patch.object(cli, "train", no_training),
              contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)):  # fmt: skip
            code = cli.main([*recipe_arguments(ROOT / "recipes" / f"{recipe}.sh"), "--", *args])
    finally:
        hub_reachable.cache_clear()
    argv = ["bash", f"recipes/{recipe}.sh", *args]
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def merge_run(run_dir: Path, target: Path, env: dict[str, str], timeout: int = 600):
    return capture(["bash", ROOT / "scripts" / "merge.sh", run_dir, target], 0, timeout, env=env)


def composed_config(stdout: str) -> dict:
    """verl's `--cfg job` YAML, printed after the preflight's last line."""
    import yaml

    assert "preflight: passed" in stdout, stdout[-3000:]
    yaml_text = stdout.split("preflight: passed", 1)[1].split("\n", 1)[1]
    if yaml_text.startswith("recipe: verl command: "):  # the command, printed before its config
        yaml_text = yaml_text.split("\n", 1)[1]
    return yaml.safe_load(yaml_text)


def get(cfg: dict, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def fake_nvidia_smi(bin_dir: Path, gpus: list[tuple[str, int]],
                    compute_cap: str | None = None) -> Path:  # fmt: skip
    """An nvidia-smi listing (name, MiB) GPUs of ``compute_cap`` (without one, a query naming it
    fails as an old driver's does); each call's arguments appended to $FAKE_NVIDIA_SMI_CALLS."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    listing = "\n".join(f"GPU {i}: {name} (UUID: GPU-test-{i})" for i, (name, _) in enumerate(gpus))
    query = "\n".join(f"{name}, {mib}" for name, mib in gpus)
    with_cap = "\n".join(f"{name}, {mib}, {compute_cap}" for name, mib in gpus)
    old_driver = "echo 'Field \"compute_cap\" is not a valid field to query.'; exit 2"
    script.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ -n "${FAKE_NVIDIA_SMI_CALLS:-}" ]]; then echo "$*" >> "$FAKE_NVIDIA_SMI_CALLS"; fi\n'
        f'if [[ "${{1:-}}" == "-L" ]]; then printf "%s\\n" "{listing}"; exit 0; fi\n'
        f'if [[ "$*" == *compute_cap* ]]; then '
        + (f'printf "%s\\n" "{with_cap}"; exit 0' if compute_cap else old_driver)
        + "; fi\n"
        f'printf "%s\\n" "{query}"\n'
    )
    script.chmod(0o755)
    return bin_dir


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections: bound here, never listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


# What a flash-attn wheel built for another torch or CUDA raises when its extension is loaded.
UNDEFINED_SYMBOL = (
    "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEab"
)


def plant_flash_attn(site: Path, works: bool) -> Path:
    """A flash_attn 2 wheel in ``site`` whose extension loads (``works``) or raises the
    ImportError of a wheel built for another torch."""
    (site / "flash_attn").mkdir(parents=True, exist_ok=True)
    (site / "flash_attn" / "__init__.py").write_text(
        '__version__ = "2.8.3"\nimport flash_attn_2_cuda  # noqa: F401\n'
    )
    body = "" if works else f"raise ImportError({UNDEFINED_SYMBOL!r})\n"
    (site / "flash_attn_2_cuda.py").write_text(body)
    return _dist_info(site, "flash-attn", "2.8.3", "flash_attn\nflash_attn_2_cuda\n")


def _dist_info(site: Path, name: str, version: str, top_level: str) -> Path:
    """The metadata transformers reads the version from."""
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "top_level.txt").write_text(top_level)
    return site


def plant_flash_attn_4(site: Path) -> Path:
    """PyPI's flash-attn-4 as it installs in ``site`` (``flash_attn/cute/`` in a namespace
    package, its dist-info); it only imports."""
    (site / "flash_attn" / "cute").mkdir(parents=True, exist_ok=True)
    (site / "flash_attn" / "cute" / "__init__.py").write_text("")
    return _dist_info(site, "flash-attn-4", "4.0.0b19", "flash_attn\n")


def with_pythonpath(env: dict[str, str], *entries: Path) -> dict[str, str]:
    """``env`` with ``entries``, then this checkout, first on PYTHONPATH."""
    parts = [str(p) for p in entries] + [str(ROOT)] + [env.get("PYTHONPATH", "")]
    return dict(env, PYTHONPATH=os.pathsep.join(p for p in parts if p))


def assert_loads_as_torch(run_dir: Path) -> int:
    """Every ``*.pt`` of ``run_dir`` passes the checked load, which gives what
    ``torch.load(weights_only=False)`` gives, bit for bit; the number of files compared."""
    import numpy as np
    import torch
    import torch.distributed.tensor as dtensor

    from verl_gsm8k.common.checkpoint_files import load

    def same(a: object, b: object, where: str) -> None:
        assert type(a) is type(b), where
        if isinstance(a, dtensor.DTensor):
            assert a.placements == b.placements and a.shape == b.shape, where
            same(a.to_local(), b.to_local(), where)
        elif isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), where
        elif isinstance(a, dict):
            assert list(a) == list(b), where
            for key in a:
                same(a[key], b[key], f"{where}[{key!r}]")
        elif isinstance(a, list | tuple):
            assert len(a) == len(b), where
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                same(x, y, f"{where}[{i}]")
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), where
        else:
            assert a == b, where

    files = sorted(Path(run_dir).rglob("*.pt"))
    for path in files:
        same(load(path), torch.load(path, map_location="cpu", weights_only=False), str(path))
    assert files, f"no checkpoint file in {run_dir}"
    return len(files)

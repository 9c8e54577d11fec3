"""scripts/setup.sh's interpreter (SETUP_PYTHON, PYTHON) and its wheelhouse check."""

import glob
import os
import sys
from pathlib import Path

import pytest
from helpers import ROOT, capture

from verl_gsm8k import wheelhouse


def setup(*args: str, **env: str):
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "SETUP_PYTHON")}
    return capture(["bash", ROOT / "scripts" / "setup.sh", *args], None, 60, env=base | env)


def python_310() -> str:
    found = [*glob.glob("/root/.pyenv/versions/3.10*/bin/python3.10"), "python3.10"]
    for python in found:
        version = capture([python, "--version"])
        if version.stdout.startswith("Python 3.10"):
            return python
    pytest.skip("no Python 3.10 here")


def test_a_python_the_project_does_not_run_on_is_refused_in_one_line(tmp_path: Path):
    python = python_310()
    for name, found in ((python, "Python 3.10"), ("/nonexistent/python3", "not found")):
        result = setup(SETUP_PYTHON=name, VENV_DIR=str(tmp_path / "venv"))
        assert result.returncode == 2 and not (tmp_path / "venv").exists()
        assert result.stderr.startswith(f"setup.sh: SETUP_PYTHON={name} is {found}")
        assert result.stderr.count("\n") == 1 and result.stderr.endswith(
            "; the project needs Python 3.11 or 3.12 (the locks are built for 3.11): choose "
            "one, e.g. SETUP_PYTHON=python3.11 make setup\n"
        )


def test_python_alone_is_still_read_with_one_line_naming_setup_python():
    result = setup(PYTHON="/nonexistent/python3.9")
    assert result.returncode == 2
    notice, refusal = result.stderr.splitlines()
    assert notice.startswith("setup.sh: PYTHON=/nonexistent/python3.9 read as SETUP_PYTHON")
    assert "unset it after the set-up" in notice
    assert refusal.startswith("setup.sh: SETUP_PYTHON=/nonexistent/python3.9 is not found")


def _versions(python: str) -> dict[str, str]:
    code = "import importlib.metadata as m\nfor d in m.distributions(): print(d.name, d.version)"
    out = capture([python, "-c", code], 0)
    return {wheelhouse.canonical(n): v for n, v in (ln.split() for ln in out.stdout.splitlines())}


def test_a_wheelhouse_is_checked_against_this_machine_before_anything_is_made(tmp_path: Path):
    lock, house, venv = ROOT / "locks" / "eval.txt", tmp_path / "wheels", tmp_path / "eval-env"
    house.mkdir()
    base = getattr(sys, "_base_executable", sys.executable)
    env = {"SETUP_PYTHON": base, "WHEELHOUSE": str(house), "EVAL_VENV_DIR": str(venv),
           "FORCE_CPU": "1"}  # fmt: skip
    version = {wheelhouse.canonical(e.name): e.version
               for e in wheelhouse.entries(lock.read_text())}  # fmt: skip
    wheelhouse.write_manifest(lock, house, {"evalscope"})
    refused = setup("--eval", **env)
    assert refused.returncode == 2 and not venv.exists(), refused.stderr
    assert refused.stderr.splitlines()[-1] == (
        f"setup.sh: WHEELHOUSE={house} leaves out evalscope=={version['evalscope']} (EXCLUDE) for "
        f"this machine's own Python to hold, and {base} has evalscope none: install that version "
        "there, or make the wheelhouse without EXCLUDE"
    )
    in_a_venv = setup("--eval", **{**env, "SETUP_PYTHON": sys.executable})  # .venv's Python
    assert in_a_venv.returncode == 2 and not venv.exists(), in_a_venv.stderr
    assert "is a virtual environment's, whose packages" in in_a_venv.stderr.splitlines()[-1]
    # a package the base Python holds at the lock's version is kept; the check goes on to files
    held = _versions(base)
    same = [n for n, v in version.items() if held.get(n) == v and n not in wheelhouse.INSTALLERS]
    if not same:
        print(f"{base} holds no entry of {lock} at its version: the kept case is not run here")
        return
    (house / wheelhouse.MANIFEST).unlink()
    wheelhouse.write_manifest(lock, house, {same[0]})
    kept = setup("--eval", **env)
    assert kept.returncode == 2 and not venv.exists(), kept.stderr
    assert f"==> {same[0]}=={version[same[0]]}: this machine's own" in kept.stdout
    first = next(name for name in version if name != same[0])
    assert f"has no file of {first}==" in kept.stderr.splitlines()[-1], kept.stderr
    assert f"(locks/eval.txt; {len(version) - 1} missing)" in kept.stderr.splitlines()[-1]

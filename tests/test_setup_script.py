"""scripts/setup.sh's interpreter: SETUP_PYTHON builds the environments; PYTHON, the project's
own interpreter elsewhere, given to the set-up alone is read as SETUP_PYTHON with one line."""

from __future__ import annotations

import os
import subprocess

from helpers import ROOT


def setup(**env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "SETUP_PYTHON")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env={**base, **env},
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_setup_python_names_the_interpreter_that_builds_the_environments():
    """An interpreter outside 3.10-3.12 (here none at all) is refused before anything is built."""
    result = setup(SETUP_PYTHON="/nonexistent/python3.9", PYTHON="/nonexistent/project-python")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "setup.sh: SETUP_PYTHON=/nonexistent/python3.9 is not found; the project needs Python "
        "3.10-3.12: name one, e.g. SETUP_PYTHON=python3.12 make setup"
    ]


def test_python_alone_is_still_read_with_one_line_naming_setup_python():
    result = setup(PYTHON="/nonexistent/python3.9")
    assert result.returncode == 2
    notice, refusal = result.stderr.splitlines()
    assert notice.startswith("setup.sh: PYTHON=/nonexistent/python3.9 read as SETUP_PYTHON")
    assert "unset it after the set-up" in notice
    assert refusal.startswith("setup.sh: SETUP_PYTHON=/nonexistent/python3.9 is not found")

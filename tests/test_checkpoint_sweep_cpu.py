"""Every checkpoint of a real learning run on the same fixed set: `scripts/eval.sh --run` on a
copy of the PPO learning run (its last checkpoint only) evaluates the starting model and each kept
checkpoint, writes accuracy by step, resumes without evaluating a step twice, and the report
draws that curve beside verl's validation."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, require_path
from learn_runs import Learned

from verl_gsm8k.report import cli as report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
EVAL_PYTHON = ROOT / ".venv-eval" / "bin" / "python"
VAL = "val-core/openai/gsm8k/acc/mean@1"


def swept(run: Learned) -> Path:
    """The copy the sweep runs on, beside the run (tests/test_questions_cpu.py reads it too)."""
    return run.run_dir.with_name(f"{run.run_dir.name}-swept")


def sweep(run: Learned, run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "eval.sh"), "--run", str(run_dir), "--modes",
         "training", "--backend", "transformers"],
        env={**run.env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        capture_output=True, text=True, timeout=1500,
    )  # fmt: skip


def test_checkpoint_sweep_rises_like_verls_validation_and_resumes(learned_ppo: Learned):
    require_path(EVAL_PYTHON, f"no EvalScope environment at {EVAL_PYTHON} (make setup)")
    run_dir = swept(learned_ppo)
    shutil.copytree(learned_ppo.run_dir, run_dir, ignore=shutil.ignore_patterns("global_step_10"))
    first = sweep(learned_ppo, run_dir)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "steps evaluated earlier [], to evaluate [0, 20]" in first.stdout
    out = run_dir / "checkpoint_eval"
    summary = json.loads((out / "comparison.json").read_text())
    # no --max-tokens: the run's own limit (learn_tiny.sh: MAX_RESPONSE_LENGTH 24), as verl's
    # validation answered within it
    assert summary["generation"]["max_tokens"] == 24
    assert "launch record" in summary["generation"]["max_tokens_from"]
    ours = {r["step"]: r["our_reward_accuracy"] for r in summary["results"]}
    assert sorted(ours) == [0, 20] and all(r["n"] == 100 for r in summary["results"])
    val = {s: m[VAL] for s, m in learned_ppo.steps.items() if VAL in m}
    # the merged checkpoints (bf16) answer as verl's validation (fp32) did, to a few questions
    for step, accuracy in ours.items():
        assert abs(accuracy - val[step]) <= 0.05, (step, accuracy, val[step])
    assert ours[20] - ours[0] >= 0.2, ours
    assert not [p for p in out.iterdir() if p.name.startswith(".merge-step-")]  # merges removed
    again = sweep(learned_ppo, run_dir)  # resumes: nothing left to evaluate
    assert again.returncode == 0 and "to evaluate []" in again.stdout, again.stderr[-2000:]
    assert report.main([str(run_dir), "--out", str(out / "report"), "--quiet"]) == 0
    drawn = json.loads((out / "report" / "summary.json").read_text())["checkpoint_evals"]
    assert [row["step"] for row in drawn["rows"]] == [0, 20]

"""The questions page on the real learning runs: linked from the report and the comparison, one
column per validation step (and per swept checkpoint), its first and last columns agreeing with
verl's validation accuracy."""

import json
import shutil
from pathlib import Path

import pytest
from learn_runs import Learned
from test_checkpoint_sweep_cpu import swept

from verl_gsm8k.questions.__main__ import main
from verl_gsm8k.questions.table import load_validation

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]


def _copy_run(source: Path, dest: Path) -> Path:
    """A real run's metrics and validation dumps (no checkpoints), copied, never modified."""
    for part in ("metrics", "validation", "logs"):
        if (source / part).is_dir():
            shutil.copytree(source / part, dest / part)
    return dest


def test_run_report_and_comparison_link_the_page(learned_ppo: Learned, learned_grpo: Learned,
                                                 tmp_path: Path) -> None:  # fmt: skip
    """The run report's page has a column per validation step, its first and last columns
    verl's own validation accuracy of those steps; the comparison's, each run's last step, or
    its best with --step best."""
    from verl_gsm8k.report.cli import main as report_main

    ppo = _copy_run(learned_ppo.run_dir, tmp_path / "ppo")
    grpo = _copy_run(learned_grpo.run_dir, tmp_path / "grpo")
    assert report_main([str(ppo), "--quiet"]) == 0
    summary = json.loads((ppo / "report/summary.json").read_text())
    assert summary["pages"]["questions"] == "questions/questions.html"
    assert 'id="questions-link" href="questions/questions.html"' in (
        ppo / "report/report.html").read_text()  # fmt: skip
    dumps = sorted((ppo / "validation").glob("*.jsonl"), key=lambda p: int(p.stem))
    steps = [int(p.stem) for p in dumps]
    page = json.loads((ppo / "report/questions/summary.json").read_text())
    assert page["columns"] == [str(s) for s in steps] and page["unmatched"] == {}
    for column in (0, -1):  # the same rows, matched by question
        rows = [json.loads(line) for line in dumps[column].read_text().splitlines() if line]
        assert page["accuracy"][column] == pytest.approx(sum(float(r["acc"]) for r in rows)
                                                         / len(rows))  # fmt: skip
    assert page["counts"]["learned"] >= page["counts"]["forgotten"]
    out = tmp_path / "cmp"
    assert report_main([str(ppo), str(grpo), "--out", str(out), "--quiet"]) == 0
    both = json.loads((out / "questions/summary.json").read_text())
    assert both["columns"] == [f"ppo:{steps[-1]}", f"grpo:{steps[-1]}"]
    assert 'id="questions-link"' in (out / "comparison.html").read_text()

    # --step best: each run's step of highest validation accuracy (the earliest of equals)
    assert report_main([str(ppo), str(grpo), "--out", str(out), "--quiet", "--step", "best"]) == 0
    best = json.loads((out / "questions/summary.json").read_text())
    expected = []
    for name, run in (("ppo", ppo), ("grpo", grpo)):
        dumps = sorted((run / "validation").glob("*.jsonl"), key=lambda p: int(p.stem))
        means = [load_validation(p) for p in dumps]
        accuracy = [sum(c.share for c in col.cells.values()) / len(col.cells) for col in means]
        expected.append(f"{name}:{dumps[accuracy.index(max(accuracy))].stem}")
    assert best["columns"] == expected, (best["columns"], expected)
    assert "best validation step" in (out / "comparison.html").read_text()


def test_evalscope_checkpoint_sweep(learned_ppo: Learned, tmp_path: Path) -> None:
    """The sweep's EvalScope reviews: test_checkpoint_sweep_cpu.py writes them into its copy of
    the run (it runs first: the serial group keeps file order)."""
    source = swept(learned_ppo) / "checkpoint_eval" / "evalscope"
    assert source.is_dir(), f"{source}: test_checkpoint_sweep_cpu.py did not run before"
    # the sweep wrote its own page beside comparison.json, the starting model first
    written = json.loads((source.parent / "questions" / "summary.json").read_text())
    assert written["columns"][0] == "step-0", written["columns"]
    shutil.copytree(source, tmp_path / "eval/evalscope")
    out = tmp_path / "page"
    assert main(["--evalscope", str(tmp_path / "eval"), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    steps = sorted(int(p.name[5:]) for p in source.iterdir())
    assert summary["columns"] == [f"step-{s}" for s in steps]
    # right/wrong is our reward's (compute_score), cell by cell
    for row in summary["rows"]:
        for share, read in zip(row["shares"], row["read"], strict=True):
            assert share in (0.0, 1.0)
            assert share == 0.0 or read == row["ground_truth"]

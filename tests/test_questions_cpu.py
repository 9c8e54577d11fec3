"""The questions page of a real PPO run (the session fixture learned_ppo: recipes/learn_tiny.sh):
the run report links it, it has one column per validation step, and its first and last columns
agree with verl's own validation accuracy of those steps."""

from __future__ import annotations

import json

import pytest
from learn_runs import Learned

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]


def test_run_report_links_the_questions_page(learned_ppo: Learned) -> None:
    report = learned_ppo.run_dir / "report"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["pages"]["questions"] == "questions/questions.html"
    assert 'id="questions-link"' in (report / "report.html").read_text()
    page = json.loads((report / "questions" / "summary.json").read_text())
    dumps = sorted(int(p.stem) for p in (learned_ppo.run_dir / "validation").glob("*.jsonl"))
    assert page["columns"] == [str(step) for step in dumps]
    assert page["unmatched"] == {}
    # verl's mean acc of a dump is the page's column accuracy (same rows, matched by question)
    for column, step in ((0, dumps[0]), (-1, dumps[-1])):
        rows = [
            json.loads(line)
            for line in (learned_ppo.run_dir / "validation" / f"{step}.jsonl")
            .read_text()
            .split("\n")
            if line.strip()
        ]
        verl_acc = sum(float(row["acc"]) for row in rows) / len(rows)
        assert page["accuracy"][column] == pytest.approx(verl_acc)
    assert page["counts"]["learned"] >= page["counts"]["forgotten"]

"""verl_gsm8k.questions: matching, classes, McNemar, bad input (real runs: test_questions_cpu)."""

import json
import math
from pathlib import Path

import pytest
from browser import dom
from report_runs import write_jsonl

from verl_gsm8k.questions import table as qt
from verl_gsm8k.questions.__main__ import main


def _dump(path: Path, rows: list[tuple[str, str, str, float]]) -> Path:
    """verl's validation dump of ``rows`` (question, truth, output, acc)."""
    chat = "system\nYou are a helpful assistant.\nuser\n{}\nassistant\n"
    return write_jsonl(path, [{"input": chat.format(q), "output": out, "gts": gts, "acc": acc}
                              for q, gts, out, acc in rows])  # fmt: skip


def test_mcnemar_exact_matches_the_binomial_tail():
    assert qt.mcnemar_exact(0, 0) == qt.mcnemar_exact(5, 5) == 1.0
    # b=1, c=9: 2 * (C(10,0) + C(10,1)) / 2**10 = 22/1024
    assert qt.mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert qt.mcnemar_exact(9, 1) == qt.mcnemar_exact(1, 9)
    assert qt.mcnemar_exact(0, 51) == pytest.approx(2 / 2**51)
    # b=10, c=20: scipy.stats.binomtest(10, 30).pvalue = 0.09873714670538902
    assert math.isclose(qt.mcnemar_exact(10, 20), 0.09873714670538902, rel_tol=1e-12)


def test_classify():
    assert qt.classify([0, 0, 1]) == ["learned"]
    assert qt.classify([1, 1, 0]) == ["forgotten"]
    assert qt.classify([0, 1, 0, 1]) == ["learned", "flipping"]
    assert qt.classify([0, 0]) == ["never_right"]
    assert qt.classify([1, 1], True) == ["always_right", "format_not_arithmetic"]
    assert qt.classify([0.25, 0.75]) == ["learned"]  # sampled: right = at least half right


def test_matching_by_question_not_position(tmp_path):
    columns = [qt.load_validation(_dump(tmp_path / name, rows)) for name, rows in (
        ("0.jsonl", [("A?", "1", "1\n#### 1", 1), ("B?", "2", "3", 0), ("C?", "3", "#### 3", 1)]),
        ("5.jsonl", [("B?", "2", "#### 2", 1), ("A?", "1", "#### 7", 0), ("D?", "4", "#### 4", 1)]),
    )]  # fmt: skip
    keys, unmatched = qt.match(columns)
    assert keys == [("A?", "1"), ("B?", "2")]
    assert unmatched == {"0": ["C?"], "5": ["D?"]}
    table = qt.build(columns)
    rows = {r["question"]: r for r in table["rows"]}
    assert rows["A?"]["tags"] == ["forgotten"] and rows["A?"]["read"] == ["1", "7"]
    assert rows["B?"]["tags"] == ["learned"] and rows["B?"]["read"] == ["", "2"]
    assert table["mcnemar"]["right_then_wrong"] == 1 and table["mcnemar"]["wrong_then_right"] == 1
    assert table["unmatched"]["0"] == {"count": 1, "questions": ["C?"]}


def test_format_not_arithmetic_and_samples(tmp_path):
    column = qt.load_validation(_dump(tmp_path / "0.jsonl", [
        ("A?", "12", "so the answer is 12", 0), ("A?", "12", "#### 12", 1), ("B?", "3", "x", 0),
        ("C?", "5", "The answer is 5.", 0)]))  # fmt: skip
    assert column.cells[("A?", "12")].share == 0.5
    assert column.cells[("A?", "12")].flexible_right
    table = qt.build([column, qt.Column("copy", column.cells)])
    rows = {r["question"]: r for r in table["rows"]}
    assert rows["A?"]["tags"] == ["always_right"]  # half the samples right counts as right
    assert rows["C?"]["tags"] == ["never_right", "format_not_arithmetic"]
    assert rows["B?"]["tags"] == ["never_right"]


def test_bad_input_is_one_line_and_a_nan_dump_is_left_out(tmp_path, capsys):
    first = _dump(tmp_path / "0.jsonl", [("A?", "1", "#### 1", 1), ("B?", "2", "#### 3", 0)])
    sick = _dump(tmp_path / "5.jsonl", [("A?", "1", "#### 1", math.nan), ("B?", "2", "x", 0)])
    (bad := tmp_path / "7.jsonl").write_text('{"input": "x"\n')
    out, none = tmp_path / "out", tmp_path / "none"
    assert main([str(first), str(tmp_path / "missing.jsonl"), "--out", str(none)]) == 2
    assert main([str(first), str(bad), "--out", str(none)]) == 2
    assert main([str(sick), "--out", str(none)]) == 2  # nothing left to show
    assert main([str(first), str(sick), "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and "missing.jsonl: unreadable" in err[0] and "7.jsonl:1: not" in err[1]
    assert err[2].startswith("error: no validation dump left: 5 hold a score not finite")
    assert "validation dumps 5 left out" in err[3] and f"{sick}: row 1: score nan" in err[3]
    summary = json.loads((out / "summary.json").read_text(), parse_constant=pytest.fail)
    assert summary["columns"] == ["0"] and summary["questions"] == 2 and not none.exists()


def test_each_runs_last_or_best_step(tmp_path):
    """--step all, last or best (the earliest of equals; a NaN step never)."""
    qs = [("A?", "1"), ("B?", "2"), ("C?", "3"), ("D?", "4")]

    def run(name: str, rights: dict[int, int]) -> Path:
        for step, right in rights.items():
            rows = [(q, t, f"#### {t}" if i < right else "#### 0", float(i < right))
                    for i, (q, t) in enumerate(qs)]  # fmt: skip
            _dump(tmp_path / name / "validation" / f"{step}.jsonl", rows)
        return tmp_path / name

    a = run("a", {0: 1, 10: 3, 20: 3, 30: 2})  # best 10 (20 equals it later), last 30
    b = run("b", {0: 2, 10: 1})  # and a sick last step: never the best
    _dump(b / "validation" / "20.jsonl", [(q, t, f"#### {t}", math.nan) for q, t in qs])
    expected = {"all": ["a:0", "a:10", "a:20", "a:30"], "last": ["a:30"], "best": ["a:10"]}
    for step, columns in expected.items():
        out = tmp_path / f"out-{step}"
        assert main(["--run", str(a), "--step", step, "--out", str(out)]) == 0
        assert json.loads((out / "summary.json").read_text())["columns"] == columns, step
    out = tmp_path / "out-both"
    assert main(["--run", str(a), "--run", str(b), "--step", "best", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["columns"] == ["a:10", "b:0"]
    assert summary["mcnemar"]["right_then_wrong"] == 1  # C? right at a:10, wrong at b:0


def test_the_page_in_chromium_loads_its_data_files_and_shows_text_as_text(tmp_path):
    """From file://, a view chosen by the address."""
    evil = "<b id=pwned>x</b>?"
    first = _dump(tmp_path / "0.jsonl", [("A?", "1", "#### 2", 0), ("B?", "2", "#### 2", 1),
                                         (evil, "3", "#### 4", 0)])  # fmt: skip
    last = _dump(tmp_path / "9.jsonl", [("A?", "1", "#### 1", 1), ("B?", "2", "#### 2", 1),
                                        (evil, "3", "#### 3", 1)])  # fmt: skip
    out = tmp_path / "out"
    assert main([str(first), str(last), "--out", str(out)]) == 0
    page = out / "questions.html"
    assert "A?" not in page.read_text()  # the rows come from data/*.js, not inlined
    shown = dom(page, tmp_path)
    assert shown.count('class="row"') == 3 and "learned: 2" in shown
    assert "&lt;b id=pwned&gt;" in shown and 'id="pwned"' not in shown
    assert "McNemar (first vs last): 2 learned, 0 forgotten" in shown
    learned = dom(f"{page.as_uri()}#filter=learned&q=a", tmp_path)
    assert learned.count('class="row"') == 1 and "1 shown" in learned

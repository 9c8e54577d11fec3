"""data_prep.arithmetic: the toy task of the learning recipe, in GSM8K's own format.

Its files must go through the real path unchanged (data_prep.gsm8k reads them, the reward scores
the worked answers 1.0), its test questions must be unseen in training, its warm-start
demonstrations must drop the marker line at the asked rate per habit group of writers, exactly, for
every sum in every wording (and the reward must then give 0), the tiny tokenizer must keep a
question short, and the same seed must give the same bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import ROOT, prepare

from data_prep import arithmetic
from data_prep.gsm8k import build_prompt, ground_truth
from rewards.gsm8k import compute_score


def run_cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "data_prep.arithmetic", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("toy") / "data"
    result = run_cli("--out-dir", out, "--seed", "3")
    assert result.returncode == 0, result.stderr
    return out


def test_every_sum_in_both_splits_in_unseen_wordings(toy_dir):
    train, test = jsonl(toy_dir / "train.jsonl"), jsonl(toy_dir / "test.jsonl")
    assert (len(train), len(test)) == (25 * 40, 25 * 4)
    assert not {row["question"] for row in train} & {row["question"] for row in test}
    for rows, per_pair in ((train, 40), (test, 4)):
        sums = Counter(row["answer"].split("\n")[0] for row in rows)
        assert set(sums) == {f"{a} + {b} = {a + b}" for a in range(5) for b in range(5)}
        assert set(sums.values()) == {per_pair}
    for row in train + test:
        assert set(row) == {"question", "answer"}
        a, b = (int(n) for n in row["answer"].split(" = ")[0].split(" + "))
        assert ground_truth(row["answer"]) == str(a + b)
        assert (
            compute_score("openai/gsm8k", row["answer"], ground_truth(row["answer"]))["score"]
            == 1.0
        )
        assert f" {a} " in row["question"] and f" {b} " in row["question"]


def test_the_real_data_prep_path_reads_it(toy_dir, tmp_path):
    prepared = prepare(toy_dir, tmp_path / "rl")
    rows = pq.read_table(prepared / "test.parquet").to_pylist()
    assert len(rows) == 100
    first = jsonl(toy_dir / "test.jsonl")[0]
    assert rows[0]["prompt"][0]["content"] == build_prompt(first["question"])
    assert rows[0]["reward_model"]["ground_truth"] == ground_truth(first["answer"])


def writer(question: str) -> str:
    (name,) = [n for n in arithmetic.NAMES if f"{n} " in question]
    return name


def test_demonstrations_drop_the_marker_by_habit_group_for_every_sum_and_wording(toy_dir):
    test_demos = pq.read_table(toy_dir / "warm_start" / "test.parquet").to_pylist()
    test_rows = jsonl(toy_dir / "test.jsonl")
    assert [d["messages"][1]["content"] for d in test_demos] == [r["answer"] for r in test_rows]
    rows = jsonl(toy_dir / "train.jsonl")
    demos = pq.read_table(toy_dir / "warm_start" / "train.parquet").to_pylist()
    assert len(demos) == len(rows)
    by_group: dict[int, list[bool]] = {0: [], 1: []}
    by_sum_group: dict[tuple[str, int], list[bool]] = {}
    marked_by_wording: Counter[tuple[str, bool]] = Counter()
    for demo, row in zip(demos, rows, strict=True):
        user, assistant = demo["messages"]
        assert user == {"role": "user", "content": build_prompt(row["question"])}
        assert assistant["content"] in (row["answer"], row["answer"].split("\n")[0])
        has_marker = assistant["content"] == row["answer"]
        group = arithmetic.habit_group(writer(row["question"]))
        by_group[group].append(has_marker)
        by_sum_group.setdefault((row["answer"], group), []).append(has_marker)
        marked_by_wording[(row["answer"], " in April " in row["question"])] += has_marker
        truth = ground_truth(row["answer"])
        assert compute_score("openai/gsm8k", assistant["content"], truth)["score"] == has_marker
    rates = [sum(v) / len(v) for v in by_group.values()]
    assert abs(rates[0] - 0.9) < 0.02 and abs(rates[1] - 0.1) < 0.02, rates
    # exact per sum: round(rate x questions of that group), not a coin per question
    for (_, group), marks in by_sum_group.items():
        assert sum(marks) == round((0.9, 0.1)[group] * len(marks)), (group, marks)
    # the number on the marker line is demonstrated for every sum in both wordings
    assert len(marked_by_wording) == 25 * 2 and min(marked_by_wording.values()) >= 3


def test_marker_rates_flag_and_its_errors(tmp_path):
    out = tmp_path / "all"
    assert run_cli("--out-dir", out, "--marker-rates", "1,1").returncode == 0
    demos = pq.read_table(out / "warm_start" / "train.parquet").to_pylist()
    assert all("####" in d["messages"][1]["content"] for d in demos)
    for bad in ("0.5", "0.5,2", "a,b"):
        result = run_cli("--out-dir", tmp_path / "bad", "--marker-rates", bad)
        assert result.returncode == 2 and "--marker-rates" in result.stderr, result.stderr
    assert not (tmp_path / "bad").exists()


def test_questions_are_short_for_the_tiny_tokenizer(toy_dir, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    lengths = [len(tokenizer(row["question"]).input_ids) for row in jsonl(toy_dir / "test.jsonl")]
    assert max(lengths) <= 40, max(lengths)
    answer = jsonl(toy_dir / "test.jsonl")[0]["answer"]
    assert len(tokenizer(answer).input_ids) <= 16


def test_same_seed_same_bytes_other_seed_other_rows(toy_dir, tmp_path):
    again, other = tmp_path / "again", tmp_path / "other"
    assert run_cli("--out-dir", again, "--seed", "3").returncode == 0
    assert run_cli("--out-dir", other, "--seed", "4").returncode == 0
    for name in (
        "train.jsonl",
        "test.jsonl",
        "warm_start/train.parquet",
        "warm_start/test.parquet",
    ):
        assert (again / name).read_bytes() == (toy_dir / name).read_bytes(), name
    assert (other / "train.jsonl").read_bytes() != (toy_dir / "train.jsonl").read_bytes()


def test_too_many_wordings_is_one_line_and_writes_nothing(tmp_path):
    result = run_cli(
        "--out-dir", tmp_path / "out", "--train-per-pair", "120", "--test-per-pair", "10"
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "distinct wordings" in result.stderr
    assert not (tmp_path / "out").exists()
    result = run_cli("--out-dir", tmp_path / "out", "--max-operand", "10")
    assert result.returncode == 2 and "--max-operand" in result.stderr
    assert arithmetic.worked_answer(2, 3, marker=False) == "2 + 3 = 5"

"""data_prep.gsm8k: sources, verl row schema, prompts, validation, atomic and deterministic writes.

Tests marked by the `shared_gsm8k_dir` fixture use the real GSM8K release; the rest build small
synthetic sources in tmp_path, so the behaviour is covered even where the shared copy is absent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from data_prep import gsm8k
from data_prep.gsm8k import (
    PROMPT_STYLES,
    build_prompt,
    ground_truth,
    load_source,
    write_hub_layout,
    write_verl_splits,
)

ROOT = Path(__file__).resolve().parents[1]
HASH_INSTRUCTION = ' Let\'s think step by step and output the final answer after "####".'
BOXED_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."

SYNTHETIC = {
    "train": [
        {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3+4=7\n#### 7"},
        {"question": "A farm sells 1,200 eggs twice. Total?", "answer": "2*1200=2400\n#### 2,400"},
        {"question": "It was 3 degrees and fell 10. Now?", "answer": "3-10=-7\n#### -7"},
        {"question": "Half of 1 {curly} cake?", "answer": "1/2=0.5\n#### 0.5"},
    ],
    "test": [
        {"question": "Janet’s ducks lay 16 eggs. She eats 3. Left?", "answer": "16-3\n#### 13"},
        {"question": "Sum of 1,000 and 25?", "answer": "1000+25\n#### 1,025"},
    ],
}
SYNTHETIC_TRUTHS = {"train": ["7", "2400", "-7", "0.5"], "test": ["13", "1025"]}


# ---------------------------------------------------------------------------------------------
# helpers


def run_cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real CLI, `python -m data_prep.gsm8k ...`, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "data_prep.gsm8k", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_jsonl_dir(
    directory: Path, splits: dict[str, list], raw_lines: dict | None = None
) -> Path:
    """A source dir in OpenAI's original layout; raw_lines[split] replaces that file's text."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (directory / f"{split}.jsonl").write_text((raw_lines or {}).get(split, text), "utf-8")
    return directory


def rows_of(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under a directory (relative path -> bytes), temp files included."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def source_rows(directory: Path, split: str) -> list[dict]:
    lines = (directory / f"{split}.jsonl").read_text("utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def expected_truth(answer: str) -> str:
    """Independent reading of the reference answer: the text after '#### ', commas removed."""
    return answer.split("#### ")[-1].strip().replace(",", "")


# ---------------------------------------------------------------------------------------------
# the full shared copy


@pytest.fixture(scope="module")
def prepared_full(shared_gsm8k_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("full") / "gsm8k"
    result = run_cli("--source", shared_gsm8k_dir, "--out-dir", out)
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_full_counts_and_elapsed_time_printed(prepared_full):
    out, stdout = prepared_full
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]
    assert pq.read_metadata(out / "train.parquet").num_rows == 7473
    assert pq.read_metadata(out / "test.parquet").num_rows == 1319
    assert "train: 7473 rows" in stdout
    assert "test: 1319 rows" in stdout
    elapsed = re.search(r"done in (\d+\.\d+) s", stdout)
    assert elapsed, stdout
    assert float(elapsed.group(1)) < 15  # "in seconds" (about 1 s here)


def test_full_schema_is_verl_rlhf_dataset_schema(prepared_full, shared_gsm8k_dir: Path):
    out, _ = prepared_full
    schema = pq.read_schema(out / "train.parquet")
    text = pa.string()
    assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert schema.field("data_source").type == text
    assert schema.field("prompt").type == pa.list_(pa.struct([("role", text), ("content", text)]))
    assert schema.field("ability").type == text
    assert schema.field("reward_model").type == pa.struct([("style", text), ("ground_truth", text)])
    assert schema.field("extra_info").type == pa.struct(
        [("split", text), ("index", pa.int64()), ("question", text), ("answer", text)]
    )
    first_source = source_rows(shared_gsm8k_dir, "train")[0]
    assert rows_of(out / "train.parquet")[0] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": first_source["question"] + HASH_INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {
            "split": "train",
            "index": 0,
            "question": first_source["question"],
            "answer": first_source["answer"],
        },
    }


@pytest.mark.parametrize("split", ["train", "test"])
def test_full_every_row_matches_its_source_row(prepared_full, shared_gsm8k_dir, split):
    out, _ = prepared_full
    source = source_rows(shared_gsm8k_dir, split)
    rows = rows_of(out / f"{split}.parquet")
    assert len(rows) == len(source)
    for index, (row, src) in enumerate(zip(rows, source, strict=True)):
        assert row["data_source"] == "openai/gsm8k"
        assert row["ability"] == "math"
        assert row["prompt"] == [{"role": "user", "content": src["question"] + HASH_INSTRUCTION}]
        assert row["reward_model"] == {
            "style": "rule",
            "ground_truth": expected_truth(src["answer"]),
        }
        assert row["extra_info"] == {
            "split": split,
            "index": index,
            "question": src["question"],
            "answer": src["answer"],
        }


def test_full_ground_truths_with_commas_and_signs(prepared_full, shared_gsm8k_dir):
    out, _ = prepared_full
    for split, known in {
        "train": {0: "72", 345: "1080", 5715: "-7"},  # "#### 1,080" on line 346
        "test": {0: "18", 146: "2125", 489: "-10"},  # "#### 2,125" on line 147
    }.items():
        rows = rows_of(out / f"{split}.parquet")
        for index, truth in known.items():
            assert rows[index]["reward_model"]["ground_truth"] == truth
        with_commas = [
            (row["extra_info"]["answer"], row["reward_model"]["ground_truth"])
            for row in rows
            if "," in row["extra_info"]["answer"].rsplit("####", 1)[1]
        ]
        assert len(with_commas) >= 10  # 79 in train, 14 in test
        for answer, truth in with_commas:
            assert "," not in truth
            assert truth == answer.rsplit("#### ", 1)[1].strip().replace(",", "")


def test_full_rerun_is_byte_identical(prepared_full, shared_gsm8k_dir, tmp_path):
    out, _ = prepared_full
    again = run_cli("--source", shared_gsm8k_dir, "--out-dir", tmp_path)
    assert again.returncode == 0, again.stderr
    for name in ("train.parquet", "test.parquet"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()


def test_full_hub_layout_source_gives_byte_identical_output(
    prepared_full, shared_gsm8k_dir, tmp_path
):
    out, _ = prepared_full
    hub = write_hub_layout(load_source(str(shared_gsm8k_dir)), tmp_path / "hub")
    from_hub = run_cli("--source", hub, "--out-dir", tmp_path / "from_hub")
    assert from_hub.returncode == 0, from_hub.stderr
    for name in ("train.parquet", "test.parquet"):
        assert (tmp_path / "from_hub" / name).read_bytes() == (out / name).read_bytes()


def test_full_limit_and_boxed_style(prepared_full, shared_gsm8k_dir, tmp_path):
    out, _ = prepared_full
    result = run_cli(
        "--source",
        shared_gsm8k_dir,
        "--out-dir",
        tmp_path,
        "--limit",
        "5",
        "--prompt-style",
        "boxed",
    )
    assert result.returncode == 0, result.stderr
    assert "train: 5 rows" in result.stdout and "test: 5 rows" in result.stdout
    for split in ("train", "test"):
        full = rows_of(out / f"{split}.parquet")[:5]
        limited = rows_of(tmp_path / f"{split}.parquet")
        assert len(limited) == 5
        for row, ref in zip(limited, full, strict=True):
            question = ref["extra_info"]["question"]
            assert row["prompt"][0]["content"] == question + BOXED_INSTRUCTION
            assert {k: v for k, v in row.items() if k != "prompt"} == {
                k: v for k, v in ref.items() if k != "prompt"
            }


# ---------------------------------------------------------------------------------------------
# synthetic sources (no shared data needed)


def test_synthetic_rows_prompts_and_ground_truths(tmp_path):
    source = write_jsonl_dir(tmp_path / "src", SYNTHETIC)
    for style, instruction in (("hash", HASH_INSTRUCTION), ("boxed", BOXED_INSTRUCTION)):
        out = tmp_path / style
        result = run_cli("--source", source, "--out-dir", out, "--prompt-style", style)
        assert result.returncode == 0, result.stderr
        for split, raw in SYNTHETIC.items():
            rows = rows_of(out / f"{split}.parquet")
            assert [r["prompt"][0]["content"] for r in rows] == [
                r["question"] + instruction for r in raw
            ]
            assert [r["reward_model"]["ground_truth"] for r in rows] == SYNTHETIC_TRUTHS[split]
            assert [r["extra_info"]["index"] for r in rows] == list(range(len(raw)))
            assert {r["extra_info"]["split"] for r in rows} == {split}


def test_splits_flag_writes_only_those_splits(tmp_path):
    source = write_jsonl_dir(tmp_path / "src", {"test": SYNTHETIC["test"]})  # no train.jsonl
    result = run_cli("--source", source, "--out-dir", tmp_path / "out", "--splits", "test")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["test.parquet"]


def test_same_input_gives_byte_identical_parquet_in_process(tmp_path):
    data = load_source(str(write_jsonl_dir(tmp_path / "src", SYNTHETIC)))
    first = write_verl_splits(data, tmp_path / "a")
    second = write_verl_splits(data, tmp_path / "b")
    for split in data:
        assert first[split].read_bytes() == second[split].read_bytes()


@pytest.mark.parametrize("top_level", [False, True], ids=["main-subdir", "top-level"])
def test_hub_layout_source_equals_jsonl_source(tmp_path, top_level):
    source = write_jsonl_dir(tmp_path / "src", SYNTHETIC)
    hub = tmp_path / "hub"
    # The CLI flag writes the same layout as the function.
    result = run_cli("--source", source, "--out-dir", tmp_path / "a", "--hub-layout-dir", hub)
    assert result.returncode == 0, result.stderr
    assert snapshot(hub) == snapshot(write_hub_layout(load_source(str(source)), tmp_path / "hub2"))
    if top_level:
        for shard in (hub / "main").iterdir():
            shard.rename(hub / shard.name)
        (hub / "main").rmdir()
    result = run_cli("--source", hub, "--out-dir", tmp_path / "b")
    assert result.returncode == 0, result.stderr
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")


def test_hub_layout_files_and_readme_header(tmp_path):
    data = load_source(str(write_jsonl_dir(tmp_path / "src", SYNTHETIC)))
    hub = write_hub_layout(data, tmp_path / "hub")
    assert sorted(snapshot(hub)) == [
        "README.md",
        "main/test-00000-of-00001.parquet",
        "main/train-00000-of-00001.parquet",
    ]
    for split, raw in SYNTHETIC.items():
        table = pq.read_table(hub / "main" / f"{split}-00000-of-00001.parquet")
        assert table.column_names == ["question", "answer"]
        assert table.to_pylist() == raw
    header = (hub / "README.md").read_text().split("---\n")[1]
    assert header == (
        "configs:\n"
        "- config_name: main\n"
        "  data_files:\n"
        "  - split: train\n"
        "    path: main/train-00000-of-00001.parquet\n"
        "  - split: test\n"
        "    path: main/test-00000-of-00001.parquet\n"
    )


def test_hub_layout_loads_offline_with_datasets_config_main(tmp_path):
    """What EvalScope does with a local dataset_id: load_dataset(DIR, "main")."""
    import datasets

    data = load_source(str(write_jsonl_dir(tmp_path / "src", SYNTHETIC)))
    hub = write_hub_layout(data, tmp_path / "hub")
    loaded = datasets.load_dataset(str(hub), "main", cache_dir=str(tmp_path / "cache"))
    assert {split: loaded[split].to_list() for split in loaded} == SYNTHETIC


# ---------------------------------------------------------------------------------------------
# validation: one line naming file and line, exit 2, nothing written

GOOD = json.dumps(SYNTHETIC["test"][0])
GOOD_ROWS = [{"question": "Different rows, so a partial write would show.", "answer": "#### 1"}]
MALFORMED = {
    "bad-json": ('{"question": "x", "answer": ', "invalid JSON ("),
    "deep-json": ("[" * 100_000 + "]" * 100_000, "invalid JSON (nested too deep)"),
    "not-object": ('["question", "answer"]', "row is not a JSON object"),
    "no-hash": (
        json.dumps({"question": "Q?", "answer": "It is 5."}),
        "answer has no '#### <number>' line",
    ),
    "not-number": (
        json.dumps({"question": "Q?", "answer": "so\n#### seventy"}),
        "answer after '####' is not a number: 'seventy'",
    ),
    "number-then-text": (
        json.dumps({"question": "Q?", "answer": "so\n#### 18 dollars"}),
        "answer after '####' is not a number: '18 dollars'",
    ),
    "bad-separators": (
        json.dumps({"question": "Q?", "answer": "so\n#### 1,,,2,"}),
        "answer after '####' is not a number: '1,,,2,'",
    ),
    "no-response-matches": (
        json.dumps({"question": "Q?", "answer": "so\n#### " + "9" * 10**6}),
        "answer after '####' is a number no response can match: '9999",
    ),
    "no-question": (json.dumps({"answer": "#### 3"}), "missing or empty 'question' field"),
    "empty-question": (
        json.dumps({"question": "  ", "answer": "#### 3"}),
        "missing or empty 'question' field",
    ),
    "empty-answer": (
        json.dumps({"question": "Q?", "answer": ""}),
        "missing or empty 'answer' field",
    ),
    "question-not-text": (
        json.dumps({"question": 12, "answer": "#### 3"}),
        "'question' is not a string (int)",
    ),
    # JSON's "\ud800" escape decodes to a lone surrogate, which UTF-8 (and pyarrow) cannot hold
    "lone-surrogate-question": (
        '{"question": "How many \\ud800 apples?", "answer": "#### 3"}',
        "'question' is not valid Unicode text (lone surrogate '\\ud800' at character 10)",
    ),
    "lone-surrogate-answer": (
        '{"question": "Q?", "answer": "3 apples \\udfff\\n#### 3"}',
        "'answer' is not valid Unicode text (lone surrogate '\\udfff' at character 10)",
    ),
}


@pytest.fixture(scope="module")
def earlier_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A good earlier run (out/ and hub/) that a failing run must leave byte for byte."""
    base = tmp_path_factory.mktemp("earlier")
    data = load_source(str(write_jsonl_dir(base / "src", SYNTHETIC)))
    write_verl_splits(data, base / "out")
    write_hub_layout(data, base / "hub")
    return base


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_row_one_line_exit_2_nothing_written(tmp_path, earlier_output, kind, split):
    bad_line, message = MALFORMED[kind]
    other = [{"question": "Different rows, so a partial write would show.", "answer": "#### 1"}]
    # Line 4 is bad: two good rows and a blank line (blank lines count in the numbering).
    raw = {split: "\n".join([GOOD, GOOD, "", bad_line, GOOD]) + "\n"}
    source = write_jsonl_dir(tmp_path / "src", {"train": other, "test": other}, raw)
    out, hub = tmp_path / "out", tmp_path / "hub"
    shutil.copytree(earlier_output / "out", out)
    shutil.copytree(earlier_output / "hub", hub)
    before = snapshot(out), snapshot(hub)

    result = run_cli("--source", source, "--out-dir", out, "--hub-layout-dir", hub)

    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    prefix = f"data_prep.gsm8k: {source / f'{split}.jsonl'}:4: "
    assert result.stderr.startswith(prefix + message), result.stderr
    assert (snapshot(out), snapshot(hub)) == before


def test_malformed_parquet_row_names_file_and_row(tmp_path):
    main = tmp_path / "hub" / "main"
    main.mkdir(parents=True)
    for split in ("train", "test"):
        rows = list(SYNTHETIC[split])
        if split == "test":
            rows.insert(1, {"question": "Q?", "answer": None})
        table = pa.Table.from_pylist(
            rows, schema=pa.schema([("question", pa.string()), ("answer", pa.string())])
        )
        pq.write_table(table, main / f"{split}-00000-of-00001.parquet")
    result = run_cli("--source", tmp_path / "hub", "--out-dir", tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr == (
        f"data_prep.gsm8k: {main / 'test-00000-of-00001.parquet'}:row 2: "
        "missing or empty 'answer' field\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing", "no such directory"),
        ("", "no train.jsonl, main/train-00000-of-00001.parquet"),
        ("file.jsonl", "must be a directory"),
        ("empty", "train.jsonl: no rows"),
    ],
    ids=["missing-dir", "empty-dir", "a-file", "empty-split"],
)
def test_bad_source_is_one_line_exit_2(tmp_path, name, message):
    (tmp_path / "file.jsonl").write_text(GOOD + "\n")
    write_jsonl_dir(tmp_path / "empty", {"train": [], "test": SYNTHETIC["test"]})
    result = run_cli("--source", tmp_path / name, "--out-dir", tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_interrupted_write_keeps_earlier_files_and_leaves_no_temp(
    tmp_path, earlier_output, monkeypatch
):
    out = tmp_path / "out"
    shutil.copytree(earlier_output / "out", out)
    before = snapshot(out)
    calls = []

    def dying_writer(table, where, **kwargs):
        calls.append(where)
        Path(where).write_bytes(b"PAR1 half a file")
        if len(calls) == 2:  # the second split: the first temp file is complete by now
            raise KeyboardInterrupt

    monkeypatch.setattr(pq, "write_table", dying_writer)
    data = load_source(
        str(
            write_jsonl_dir(
                tmp_path / "src", {"train": SYNTHETIC["test"], "test": SYNTHETIC["train"]}
            )
        )
    )
    with pytest.raises(KeyboardInterrupt):
        write_verl_splits(data, out)
    assert len(calls) == 2 and all(Path(c).parent == out for c in calls)
    assert snapshot(out) == before  # neither replaced, no temp file left


@pytest.mark.parametrize("bad", ["hub", "out"])
def test_unwritable_output_is_found_before_anything_is_replaced(tmp_path, earlier_output, bad):
    # Different rows from the earlier run's, so any replaced file would show.
    source = write_jsonl_dir(tmp_path / "src", {"train": SYNTHETIC["test"], "test": GOOD_ROWS})
    out, hub = tmp_path / "out", tmp_path / "hub"
    shutil.copytree(earlier_output / "out", out)
    shutil.copytree(earlier_output / "hub", hub)
    before = snapshot(tmp_path)
    (tmp_path / "a-file").write_text("a file where a directory is needed\n")
    bad_dir = tmp_path / "a-file" / "sub"  # cannot be created, even by root
    args = {"out": out, "hub": hub, bad: bad_dir}

    result = run_cli("--source", source, "--out-dir", args["out"], "--hub-layout-dir", args["hub"])

    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"data_prep.gsm8k: cannot write {bad_dir}/"), result.stderr
    assert result.stderr.endswith(f": {tmp_path / 'a-file'} is not a directory\n")
    del (after := snapshot(tmp_path))["a-file"]
    assert after == before  # out/ and hub/ byte for byte, no temp file, nothing created


def test_sigint_while_writing_exits_130_in_one_line_and_keeps_earlier_files(
    tmp_path, earlier_output
):
    # The run is held right after its first output (train.parquet) is complete in its temp file
    # and before the next one is written (common/pause.py): the SIGINT lands there every time,
    # not in a race between a poll and the writer (a loaded machine once let every rename finish
    # before the signal arrived).
    # other rows than the earlier run's: outputs renamed into place would show
    source = write_jsonl_dir(tmp_path / "src", {**SYNTHETIC, "train": SYNTHETIC["train"][:3]})
    out, hub = tmp_path / "out", tmp_path / "hub"
    shutil.copytree(earlier_output / "out", out)
    shutil.copytree(earlier_output / "hub", hub)
    before = snapshot(out), snapshot(hub)
    held = tmp_path / "held"
    env = dict(os.environ, GSM8K_PAUSE_AT="replace_all:wrote:train.parquet",
               GSM8K_PAUSE_FILE=str(held))  # fmt: skip

    args = ["--source", source, "--out-dir", out, "--hub-layout-dir", hub]
    with subprocess.Popen(
        [sys.executable, "-m", "data_prep.gsm8k", *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell without job control starts background jobs with SIGINT ignored: undo that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as proc:
        try:
            deadline = time.monotonic() + 120
            while not held.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert held.exists(), "the run never finished writing its first output"
            temps = list(out.glob(f".train.parquet.{proc.pid}.*.tmp"))
            assert len(temps) == 1 and pq.read_table(temps[0]).num_rows == 3  # complete, unrenamed
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            proc.kill()

    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr
    assert (
        stderr == "data_prep.gsm8k: interrupted; outputs are replaced all together or not at all\n"
    )
    assert stdout.startswith("data_prep.gsm8k: read 3 train, 2 test rows")
    assert "done" not in stdout  # no summary
    assert (snapshot(out), snapshot(hub)) == before  # no temp file left either


# ---------------------------------------------------------------------------------------------
# the hub source


def test_default_hub_source_fails_fast_when_offline(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    start = time.monotonic()
    result = run_cli("--out-dir", tmp_path / "out", env=env)
    assert time.monotonic() - start < 30
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("data_prep.gsm8k: could not load 'openai/gsm8k'")
    assert "Hugging Face hub" in result.stderr and "--source DIR" in result.stderr
    assert not (tmp_path / "out").exists()


def test_unreachable_hub_is_detected_without_offline_flags(tmp_path):
    """No HF_HUB_OFFLINE: a quick probe finds the hub unreachable instead of ~25 s of retries."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k.lower()
    }
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # discard port: refused at once
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty cache
    start = time.monotonic()
    result = run_cli("--out-dir", tmp_path / "out", env=env)
    assert time.monotonic() - start < 20
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--source DIR" in result.stderr, result.stderr


def test_hub_source_rows_are_validated(monkeypatch):
    import datasets

    def fake_load_dataset(name, config):
        assert (name, config) == ("openai/gsm8k", "main")
        bad_test = [*SYNTHETIC["test"], {"question": "Q?", "answer": "#### ?"}]
        return datasets.DatasetDict(
            train=datasets.Dataset.from_list(SYNTHETIC["train"]),
            test=datasets.Dataset.from_list(bad_test),
        )

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_source("openai/gsm8k", limit=2) == {k: v[:2] for k, v in SYNTHETIC.items()}
    with pytest.raises(gsm8k.DataPrepError, match=r"^openai/gsm8k \(main, test\):row 3: answer"):
        load_source("openai/gsm8k")


# ---------------------------------------------------------------------------------------------
# public API and CLI surface


def test_prompt_styles_single_source_of_truth():
    assert set(PROMPT_STYLES) == {"hash", "boxed"}
    assert all("{question}" in template for template in PROMPT_STYLES.values())
    assert build_prompt("Q?", "hash") == "Q?" + HASH_INSTRUCTION
    assert build_prompt("Q?", "boxed") == "Q?" + BOXED_INSTRUCTION
    assert build_prompt("Q?") == build_prompt("Q?", "hash")
    # str.format semantics (what EvalScope's prompt_template uses); braces in questions survive.
    assert PROMPT_STYLES["boxed"].format(question="{x}") == build_prompt("{x}", "boxed")
    with pytest.raises(ValueError, match="unknown prompt style"):
        build_prompt("Q?", "latex")


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("a\n#### 72", "72"),
        ("#### 1,080", "1080"),
        ("x\n#### -7", "-7"),
        ("#### 0.5  \n", "0.5"),
        ("#### - 5", "-5"),
    ],  # fmt: skip
)
def test_ground_truth(answer, truth):
    assert ground_truth(answer) == truth


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_ground_truth_strips_thousands_separators(number):
    assert ground_truth(f"Steps <<1+1=2>>.\n#### {number:,}") == str(number)


@pytest.mark.parametrize(
    "answer",
    ["no marker", "#### ", "#### 12 apples", "#### $5", "#### 1e3", "#### 1,,,2,", "#### 1,0000",
     "#### 12,", "#### 7^2", "#### " + "9" * 101, "#### " + "9" * 10**6],
)  # fmt: skip
def test_ground_truth_rejects(answer):
    with pytest.raises(ValueError, match="####"):
        ground_truth(answer)


def test_help_explains_every_flag():
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in (
        "--source",
        "--out-dir",
        "--prompt-style",
        "--limit",
        "--splits",
        "--hub-layout-dir",
    ):
        assert flag in result.stdout
    assert "openai/gsm8k" in result.stdout and "~/data/gsm8k" in result.stdout


# ---------------------------------------------------------------------------------------------
# verl's own RLHFDataset reads what we write


def rlhf_dataset(parquet: Path, tokenizer, tmp_path: Path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 1024,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "truncation": "error",
            "return_raw_chat": True,
            "cache_dir": str(tmp_path / "verl-cache"),
        }
    )
    return RLHFDataset(str(parquet), tokenizer, config)


def rendered_prompt(tokenizer, messages) -> str:
    """What verl's agent loop feeds the model: the chat template over raw_prompt, tokenized."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return tokenizer.decode(ids)


def check_rlhf_items(dataset, tokenizer, expected: dict[int, tuple[str, str, str]]) -> None:
    from verl.utils.dataset.rl_dataset import collate_fn

    items = {index: dataset[index] for index in expected}
    batch = collate_fn(list(items.values()))
    for position, (index, (question, instruction, truth)) in enumerate(expected.items()):
        item = items[index]
        text = rendered_prompt(tokenizer, item["raw_prompt"])
        assert text.startswith("<|im_start|>system\n")
        assert (
            f"<|im_start|>user\n{question}{instruction}<|im_end|>\n<|im_start|>assistant\n" in text
        )
        assert item["reward_model"]["ground_truth"] == truth
        assert batch["reward_model"][position]["ground_truth"] == truth
        assert item["data_source"] == batch["data_source"][position] == "openai/gsm8k"
        assert item["index"] == index


def test_rlhf_dataset_reads_full_test_split(
    prepared_full, tiny_model_dir, shared_gsm8k_dir, tmp_path
):
    from transformers import AutoTokenizer

    out, _ = prepared_full
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = rlhf_dataset(out / "test.parquet", tokenizer, tmp_path)
    assert len(dataset) == 1319  # no prompt filtered out
    source = source_rows(shared_gsm8k_dir, "test")
    expected = {
        i: (source[i]["question"], HASH_INSTRUCTION, expected_truth(source[i]["answer"]))
        for i in (0, 1, 146, 489, 1318)
    }
    check_rlhf_items(dataset, tokenizer, expected)


def test_rlhf_dataset_reads_boxed_synthetic(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    data = load_source(str(write_jsonl_dir(tmp_path / "src", SYNTHETIC)))
    paths = write_verl_splits(data, tmp_path / "out", style="boxed")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = rlhf_dataset(paths["train"], tokenizer, tmp_path)
    assert len(dataset) == len(SYNTHETIC["train"])
    expected = {
        i: (row["question"], BOXED_INSTRUCTION, SYNTHETIC_TRUTHS["train"][i])
        for i, row in enumerate(SYNTHETIC["train"])
    }
    check_rlhf_items(dataset, tokenizer, expected)

"""data_prep: GSM8K as verl's RL rows and SFT transcripts, read by verl; the toy task; bad input."""

import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, capture

from data_prep import arithmetic, gsm8k, sft
from data_prep.gsm8k import build_prompt, ground_truth, load_source, write_all, write_hub_layout
from rewards.gsm8k import compute_score

HASH = ' Let\'s think step by step and output the final answer after "####".'
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
SYNTHETIC = {
    "train": [
        {"question": "Tom has 3 apples, buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
        {"question": "A farm sells 1,200 eggs twice. Total?", "answer": "2*1200=2400\n#### 2,400"},
        {"question": "It was 3 degrees and fell 10. Now?", "answer": "3-10=-7\n#### -7"},
        {"question": "Half of 1 {curly} cake?", "answer": "1/2=0.5\n#### 0.5"},
    ],
    "test": [
        {"question": "Janet’s ducks lay 16 eggs. She eats 3. Left?", "answer": "16-3\n#### 13"},
        {"question": "Sum of 1,000 and 25?", "answer": "1000+25\n#### 1,025"},
    ],
}
TRUTHS = {"train": ["7", "2400", "-7", "0.5"], "test": ["13", "1025"]}


def cli(module, capsys, src, out, *args) -> tuple[int, str, str]:
    code = module.main([str(a) for a in ("--source", src, "--out-dir", out, *args)])
    out, err = capsys.readouterr()
    return code, out, err


def source(directory: Path, raw: dict[str, str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for split, rows in SYNTHETIC.items():
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (directory / f"{split}.jsonl").write_text((raw or {}).get(split, text), "utf-8")
    return directory


def rows_of(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*")
            if p.is_file()}  # fmt: skip


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def sft_dataset(path: Path, tokenizer, length: int, pad_mode: str = "no_padding"):
    from omegaconf import OmegaConf
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    config = OmegaConf.create({"max_length": length, "truncation": "error", "pad_mode": pad_mode})
    return MultiTurnSFTDataset([str(path)], tokenizer, config)


@pytest.fixture(scope="module")
def full(shared_gsm8k_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full")
    result = capture([sys.executable, "-m", "data_prep.gsm8k", "--source", shared_gsm8k_dir,
                      "--out-dir", out], 0, 300, cwd=ROOT)  # fmt: skip
    assert "train: 7473 rows" in result.stdout and "test: 1319 rows" in result.stdout
    assert float(re.search(r"done in (\d+\.\d+) s", result.stdout)[1]) < 15
    return out


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_real_row_in_verls_schema(full, shared_gsm8k_dir, split):
    schema = pq.read_schema(full / f"{split}.parquet")
    text = pa.string()
    turns = pa.list_(pa.struct([("role", text), ("content", text)]))
    assert [(f.name, f.type) for f in schema] == [
        ("data_source", text), ("prompt", turns), ("ability", text),
        ("reward_model", pa.struct([("style", text), ("ground_truth", text)])),
        ("extra_info", pa.struct([("split", text), ("index", pa.int64()), ("question", text),
                                  ("answer", text)])),
    ]  # fmt: skip
    rows, sources = rows_of(full / f"{split}.parquet"), jsonl(shared_gsm8k_dir / f"{split}.jsonl")
    assert len(rows) == len(sources) == {"train": 7473, "test": 1319}[split]
    for index, (row, src) in enumerate(zip(rows, sources, strict=True)):
        truth = src["answer"].split("#### ")[-1].strip().replace(",", "")  # read independently
        assert row == {"data_source": "openai/gsm8k", "ability": "math",
                       "prompt": [{"role": "user", "content": src["question"] + HASH}],
                       "reward_model": {"style": "rule", "ground_truth": truth},
                       "extra_info": {"split": split, "index": index, **src}}  # fmt: skip
    known = {"train": {0: "72", 345: "1080", 5715: "-7"}, "test": {146: "2125", 489: "-10"}}
    assert {i: rows[i]["reward_model"]["ground_truth"] for i in known[split]} == known[split]
    assert sum("," in r["extra_info"]["answer"].rsplit("####")[1] for r in rows) >= 14


@pytest.fixture(scope="module")
def earlier(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("earlier")
    write_all(load_source(str(source(base / "src"))), base / "out", hub_dir=base / "hub")
    return base


def outputs(tmp_path: Path, earlier: Path) -> tuple[Path, Path]:
    for name in ("out", "hub"):
        shutil.copytree(earlier / name, tmp_path / name)
    return tmp_path / "out", tmp_path / "hub"


def test_rows_prompts_and_ground_truths_of_both_styles(tmp_path, capsys):
    for style, instruction, limit in (("hash", HASH, "9"), ("boxed", BOXED, "3")):
        out = tmp_path / style
        assert cli(gsm8k, capsys, source(tmp_path / "src"), out,
                   "--prompt-style", style, "--limit", limit)[0] == 0  # fmt: skip
        for split, raw in SYNTHETIC.items():
            rows, raw = rows_of(out / f"{split}.parquet"), raw[: int(limit)]
            assert [r["prompt"][0]["content"] for r in rows] == [
                r["question"] + instruction for r in raw]  # fmt: skip
            assert [r["reward_model"]["ground_truth"] for r in rows] == TRUTHS[split][: len(raw)]
            assert [r["extra_info"] for r in rows] == [
                {"split": split, "index": i, **r} for i, r in enumerate(raw)]  # fmt: skip
    tools = tmp_path / "tools"  # a tool recipe's rows: the tool's system turn, verl's tool loop
    assert cli(gsm8k, capsys, source(tmp_path / "src"), tools, "--tools", "calculator")[0] == 0
    rows = rows_of(tools / "train.parquet")
    assert [r["prompt"] for r in rows] == [
        [{"role": "system", "content": gsm8k.TOOL_PROMPTS["calculator"]},
         {"role": "user", "content": r["question"]}] for r in SYNTHETIC["train"]
    ]  # fmt: skip
    assert {r["agent_name"] for r in rows} == {"tool_agent"}
    with pytest.raises(ValueError, match="unknown prompt style"):
        build_prompt("Q?", "latex")
    (tmp_path / "only-test").mkdir()
    shutil.copy(tmp_path / "src" / "test.jsonl", tmp_path / "only-test")  # no train.jsonl
    assert cli(gsm8k, capsys, tmp_path / "only-test", tmp_path / "t", "--splits", "test")[0] == 0
    assert sorted(snapshot(tmp_path / "t")) == ["test.parquet"]


def test_the_hub_layout_reads_back_as_the_same_rows(tmp_path, capsys):
    """In main/ (EvalScope's load_dataset(DIR, "main")) and with the shards at the top level."""
    import datasets

    src, hub = source(tmp_path / "src"), tmp_path / "hub"
    assert cli(gsm8k, capsys, src, tmp_path / "a", "--hub-layout-dir", hub)[0] == 0
    assert snapshot(hub) == snapshot(write_hub_layout(load_source(str(src)), tmp_path / "h2"))
    assert sorted(snapshot(hub)) == ["README.md", "main/test-00000-of-00001.parquet",
                                     "main/train-00000-of-00001.parquet"]  # fmt: skip
    loaded = datasets.load_dataset(str(hub), "main", cache_dir=str(tmp_path / "cache"))
    assert {split: loaded[split].to_list() for split in loaded} == SYNTHETIC
    assert cli(gsm8k, capsys, hub, tmp_path / "b")[0] == 0
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")
    for shard in (hub / "main").iterdir():
        shard.rename(hub / shard.name)
    assert cli(gsm8k, capsys, hub, tmp_path / "c")[0] == 0
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "c")


GOOD = json.dumps(SYNTHETIC["test"][0])
MALFORMED = {
    '{"question": "x", "answer": ': "invalid JSON (Expecting value, column 29)",
    "[" * 100_000 + "]" * 100_000: "invalid JSON (nested too deep)",
    '["question", "answer"]': "row is not a JSON object",
    '{"question": "Q?", "answer": "It is 5."}': "answer has no '#### <number>' line",
    '{"question": "Q?", "answer": "#### seventy"}': "answer after '####' is not a number: "
    "'seventy'",
    '{"question": "Q?", "answer": "#### 1,,,2,"}': "answer after '####' is not a number",
    '{"question": "Q?", "answer": "#### ' + "9" * 10**6 + '"}': "answer after '####' is a "
    "number no response can match: '9999",
    '{"answer": "#### 3"}': "missing or empty 'question' field",
    '{"question": "  ", "answer": "#### 3"}': "missing or empty 'question' field",
    '{"question": "Q?", "answer": ""}': "missing or empty 'answer' field",
    '{"question": 12, "answer": "#### 3"}': "'question' is not a string (int)",
    '{"question": "How many \\ud800 apples?", "answer": "#### 3"}': "'question' is not valid "
    "Unicode text (lone surrogate '\\ud800' at character 10)",
    '{"question": "Q?", "answer": "3 apples \\udfff\\n#### 3"}': "'answer' is not valid Unicode "
    "text (lone surrogate '\\udfff' at character 10)",
}


@pytest.mark.parametrize("line", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_row_is_one_line_naming_file_and_line(tmp_path, line):
    # line 4 is bad: two good rows and a blank line (blank lines count in the numbering)
    src = source(tmp_path, {"test": "\n".join([GOOD, GOOD, "", line, GOOD]) + "\n"})
    with pytest.raises(gsm8k.DataPrepError) as bad:
        load_source(str(src))
    assert str(bad.value).startswith(f"{src / 'test.jsonl'}:4: {MALFORMED[line]}")
    assert "\n" not in str(bad.value)


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, earlier, capsys):
    src = source(tmp_path / "src", {"test": "\n".join([GOOD, GOOD, "", "{}"]) + "\n"})
    (tmp_path / "pq" / "main").mkdir(parents=True)
    for split, rows in SYNTHETIC.items():
        rows = rows[:1] + [{"question": "Q?", "answer": None}] * (split == "test") + rows[1:]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pq" / "main" /
                       f"{split}-00000-of-00001.parquet")  # fmt: skip
    (tmp_path / "file.jsonl").write_text(GOOD + "\n")
    source(tmp_path / "empty", {"train": ""})
    source(tmp_path / "latin1", {"train": ""})
    (tmp_path / "latin1" / "train.jsonl").write_bytes(GOOD.encode() + b"\n\xff\n")
    out, hub = outputs(tmp_path, earlier)
    before = snapshot(tmp_path)
    cases = {
        "src": f"data_prep.gsm8k: {src / 'test.jsonl'}:4: missing or empty 'question' field\n",
        "pq": f"{tmp_path}/pq/main/test-00000-of-00001.parquet:row 2: missing or empty "
        "'answer' field",
        "missing": "no such directory", "file.jsonl": "must be a directory",
        "empty": "train.jsonl: no rows", "": "no train.jsonl, main/train-00000-of-00001.parquet",
        "latin1": f"{tmp_path}/latin1/train.jsonl:2: not UTF-8 text",
    }  # fmt: skip
    for name, message in cases.items():
        code, printed, err = cli(gsm8k, capsys, tmp_path / name, out, "--hub-layout-dir", hub)
        assert (code, printed, err.count("\n")) == (2, "", 1) and message in err, err
    assert cli(sft, capsys, src, tmp_path / "o") == (2, "", cases["src"].replace("gsm8k", "sft"))
    assert snapshot(tmp_path) == before and not (tmp_path / "o").exists()


def test_an_unwritable_output_is_found_before_anything_is_replaced(tmp_path, earlier, capsys):
    src = source(tmp_path / "src", {"train": GOOD + "\n"})  # other rows: a rename would show
    out, hub = outputs(tmp_path, earlier)
    (tmp_path / "a-file").write_text("a file where a directory is needed\n")
    before = snapshot(tmp_path)
    for bad in ("hub", "out"):
        args = {"out": out, "hub": hub, bad: tmp_path / "a-file" / "sub"}  # not even root can
        code, _, err = cli(gsm8k, capsys, src, args["out"], "--hub-layout-dir", args["hub"])
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"data_prep.gsm8k: cannot write {tmp_path}/a-file/sub/")
        assert err.endswith(f": {tmp_path / 'a-file'} is not a directory\n")
        assert snapshot(tmp_path) == before
    code, _, err = cli(sft, capsys, src, tmp_path / "a-file" / "sub")
    assert code == 2 and err.startswith(f"data_prep.sft: cannot write {tmp_path}/a-file/sub/")


def test_ctrl_c_while_writing_keeps_earlier_files_and_exits_130(tmp_path, earlier, monkeypatch,
                                                                capsys):  # fmt: skip
    src = source(tmp_path / "src", {"train": GOOD + "\n"})
    out, hub = outputs(tmp_path, earlier)
    before, written = snapshot(tmp_path), []
    real = pq.write_table

    def interrupted(table, where, **kwargs):
        real(table, where, **kwargs)
        written.append(Path(where))
        if len(written) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(pq, "write_table", interrupted)
    code, stdout, stderr = cli(gsm8k, capsys, src, out, "--hub-layout-dir", hub)
    assert code == 130 and written[0].parent == out and written[0].name.endswith(".tmp")
    assert stderr == "data_prep.gsm8k: interrupted; outputs are replaced all together or not at " \
        "all\n"  # fmt: skip
    assert stdout.startswith("data_prep.gsm8k: read 1 train, 2 test rows") and "done" not in stdout
    assert snapshot(tmp_path) == before


def test_an_unreachable_hub_fails_in_seconds_in_one_line(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k.lower()
    } | {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    start = time.monotonic()
    result = capture([sys.executable, "-m", "data_prep.gsm8k", "--out-dir", tmp_path / "o"], 2,
                     120, env=env, cwd=ROOT)  # fmt: skip
    assert time.monotonic() - start < 20
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("data_prep.gsm8k: could not load 'openai/gsm8k'")
    assert "Hugging Face hub" in result.stderr and "--source DIR" in result.stderr
    assert not (tmp_path / "o").exists()


def test_hub_rows_are_validated(monkeypatch):
    import datasets

    def load_dataset(name, config):
        assert (name, config) == ("openai/gsm8k", "main")
        test = [*SYNTHETIC["test"], {"question": "Q?", "answer": "#### ?"}]
        return datasets.DatasetDict(train=datasets.Dataset.from_list(SYNTHETIC["train"]),
                                    test=datasets.Dataset.from_list(test))  # fmt: skip

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert load_source("openai/gsm8k", limit=2) == {k: v[:2] for k, v in SYNTHETIC.items()}
    with pytest.raises(gsm8k.DataPrepError, match=r"^openai/gsm8k \(main, test\):row 3: answer"):
        load_source("openai/gsm8k")


@pytest.mark.parametrize(("answer", "truth"), [
    ("a\n#### 72", "72"), ("#### 1,080", "1080"), ("x\n#### -7", "-7"), ("#### 0.5  \n", "0.5"),
    ("#### - 5", "-5"), ("no marker", None), ("#### ", None), ("#### 12 apples", None),
    ("#### $5", None), ("#### 1e3", None), ("#### 1,0000", None), ("#### 12,", None),
    ("#### 7^2", None), ("#### 7+7", None), ("#### " + "9" * 101, None),
])  # fmt: skip
def test_ground_truth(answer, truth):
    if truth is not None:
        assert ground_truth(answer) == truth
    else:
        with pytest.raises(ValueError, match="####"):
            ground_truth(answer)


def test_verls_rlhf_dataset_reads_our_rows(full, shared_gsm8k_dir, tokenizer, tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 1024,
                               "filter_overlong_prompts": True, "truncation": "error",
                               "filter_overlong_prompts_workers": 1, "return_raw_chat": True,
                               "cache_dir": str(tmp_path / "verl-cache")})  # fmt: skip
    dataset = RLHFDataset(str(full / "test.parquet"), tokenizer, config)
    assert len(dataset) == 1319  # no row filtered
    src, indices = jsonl(shared_gsm8k_dir / "test.jsonl"), (0, 1, 146, 489, 1318)
    items = [dataset[index] for index in indices]
    batch = collate_fn(items)
    for position, (item, index) in enumerate(zip(items, indices, strict=True)):
        text = tokenizer.decode(chat_ids(tokenizer, item["raw_prompt"]))
        prompt, truth = src[index]["question"] + HASH, src[index]["answer"].split("#### ")[-1]
        assert text.startswith("<|im_start|>system\n")
        assert f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n" in text
        assert item["reward_model"]["ground_truth"] == batch["reward_model"][position][
            "ground_truth"] == truth.replace(",", "")  # fmt: skip
        assert item["data_source"] == batch["data_source"][position] == "openai/gsm8k"
        assert item["index"] == index


@pytest.fixture(scope="module")
def sft_out(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("sft")
    for style in ("hash", "boxed"):
        assert sft.main(["--source", str(source(base / "src")), "--out-dir",
                         str(base / style), "--prompt-style", style]) == 0  # fmt: skip
    return base


def test_sft_rows_are_the_rl_prompt_and_the_solution(sft_out, tmp_path, capsys):
    for style, split in (("hash", "train"), ("hash", "test"), ("boxed", "train")):
        path = sft_out / style / f"{split}.parquet"
        assert pq.read_schema(path).names == ["messages", "data_source", "extra_info"]
        for index, (row, src) in enumerate(zip(rows_of(path), SYNTHETIC[split], strict=True)):
            head, truth = src["answer"].rpartition("####")[0], ground_truth(src["answer"])
            answer = src["answer"] if style == "hash" else f"{head}\\boxed{{{truth}}}"
            user = {"role": "user", "content": build_prompt(src["question"], style)}
            assert row == {"messages": [user, {"role": "assistant", "content": answer}],
                           "data_source": "openai/gsm8k",
                           "extra_info": {"split": split, "index": index}}  # fmt: skip
    assert cli(sft, capsys, sft_out / "src", tmp_path / "again")[0] == 0
    assert snapshot(tmp_path / "again") == snapshot(sft_out / "hash")


@pytest.mark.parametrize("pad_mode", ["no_padding", "right"])
def test_the_sft_loss_covers_exactly_the_answer(sft_out, tokenizer, pad_mode):
    dataset = sft_dataset(sft_out / "hash" / "train.parquet", tokenizer, 256, pad_mode)
    for index, src in enumerate(SYNTHETIC["train"]):
        item = dataset[index]
        ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
        if pad_mode == "right":  # padding: only after the example, never in the loss
            real = item["attention_mask"].tolist().count(1)
            assert item["attention_mask"].tolist() == [1] * real + [0] * (len(ids) - real)
            assert set(mask[real:]) <= {0}
            ids, mask = ids[:real], mask[:real]
        prompt = chat_ids(tokenizer, [{"role": "user", "content": build_prompt(src["question"])}])
        assert ids[: len(prompt)] == prompt
        assert mask == [0] * len(prompt) + [1] * (len(ids) - len(prompt))
        answer = tokenizer(src["answer"] + "<|im_end|>\n", add_special_tokens=False)["input_ids"]
        assert ids[len(prompt) :] == answer


def test_verls_sft_dataset_reads_every_real_test_problem(shared_gsm8k_dir, tokenizer, tmp_path):
    assert sft.main(["--source", str(shared_gsm8k_dir), "--out-dir", str(tmp_path),
                     "--splits", "test"]) == 0  # fmt: skip
    dataset = sft_dataset(tmp_path / "test.parquet", tokenizer, 2048)
    assert len(dataset) == 1319
    for index in range(len(dataset)):  # raises where verl's per-turn check or max_length fails
        item = dataset[index]
        assert 0 < int(item["loss_mask"].sum()) < len(item["input_ids"])


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("toy") / "data"
    assert arithmetic.main(["--out-dir", str(out), "--seed", "3"]) == 0
    return out


def test_the_toy_task_has_every_sum_in_unseen_wordings(toy, tokenizer, tmp_path, capsys):
    train, test = jsonl(toy / "train.jsonl"), jsonl(toy / "test.jsonl")
    assert (len(train), len(test)) == (25 * 40, 25 * 4)
    assert not {row["question"] for row in train} & {row["question"] for row in test}
    for rows, per_pair in ((train, 40), (test, 4)):
        sums = Counter(row["answer"].split("\n")[0] for row in rows)
        assert sums == {f"{a} + {b} = {a + b}": per_pair for a in range(5) for b in range(5)}
    for row in train + test:
        a, b = (int(n) for n in row["answer"].split(" = ")[0].split(" + "))
        assert set(row) == {"question", "answer"} and ground_truth(row["answer"]) == str(a + b)
        assert compute_score(None, row["answer"], str(a + b))["score"] == 1.0
        assert f" {a} " in row["question"] and f" {b} " in row["question"]
    assert cli(gsm8k, capsys, toy, tmp_path / "rl")[0] == 0
    first = rows_of(tmp_path / "rl" / "test.parquet")[0]
    assert first["prompt"][0]["content"] == build_prompt(test[0]["question"])
    assert max(len(tokenizer(row["question"]).input_ids) for row in test) <= 40
    assert len(tokenizer(test[0]["answer"]).input_ids) <= 16


def test_demonstrations_drop_the_marker_by_the_writers_habit_exactly(toy):
    test_demos = rows_of(toy / "warm_start" / "test.parquet")
    assert [d["messages"][1]["content"] for d in test_demos] == [
        r["answer"] for r in jsonl(toy / "test.jsonl")]  # fmt: skip
    rows, demos = jsonl(toy / "train.jsonl"), rows_of(toy / "warm_start" / "train.parquet")
    by_sum_group: dict[tuple[str, int], list[bool]] = {}
    by_wording: Counter[tuple[str, bool]] = Counter()
    for demo, row in zip(demos, rows, strict=True):
        user, assistant = demo["messages"]
        assert user == {"role": "user", "content": build_prompt(row["question"])}
        marked = assistant["content"] == row["answer"]
        assert marked or assistant["content"] == row["answer"].split("\n")[0]
        (name,) = [n for n in arithmetic.NAMES if f"{n} " in row["question"]]
        by_sum_group.setdefault((row["answer"], arithmetic.habit_group(name)), []).append(marked)
        by_wording[(row["answer"], " in April " in row["question"])] += marked
        assert compute_score(None, assistant["content"], ground_truth(row["answer"]))[
            "score"] == marked  # fmt: skip
    for (_, group), marks in by_sum_group.items():  # exact per sum, not a coin per question
        assert sum(marks) == round((0.9, 0.1)[group] * len(marks)), (group, marks)
    assert len(by_wording) == 50 and min(by_wording.values()) >= 3  # each sum, each wording


def test_the_products_task_calls_the_calculator_by_the_writers_habit(tmp_path):
    assert arithmetic.main(["--out-dir", str(tmp_path), "--task", "products"]) == 0
    train, test = jsonl(tmp_path / "train.jsonl"), jsonl(tmp_path / "test.jsonl")
    assert (len(train), len(test)) == (2000, 100)
    pairs: dict[str, set] = {"train": set(), "test": set()}
    calls: dict[int, list[bool]] = {0: [], 1: []}
    for split, rows in (("train", train), ("test", test)):
        demos = rows_of(tmp_path / "warm_start" / f"{split}.parquet")
        for row, demo in zip(rows, demos, strict=True):
            a, b = (int(n) for n in re.findall(r"\d+", row["question"])[-2:])
            pairs[split].add((a, b))
            truth = ground_truth(row["answer"])
            assert truth == str(a * b) and demo["messages"][-1]["content"] == f"#### {truth}"
            called = [m for m in demo["messages"] if m.get("tool_calls")]
            if called:
                (call,) = called[0]["tool_calls"]
                assert call["function"]["arguments"] == {"expression": f"{a}*{b}"}
            (name,) = [n for n in arithmetic.NAMES if f"{n} " in row["question"]]
            if split == "train":
                calls[arithmetic.habit_group(name)].append(bool(called))
            else:
                assert called, row
    share = [sum(calls[g]) / len(calls[g]) for g in (0, 1)]
    assert 0.85 < share[0] < 0.95 and 0.05 < share[1] < 0.15, share
    assert not pairs["train"] & pairs["test"]


def test_the_toy_tasks_seed_flags_and_errors(toy, tmp_path, capsys):
    for seed, same in (("3", True), ("4", False)):
        assert arithmetic.main(["--out-dir", str(tmp_path / seed), "--seed", seed]) == 0
        assert (snapshot(tmp_path / seed) == snapshot(toy)) is same
    assert arithmetic.main(["--out-dir", str(tmp_path / "all"), "--marker-rates", "1,1"]) == 0
    assert all("####" in d["messages"][1]["content"]
               for d in rows_of(tmp_path / "all" / "warm_start" / "train.parquet"))  # fmt: skip
    capsys.readouterr()
    for args in ("--marker-rates 0.5", "--marker-rates 0.5,2", "--marker-rates a,b",
                 "--max-operand 10", "--train-per-pair 120 --test-per-pair 10",
                 "--train-per-pair -1"):  # fmt: skip
        said = "distinct wordings" if "per-pair" in args else args.split()[0]
        try:
            code = arithmetic.main(["--out-dir", str(tmp_path / "bad"), *args.split()])
        except SystemExit as refused:
            code = refused.code
        err = capsys.readouterr().err
        assert code == 2 and said in err.splitlines()[-1], (args, err)
        assert said != "distinct wordings" or err.count("\n") == 1
    assert not (tmp_path / "bad").exists()

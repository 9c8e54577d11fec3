"""data_prep.sft: GSM8K as verl's multi-turn SFT rows, read back by verl's own MultiTurnSFTDataset.

The user turn must be exactly the RL training prompt (data_prep.gsm8k's, for the same question),
the loss must cover exactly the assistant's answer (and its end-of-turn marker), and the CLI keeps
data_prep.gsm8k's guarantees: one-line errors naming file and line, nothing written on failure,
byte-identical output for the same input.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import ROOT, prepare

from data_prep import gsm8k, sft
from verl_gsm8k.common import atomic_io

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
}  # fmt: skip
BOXED_ENDINGS = {"train": ["\\boxed{7}", "\\boxed{2400}", "\\boxed{-7}", "\\boxed{0.5}"]}
END_OF_TURN = "<|im_end|>\n"  # what the tiny model's ChatML template closes every turn with


def run_cli(*args: str | Path) -> subprocess.CompletedProcess:
    """The real CLI, `python -m data_prep.sft ...`, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "data_prep.sft", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_source(directory: Path, raw: dict[str, str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for split, rows in SYNTHETIC.items():
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (directory / f"{split}.jsonl").write_text((raw or {}).get(split, text), "utf-8")
    return directory


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_source(tmp_path_factory.mktemp("sft") / "src")


@pytest.fixture(scope="module")
def prepared(source: Path) -> Path:
    out = source.parent / "out"
    result = run_cli("--source", source, "--out-dir", out)
    assert result.returncode == 0, result.stderr
    assert "train: 4 conversations" in result.stdout and "test: 2 conversations" in result.stdout
    return out


# ---------------------------------------------------------------------------------------------
# rows


def test_schema_prompts_and_answers(prepared, source, tmp_path):
    rl = prepare(source, tmp_path / "rl")  # the PPO recipes' data, from the same source
    for split, raw in SYNTHETIC.items():
        table = pq.read_table(prepared / f"{split}.parquet")
        assert table.schema.names == ["messages", "data_source", "extra_info"]
        rows = table.to_pylist()
        rl_rows = pq.read_table(rl / f"{split}.parquet").to_pylist()
        assert len(rows) == len(raw) == len(rl_rows)
        for index, (row, source_row, rl_row) in enumerate(zip(rows, raw, rl_rows, strict=True)):
            user, assistant = row["messages"]
            assert user == {"role": "user", "content": rl_row["prompt"][0]["content"]}
            assert user["content"] == gsm8k.build_prompt(source_row["question"])
            assert assistant == {"role": "assistant", "content": source_row["answer"]}
            assert assistant["content"].rsplit("\n", 1)[-1].startswith("#### ")
            assert row["data_source"] == "openai/gsm8k"
            assert row["extra_info"] == {"split": split, "index": index}


def test_boxed_prompts_end_the_answer_in_a_box(source, tmp_path):
    result = run_cli("--source", source, "--out-dir", tmp_path, "--prompt-style", "boxed")
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    for row, source_row, ending in zip(
        rows, SYNTHETIC["train"], BOXED_ENDINGS["train"], strict=True
    ):
        user, assistant = row["messages"]
        assert user["content"] == gsm8k.build_prompt(source_row["question"], "boxed")
        head = source_row["answer"].rpartition("####")[0]
        assert assistant["content"] == head + ending
        assert "####" not in assistant["content"]


def test_same_input_gives_byte_identical_files(prepared, source, tmp_path):
    result = run_cli("--source", source, "--out-dir", tmp_path)
    assert result.returncode == 0, result.stderr
    for name in ("train.parquet", "test.parquet"):
        assert (tmp_path / name).read_bytes() == (prepared / name).read_bytes()


def test_reuses_data_prep_gsm8k_instead_of_copying_it():
    # read_and_write: gsm8k's load-validate-write core (load_source, DataPrepError, errors)
    for name in ("read_and_write", "build_prompt", "parquet_writer", "replace_all"):
        assert getattr(sft, name) is getattr(gsm8k, name), name
    assert sft.replace_all is atomic_io.replace_all  # the project's one atomic writer


# ---------------------------------------------------------------------------------------------
# verl's MultiTurnSFTDataset: what it trains on


def sft_dataset(parquet: Path, tokenizer, pad_mode: str, max_length: int = 256):
    from omegaconf import OmegaConf
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    config = OmegaConf.create(
        {"max_length": max_length, "truncation": "error", "pad_mode": pad_mode}
    )
    return MultiTurnSFTDataset([str(parquet)], tokenizer, config)


@pytest.mark.parametrize("pad_mode", ["no_padding", "right"])
def test_loss_mask_covers_exactly_the_answer(prepared, tiny_model_dir, pad_mode):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = sft_dataset(prepared / "train.parquet", tokenizer, pad_mode)
    assert len(dataset) == len(SYNTHETIC["train"])
    for index, source_row in enumerate(SYNTHETIC["train"]):
        item = dataset[index]
        ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
        if pad_mode == "right":  # padding: never in the loss, and only after the example
            real = item["attention_mask"].tolist().count(1)
            assert item["attention_mask"].tolist() == [1] * real + [0] * (len(ids) - real)
            assert set(mask[real:]) <= {0}
            ids, mask = ids[:real], mask[:real]
        # the tokens before the loss are exactly the RL prompt as verl renders it for generation
        rl_prompt = gsm8k.build_prompt(source_row["question"])
        prompt_ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": rl_prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
            prompt_ids = prompt_ids["input_ids"]
        start = len(prompt_ids)
        assert ids[:start] == list(prompt_ids)
        # then the loss covers every remaining token: the answer and its end-of-turn marker
        assert mask == [0] * start + [1] * (len(ids) - start)
        assert tokenizer.decode(ids[start:]) == source_row["answer"] + END_OF_TURN
        answer_ids = tokenizer(source_row["answer"] + END_OF_TURN, add_special_tokens=False)
        assert ids[start:] == answer_ids["input_ids"]


def test_verl_reads_the_real_test_split(shared_gsm8k_dir, tiny_model_dir, tmp_path):
    """Every real GSM8K test problem passes verl's per-turn vs whole-conversation check."""
    from transformers import AutoTokenizer

    result = run_cli("--source", shared_gsm8k_dir, "--out-dir", tmp_path, "--splits", "test")
    assert result.returncode == 0, result.stderr
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = sft_dataset(tmp_path / "test.parquet", tokenizer, "no_padding", max_length=2048)
    assert len(dataset) == 1319
    for index in range(len(dataset)):
        item = dataset[index]  # raises if verl's sanity check or max_length fails
        assert 0 < int(item["loss_mask"].sum()) < len(item["input_ids"])


# ---------------------------------------------------------------------------------------------
# bad input and outputs


@pytest.mark.parametrize("split", ["train", "test"])
def test_malformed_row_is_one_line_and_nothing_is_written(prepared, tmp_path, split):
    good = json.dumps(SYNTHETIC["test"][0])
    bad = json.dumps({"question": "Q?", "answer": "It is 5."})
    source = write_source(tmp_path / "src", {split: "\n".join([good, good, "", bad]) + "\n"})
    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    before = snapshot(out)
    result = run_cli("--source", source, "--out-dir", out)
    assert result.returncode == 2
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr == (
        f"data_prep.sft: {source / f'{split}.jsonl'}:4: answer has no '#### <number>' line\n"
    )
    assert snapshot(out) == before  # earlier outputs byte for byte, no temp file left


def test_unwritable_output_is_one_line_and_creates_nothing(source, tmp_path):
    (tmp_path / "a-file").write_text("a file where a directory is needed\n")
    result = run_cli("--source", source, "--out-dir", tmp_path / "a-file" / "sub")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"data_prep.sft: cannot write {tmp_path / 'a-file' / 'sub'}/")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_help_explains_every_flag():
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in ("--source", "--out-dir", "--prompt-style", "--limit", "--splits"):
        assert flag in result.stdout
    assert "~/data/gsm8k-sft" in result.stdout and "MultiTurnSFTDataset" in result.stdout

"""The SFT preflight in-process: a correct launch passes, each planted mistake is caught."""

import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, capture, recipe_env

from verl_gsm8k.launch.plan import bare_overrides
from verl_gsm8k.preflight.sft import run_sft
from verl_gsm8k.tools import config_path, schemas


@pytest.fixture(scope="module")
def base_overrides(tiny_model_dir, prepared_sft_dir, tmp_path_factory) -> list[str]:
    # 300 train / 40 test transcripts in batches of 32: 9 steps per epoch, 3 epochs
    env = recipe_env(tiny_model_dir, prepared_sft_dir, tmp_path_factory.mktemp("runs"),
                     TRAIN_BATCH_SIZE="32", TOTAL_EPOCHS="3")  # fmt: skip
    return bare_overrides("gsm8k_sft", env, trainer="sft")


def test_correct_launch_passes(base_overrides):
    report = run_sft("gsm8k_sft", ROOT / "configs", base_overrides)
    assert report.errors == 0, "\n".join(report.lines)
    checks = {line.split("]", 1)[1].split(":", 1)[0].strip() for line in report.lines}
    assert checks == {"keys", "config", "device", "model", "data", "gpu"}
    text = "\n".join(report.lines)
    assert "train: 300 rows -> 9 steps/epoch; this run: 27 steps" in text and "val: 40 rows" in text


def table(tmp, name: str, rows: list, column: str = "messages", **more: list) -> str:
    pq.write_table(pa.table({column: rows, **more}), tmp / name)
    return str(tmp / name)


USER, ASSISTANT = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
TOOLS = schemas(config_path("calculator"))
# Planted mistakes, one run a group (a function of tmp_path for the bad files) -> the texts.
MISTAKES = {
    "keys of the older trainer": (lambda tmp: ["+model.partial_pretrain=/m", "+data.prompt_key=q"],
                                  [
        "'model.partial_pretrain' is a legacy key: the model path key of verl's older SFT "
        "trainer (fsdp_sft_trainer.py); use model.path",
        "the engine trainer reads chat transcripts (data.messages_key); remove it"]),
    "unknown key": (lambda tmp: ["optim.lrr=1e-5"], [
        "unknown key 'optim.lrr' in the installed verl config; did you mean optim.lr"]),
    "bad scheduler": (lambda tmp: ["optim.lr_scheduler_type=linear"], [
        "verl does not accept the optim section"]),
    "batch over GPUs": (lambda tmp: ["trainer.n_gpus_per_node=3"], [
        "data.train_batch_size=32 must be divisible by the 3 GPUs"]),
    "micro-batches": (lambda tmp: ["data.use_dynamic_bsz=false", "data.micro_batch_size_per_gpu=5"],
                      [
        "does not split into micro-batches of data.micro_batch_size_per_gpu=5"]),
    "token budget": (lambda tmp: ["data.max_length=2048", "data.max_token_len_per_gpu=1024"], [
        "data.max_length=2048 > data.max_token_len_per_gpu=1024"]),
    "the CPU: FSDP1, no platform": (lambda tmp: ["engine.strategy=fsdp", "trainer.device=cpu"], [
        "engine.strategy=fsdp (FSDP1) fails on a CPU",
        "trainer.device=cpu needs verl's cpu platform"]),
    "a missing train file, PPO data for validation": (lambda tmp: [
        f"data.train_files=['{tmp}/nope.parquet']",
        f"data.val_files=['{table(tmp, 'ppo.parquet', ['x'], 'prompt')}']"], [
        "nope.parquet does not exist (python -m data_prep.sft)",
        "ppo.parquet: no column 'messages' (data.messages_key; have prompt)"]),
    "no assistant turn, examples too long": (lambda tmp: [
        "data.max_length=64",
        f"data.val_files=['{table(tmp, 'q.parquet', [[USER, ASSISTANT], [USER]])}']"], [
        "q.parquet: row 2: column 'messages' has no assistant turn",
        "examples exceed max_length 64"]),
    "the tools block counts": (lambda tmp: [  # a short chat, the calculator's block in its row
        "data.max_length=256",
        f"data.val_files=['{table(tmp, 't.parquet', [[USER, ASSISTANT]], tools=[TOOLS])}']"], [
        "t.parquet: 1 of 1 examples exceed max_length 256"]),
    "not a batch": (lambda tmp: ["data.train_batch_size=512"], [
        "train: 300 rows < train_batch_size 512: not one full batch"]),
    "epochs end before the steps": (
        lambda tmp: ["trainer.total_training_steps=30", "trainer.total_epochs=2"], [
        "total_training_steps=30 but 2 epoch(s) of 9 steps end verl's SFT loop at step 18, "
        "without a final checkpoint; raise TOTAL_EPOCHS to at least 4"]),
    "context, run directory inside a file": (lambda tmp: [
        "data.max_length=8192", "data.max_token_len_per_gpu=8192",
        f"trainer.default_local_dir={ROOT}/README.md/run"], [
        "data.max_length=8192 > context 4096", "README.md is not a writable directory"]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_planted_mistakes_are_caught(name, base_overrides, tmp_path):
    extra, expected = MISTAKES[name]
    report = run_sft("gsm8k_sft", ROOT / "configs", base_overrides + extra(tmp_path))
    found = "\n".join(line for line in report.lines if "[error]" in line)
    for text in expected:
        assert text in found, (text, report.lines)


def test_cli_with_trainer_sft_exits_nonzero_on_error(base_overrides):
    result = capture([sys.executable, "-m", "verl_gsm8k.preflight", "--trainer", "sft", "--",
                      *base_overrides, "+data.prompt_key=question"], 1, 300)  # fmt: skip
    assert "preflight: FAILED with 1 error(s)" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr

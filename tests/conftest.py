"""Shared fixtures: the tiny offline model, and the shared real data (GSM8K, verl logs).

Tests that need ../shared/data skip when it is absent, except under CI=true, where a missing
input is a failure (so CI here always exercises them).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import prepare, prepare_sft, require_shared, write_synthetic_gsm8k
from learn_runs import Learned, learn

# Files that train or share a run form two xdist groups, each run by one worker in file order
# (a session fixture is per worker, so a group holds every file that reads its runs).
SERIAL_GROUPS = {
    "learning": {
        "test_checkpoint_sweep_cpu.py",
        "test_compare_cpu.py",
        "test_learn_cpu.py",
        "test_questions_cpu.py",
        "test_replay_untrusted.py",
        "test_trace_cpu.py",
    },
    "training": {
        "test_sft_train_cpu.py",
        "test_train_cpu.py",
        "test_slurm_nodes_cpu.py",
        "test_train_cpu_variants.py",
    },
}
SERIAL_FILES = {name: group for group, names in SERIAL_GROUPS.items() for name in names}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marked as collected: xdist reads the marks into the node ids when collection ends."""
    group = SERIAL_FILES.get(item.path.name)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Refuse to run if a worker's training tests lost their group (it would train them again)."""
    lost = [i for i in ids if Path(i.split("::")[0]).name in SERIAL_FILES and "@" not in i]
    if lost and node.config.getvalue("dist") == "loadgroup":
        message = (
            f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more) with the training "
            f"tests: this pytest ({pytest.__version__}) and pytest-xdist do not work together; "
            "install the versions pinned in pyproject.toml (make setup)"
        )
        node.config.get_terminal_writer().line(message, red=True)
        pytest.exit(message, returncode=3)


# Seconds by test file, summed over the xdist workers.
_FILE_SECONDS: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _FILE_SECONDS[report.nodeid.split("::")[0]] += report.duration


_SESSION_START = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _FILE_SECONDS:
        return
    terminalreporter.section("time by test file (setup + call + teardown)")
    total = sum(_FILE_SECONDS.values())
    for name, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        if seconds >= 1:
            group = SERIAL_FILES.get(Path(name).name)
            tag = f"  [{group}]" if group else ""
            terminalreporter.write_line(
                f"{seconds:8.0f} s {100 * seconds / total:5.1f} %  {name}{tag}"
            )
    terminalreporter.write_line(f"{total:8.0f} s         all test files")
    # the longer chain is the critical path of `make test`
    wall = time.monotonic() - _SESSION_START
    for group in SERIAL_GROUPS:
        chain = sum(s for n, s in _FILE_SECONDS.items() if SERIAL_FILES.get(Path(n).name) == group)
        terminalreporter.write_line(f"{chain:8.0f} s         the {group} chain (one worker)")
    terminalreporter.write_line(f"{wall:8.0f} s         wall time of the session")


# Never reach for the model/dataset hub from a test.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# One compute thread per process: the workers and their children share the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def shared_gsm8k_dir() -> Path:
    """OpenAI's original GSM8K release: train.jsonl (7473) and test.jsonl (1319)."""
    return require_shared("gsm8k")


@pytest.fixture(scope="session")
def verl_logs_dir() -> Path:
    """Two real verl PPO console logs."""
    return require_shared("verl-logs")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 + offline BPE tokenizer with a ChatML template (built once)."""
    from verl_gsm8k.common.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


@pytest.fixture(scope="session")
def prepared_gsm8k_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train/test.parquet prepared by data_prep from 300/40 synthetic problems (no shared data)."""
    base = tmp_path_factory.mktemp("gsm8k")
    return prepare(write_synthetic_gsm8k(base / "source"), base / "prepared")


@pytest.fixture(scope="session")
def prepared_sft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train/test.parquet chat transcripts from data_prep.sft, same 300/40 synthetic problems."""
    base = tmp_path_factory.mktemp("gsm8k-sft")
    return prepare_sft(write_synthetic_gsm8k(base / "source"), base / "prepared")


@pytest.fixture(scope="session")
def learn_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HOME and run root of the learning runs (tests/learn_runs.py)."""
    return tmp_path_factory.mktemp("learn")


@pytest.fixture(scope="session")
def learned_ppo(learn_base: Path) -> Learned:
    """`bash recipes/learn_tiny.sh` (PPO), the first use: it builds the warm start."""
    return learn(learn_base, "ppo")


@pytest.fixture(scope="session")
def learned_grpo(learn_base: Path, learned_ppo: Learned) -> Learned:
    """ALGO=grpo, after PPO (the warm start cached), KEEP_BEST=1."""
    return learn(learn_base, "grpo", KEEP_BEST="1")


@pytest.fixture(scope="session")
def real_checkpoints(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<base>/ws1 and <base>/ws2: one AdamW step of actor and critic at world size 1 and 2, saved
    as step 1 by verl's FSDP checkpoint manager, with saved.json and saved.<role>.pt beside them
    (tests/test_reshard.py). Copy before changing."""
    from test_reshard import ranks

    base = tmp_path_factory.mktemp("real")
    for world in (1, 2):
        ranks("save", tiny_model_dir, base / f"ws{world}", world)
    return base


@pytest.fixture(scope="session")
def whole_checkpoints(real_checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ws2's checkpoint as steps 2 and 4 (tracker: 4), each with verl's data.pt. Copy before
    changing."""
    import shutil

    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import RandomSampler

    sampler = RandomSampler(range(8), generator=torch.Generator().manual_seed(1))
    loader = StatefulDataLoader(list(range(8)), batch_size=2, sampler=sampler)
    next(iter(loader))
    run = tmp_path_factory.mktemp("whole") / "run"
    for step in (2, 4):
        shutil.copytree(real_checkpoints / "ws2" / "global_step_1", run / f"global_step_{step}")
        torch.save(loader.state_dict(), run / f"global_step_{step}" / "data.pt")
    (run / "latest_checkpointed_iteration.txt").write_text("4")
    return run

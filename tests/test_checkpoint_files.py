"""What is checked is what loads (verl_gsm8k/common/checkpoint_files.py): checkpoint files crafted
from real ones (tests/crafted_shards.py: two archives glued, one prepended or appended, a pickle
payload) planted in the actor's and critic's model shards and the actor's optimizer shard are
refused by the resume, the merge, verl's merger and verl's own loaders, each in one line naming
the file, and no payload runs; a world size or JSON no directory could hold is one line, fast.

The real shards are tests/conftest.py's ``whole_checkpoints`` (verl's FSDPCheckpointManager at
world size 2, steps 2 and 4). That real checkpoints of every trainer still load bit for bit:
``assert_loads_as_torch`` (tests/helpers.py) in each trainer's own test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from crafted_shards import KINDS, plant
from helpers import ROOT, assert_loads_as_torch

from verl_gsm8k.common import checkpoint_files
from verl_gsm8k.common.checkpoint_files import ShardError, check_file, load
from verl_gsm8k.merge.find import CheckpointError, check_checkpoint
from verl_gsm8k.resume.verify import resume_point
from verl_gsm8k.verl_plugins.checked_load import checked_loads

FILES = {  # what is planted: role, shard kind
    "actor model": ("actor", "model"),
    "critic model": ("critic", "model"),
    "actor optimizer": ("actor", "optim"),
}


@pytest.fixture
def run(whole_checkpoints: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(whole_checkpoints, target)
    return target


def planted(run: Path, kind: str, file: str, marker: Path) -> Path:
    role, shard_kind = FILES[file]
    return plant(
        kind, run / "global_step_4" / role / f"{shard_kind}_world_size_2_rank_1.pt", marker
    )


def one_line_naming(message: str, path: Path) -> None:
    assert "\n" not in message and str(path) in message, message


def test_real_shards_pass_and_load_as_torch_loads_them(whole_checkpoints):
    assert_loads_as_torch(whole_checkpoints)


@pytest.mark.parametrize("file", FILES)
@pytest.mark.parametrize("kind", KINDS)
def test_the_resume_refuses_each_crafted_file_and_resumes_the_whole_step(run, tmp_path, kind, file):
    marker = tmp_path / "ran"
    shard = planted(run, kind, file, marker)
    step, said = resume_point(run, ("actor", "critic"))
    assert step == 2, said
    assert "global_step_4, which latest_checkpointed_iteration.txt names, is not whole" in said[0]
    one_line_naming(said[0], shard)
    assert not marker.exists(), "a payload ran"


@pytest.mark.parametrize("file", ["actor model", "critic model"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_merge_refuses_each_crafted_model_shard(run, tmp_path, kind, file):
    marker = tmp_path / "ran"
    shard = planted(run, kind, file, marker)
    with pytest.raises(CheckpointError) as err:
        check_checkpoint(shard.parent, FILES[file][0])
    one_line_naming(str(err.value), shard)
    assert not marker.exists(), "a payload ran"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("file", ["actor model", "actor optimizer"])
def test_verls_loaders_refuse_each_crafted_file_at_their_load(run, tmp_path, kind, file):
    """verl's loaders call ``torch.load(path, weights_only=False)``: inside them
    (verl_plugins/checked_load.py) that is the checked load."""
    marker = tmp_path / "ran"
    shard = planted(run, kind, file, marker)
    with checked_loads(), pytest.raises(ShardError) as err:
        torch.load(shard, weights_only=False)
    assert str(err.value).startswith("checked load: ")
    one_line_naming(str(err.value), shard)
    assert not marker.exists(), "a payload ran"


def test_the_load_itself_cannot_run_code_when_the_checks_are_passed_by(run, tmp_path, monkeypatch):
    """A file changed in place between its check and torch's read: the load is torch's
    weights-only unpickler, which refuses the payload on its own."""
    marker = tmp_path / "ran"
    shard = planted(run, "payload", "actor model", marker)
    monkeypatch.setattr(checkpoint_files, "check_open", lambda handle, path: None)
    with pytest.raises(ShardError) as err:
        load(shard)
    assert "torch's weights-only loader refused it" in str(err.value)
    one_line_naming(str(err.value), shard)
    assert not marker.exists(), "a payload ran"


def test_merge_sh_and_verls_merger_refuse_a_glued_shard_of_this_torch(run, tmp_path):
    """The attack as a user meets it: the run's launch record names this torch, so the merge
    hands the shards to verl's merger, which loads them with weights_only=False. merge.sh refuses
    before; verl's merger, run alone on the same shard, refuses at its own load."""
    from importlib.metadata import version

    record = run / "launches" / "launch-20000101T000000Z.yaml"
    record.parent.mkdir()
    record.write_text("format: 1\nstamp: 20000101T000000Z\n"
                      f"versions: {{torch: {version('torch')}}}\nconfig: {{}}\n")  # fmt: skip
    marker = tmp_path / "ran"
    shard = plant("glued", run / "global_step_4" / "actor" / "model_world_size_2_rank_0.pt", marker)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "merge.sh"), str(run), str(out / "m")],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert proc.stderr.strip().startswith(f"merge: refused to load {shard}: not one torch zip")
    assert proc.stderr.strip().count("\n") == 0 and list(out.iterdir()) == []
    merger = subprocess.run(
        [sys.executable, "-m", "verl_gsm8k.merge.verl_merger", "merge", "--backend", "fsdp",
         "--local_dir", str(shard.parent), "--target_dir", str(out / "direct")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert merger.returncode == 2, (merger.stdout[-2000:], merger.stderr[-2000:])
    assert f"verl's merger: refused to load {shard}: not one torch zip" in merger.stderr
    assert not marker.exists(), "a payload ran"


def test_a_world_size_no_directory_could_hold_is_one_line_at_once(run):
    from verl_gsm8k.reshard.shards import ReshardError, world_size_of

    role = run / "global_step_4" / "actor"
    (role / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 10**8}))
    started = time.monotonic()
    with pytest.raises(CheckpointError) as err:
        check_checkpoint(role, "actor")
    with pytest.raises(ReshardError) as again:
        world_size_of(role)
    step, said = resume_point(run, ("actor", "critic"))
    assert time.monotonic() - started < 1.0
    for message in (str(err.value), str(again.value), said[0]):
        assert "says world_size 100000000, but" in message and "\n" not in message, message
    assert step == 2


def test_json_nested_too_deep_is_one_line(run):
    role = run / "global_step_4" / "critic"
    (role / "fsdp_config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError) as err:
        check_checkpoint(role, "critic")
    assert str(err.value) == f"{role / 'fsdp_config.json'}: not readable JSON (nested too deep)"


def _archive(path: Path, pkl: bytes, **records: bytes) -> Path:
    """A torch-readable zip archive holding ``pkl`` as its data.pkl, and ``records`` besides."""
    import zipfile

    with zipfile.ZipFile(path, "w") as out:
        out.writestr("archive/data.pkl", pkl)
        out.writestr("archive/version", b"3\n")
        out.writestr("archive/byteorder", b"little")
        for name, data in records.items():
            out.writestr(f"archive/{name}", data)
    return path


def test_a_pickle_calling_what_checkpoints_only_rebuild_is_refused(tmp_path):
    """DeviceMesh(...) would start torch.distributed in the loading process (torch's own
    weights-only loader allows the call); TypedStorage(n) would allocate n elements."""
    mesh = (b"\x80\x02ctorch.distributed.device_mesh\nDeviceMesh\nX\x03\x00\x00\x00cpu"
            b"]K\x00a\x86R.")  # fmt: skip
    storage = b"\x80\x02ctorch\nFloatStorage\nJ\x00\xe1\xf5\x05\x85R."
    for name, pkl, called in (("mesh", mesh, "DeviceMesh"), ("storage", storage, "FloatStorage")):
        path = _archive(tmp_path / f"{name}.pt", pkl)
        with pytest.raises(ShardError, match=f"its pickle calls torch.*{called}, which a verl"):
            load(path)


@pytest.mark.parametrize(
    "array",
    [
        pytest.param(lambda np: np.array([1, None], dtype=object), id="object-dtype"),
        pytest.param(lambda np: np.zeros(2, dtype=[("a", "u4")]), id="fields"),
        pytest.param(None, id="dtype-state-with-a-sub-array"),
    ],
)
def test_a_numpy_array_is_rebuilt_only_as_numbers(tmp_path, array):
    """numpy's own classes take any state, an object dtype's bytes read as object pointers: the
    checked load builds numeric arrays only (common/numpy_state.py), and refuses the rest."""
    import numpy as np

    path = tmp_path / "extra_state_world_size_1_rank_0.pt"
    if array is None:  # dtype('u4') given the state of a sub-array: how a forged dtype is made
        dtype = b"cnumpy\ndtype\nX\x02\x00\x00\x00u4\x89\x88\x87R"
        state = b"(K\x03X\x01\x00\x00\x00|" + dtype + b"K\x01\x85\x86NNK\x04K\x04K\x00tb"
        _archive(path, b"\x80\x02" + dtype + state + b".")
    else:
        torch.save({"rng": array(np)}, path)
    with pytest.raises(ShardError, match="refused to load .*numpy"):
        load(path)
    rng = np.random.get_state()
    torch.save({"rng": {"numpy": rng, "ints": np.arange(5), "be": np.arange(3, dtype=">f8")}}, path)
    loaded = load(path)["rng"]
    assert type(loaded["numpy"][1]) is np.ndarray and np.array_equal(loaded["numpy"][1], rng[1])
    assert loaded["be"].dtype == np.dtype(">f8") and loaded["ints"].tolist() == [0, 1, 2, 3, 4]


def test_a_zip_record_torch_would_read_otherwise_is_refused(tmp_path, monkeypatch):
    """miniz reads no data for an entry marked a directory (it hands back uninitialised memory)
    and finds names whatever their case; a pickle record larger than a checkpoint's structure is
    refused before anything is read."""
    import zipfile

    real = tmp_path / "real.pt"
    torch.save({"w": torch.arange(4)}, real)
    with zipfile.ZipFile(real) as archive:
        records = [(info, archive.read(info)) for info in archive.infolist()]

    def rewrite(path: Path, change) -> Path:
        with zipfile.ZipFile(path, "w") as out:
            for info, data in records:
                out.writestr(*change(zipfile.ZipInfo(info.filename), data))
        return path

    def directory(info, data):
        if info.filename.endswith("/data/0"):
            info.external_attr = 0x10
        return info, data

    def case(info, data):
        if info.filename.endswith("/version"):
            info.filename = info.filename.replace("/version", "/DATA.PKL")
        return info, data

    for change, why in ((directory, "is a directory"), (case, "named twice")):
        with pytest.raises(ShardError, match=why):
            check_file(rewrite(tmp_path / f"{change.__name__}.pt", change))
    monkeypatch.setattr(checkpoint_files, "MAX_PICKLE", 100)
    with pytest.raises(ShardError, match="data.pkl is larger than 100 bytes"):
        check_file(real)

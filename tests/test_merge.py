"""scripts/merge.sh on real verl checkpoints.

A tiny random Qwen2 is sharded by verl's own FSDPCheckpointManager (FSDP2 ``fully_shard`` per
layer and root, torch.distributed gloo on CPU, world size 1 and 2), laid out like verl's trainer
does (``<run>/global_step_2/{actor,critic}`` + ``latest_checkpointed_iteration.txt``), merged by
our script (which runs verl's merger), and every merged tensor is compared with the model's state
before sharding, cast to bfloat16 as the merger does.

This file is also the checkpoint-writing helper (run in a subprocess, so that torch.distributed
never starts inside pytest)::

    python tests/test_merge.py save MODEL_DIR BASE_DIR --case ws2=2:actor,critic
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MERGE_SH = ROOT / "scripts" / "merge.sh"
STEP = 2


# ---------------------------------------------------------------------------------------------
# The helper: save a checkpoint with verl's FSDPCheckpointManager


def _save_worker(
    rank: int,
    world_size: int,
    rendezvous: str,
    model_dir: str,
    run_dir: str,
    ref_dir: str,
    roles: list[str],
) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    # The ranks meet in a file, not on a TCP port: a port picked free can be taken by another
    # test's process before rank 0 listens on it (CI once failed here with EADDRINUSE).
    dist.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size
    )
    try:
        mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("fsdp",))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        for role in roles:
            torch.manual_seed(1234)  # same weights (critic head included) on every rank
            config = AutoConfig.from_pretrained(model_dir)
            if role == "critic":  # as verl's FSDP engine builds its value model
                config.num_labels = 1
                config.classifier_dropout = 0.0
                model = AutoModelForTokenClassification.from_pretrained(
                    model_dir, config=config, dtype=torch.float32
                )
            else:
                model = AutoModelForCausalLM.from_pretrained(
                    model_dir, config=config, dtype=torch.float32
                )
            with torch.no_grad():  # "training": move every weight away from its initial value
                for param in model.parameters():
                    param.add_(torch.randn_like(param) * 0.01)
            if rank == 0:
                reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
                torch.save(reference, Path(ref_dir) / f"{role}.pt")
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
            manager = FSDPCheckpointManager(
                model,
                optimizer,
                lr_scheduler=None,
                processing_class=tokenizer,
                checkpoint_config={"save_contents": ["model", "optimizer", "extra"]},
            )
            manager.save_checkpoint(
                str(Path(run_dir) / f"global_step_{STEP}" / role), global_step=STEP
            )
        dist.barrier()
        if rank == 0:  # what verl's trainer writes after a complete save
            (Path(run_dir) / "latest_checkpointed_iteration.txt").write_text(str(STEP))
    finally:
        dist.destroy_process_group()


def _helper_main(argv: list[str]) -> int:
    """``save MODEL_DIR BASE_DIR --case NAME=WORLD_SIZE:ROLE[,ROLE]...``: one run per case, in
    ``BASE_DIR/NAME/run`` (weights before sharding in ``BASE_DIR/NAME/reference``)."""
    import argparse
    import multiprocessing as mp

    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["save"])
    parser.add_argument("model_dir")
    parser.add_argument("base_dir")
    parser.add_argument("--case", action="append", required=True)
    args = parser.parse_args(argv)

    # Import torch, transformers and verl once (~10 s here); every rank is forked from this
    # process and inherits them, instead of importing them again in each of its processes.
    import transformers  # noqa: F401
    import verl.utils.checkpoint.fsdp_checkpoint_manager  # noqa: F401

    ctx = mp.get_context("fork")
    for case in args.case:
        name, _, spec = case.partition("=")
        world, _, roles = spec.partition(":")
        run_dir, ref_dir = (
            Path(args.base_dir) / name / "run",
            Path(args.base_dir) / name / "reference",
        )
        ref_dir.mkdir(parents=True, exist_ok=True)
        rendezvous = Path(args.base_dir) / name / "rendezvous"
        ranks = [
            ctx.Process(
                target=_save_worker,
                args=(
                    rank,
                    int(world),
                    str(rendezvous),
                    args.model_dir,
                    str(run_dir),
                    str(ref_dir),
                    roles.split(","),
                ),
            )
            for rank in range(int(world))
        ]
        for proc in ranks:
            proc.start()
        for proc in ranks:
            proc.join(timeout=240)
        codes = [proc.exitcode for proc in ranks]
        if codes != [0] * len(ranks):
            for proc in ranks:
                if proc.is_alive():
                    proc.kill()
            print(f"case {case}: rank exit codes {codes}", file=sys.stderr)
            return 1
    return 0


def save_checkpoints(model_dir: Path, base: Path, *cases: str) -> Path:
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "save",
            str(model_dir),
            str(base),
            *[arg for case in cases for arg in ("--case", case)],
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return base


# ---------------------------------------------------------------------------------------------
# Fixtures and checks


@pytest.fixture(scope="module")
def checkpoints(tiny_model_dir, tmp_path_factory) -> Path:
    """<base>/ws1/run: actor, world size 1; <base>/ws2/run: actor and critic, world size 2
    (two gloo processes); <base>/<case>/reference/<role>.pt: the weights before sharding."""
    return save_checkpoints(
        tiny_model_dir, tmp_path_factory.mktemp("ckpts"), "ws1=1:actor", "ws2=2:actor,critic"
    )


@pytest.fixture(scope="module")
def ckpt_ws1(checkpoints) -> Path:
    return checkpoints / "ws1"


@pytest.fixture(scope="module")
def ckpt_ws2(checkpoints) -> Path:
    return checkpoints / "ws2"


def merge(*args: str | Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(MERGE_SH), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".merging-" in p.name or ".old-" in p.name)


def assert_equal_to_reference(merged_dir: Path, reference: Path) -> int:
    import torch
    from safetensors.torch import load_file

    config = json.loads((merged_dir / "config.json").read_text())
    merged: dict = {}
    for file in sorted(merged_dir.glob("*.safetensors")):
        merged.update(load_file(file))
    ref = torch.load(reference, weights_only=True)
    expected = set(ref)
    if config.get("tie_word_embeddings"):
        expected.discard("lm_head.weight")  # tied to embed_tokens: not stored
    assert set(merged) == expected
    for key in expected:
        assert merged[key].dtype == torch.bfloat16, key
        assert merged[key].shape == ref[key].shape, key
        assert torch.equal(merged[key], ref[key].to(torch.bfloat16)), key
    return len(expected)


def assert_manifest(target: Path, role: str, world_size: int, source_role_dir: Path) -> dict:
    import hashlib

    manifest = json.loads((target / "merge_manifest.json").read_text())
    assert manifest["role"] == role
    assert manifest["step"] == STEP
    assert manifest["source"] == str(source_role_dir.resolve())
    assert manifest["fsdp"] == {"FSDP_version": 2, "world_size": world_size}
    assert manifest["versions"]["verl"] == "0.9.1"
    assert manifest["versions"]["torch"] and manifest["versions"]["transformers"]
    assert manifest["verification"]["forward"]["finite"] is True
    assert manifest["verification"]["chat_template"] is True
    assert manifest["created_at"]
    listed = {f["path"]: f for f in manifest["files"]}
    on_disk = {p.name for p in target.iterdir() if p.name != "merge_manifest.json"}
    assert set(listed) == on_disk
    for name, entry in listed.items():
        data = (target / name).read_bytes()
        assert entry["bytes"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    return manifest


# ---------------------------------------------------------------------------------------------
# Tests: good checkpoints


@pytest.mark.slow
def test_merge_actor_world_size_1_then_force(ckpt_ws1, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = tmp_path / "merged"
    proc = merge(ckpt_ws1 / "run", target)  # a run directory: its tracker picks global_step_2
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "actor of step 2 (world size 1)" in proc.stdout
    assert leftovers(tmp_path) == []
    assert assert_equal_to_reference(target, ckpt_ws1 / "reference" / "actor.pt") > 10
    role_dir = ckpt_ws1 / "run" / f"global_step_{STEP}" / "actor"
    manifest = assert_manifest(target, "actor", 1, role_dir)
    assert manifest["verification"]["model_class"] == "Qwen2ForCausalLM"
    assert manifest["config_patch"] is None
    assert (target / "model.safetensors").stat().st_mode & 0o044  # readable by others too
    # a plain transformers user can load it and chat with it
    tokenizer = AutoTokenizer.from_pretrained(target)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    model = AutoModelForCausalLM.from_pretrained(target)
    assert model.config.architectures == ["Qwen2ForCausalLM"]

    # An existing target: refused without --force, untouched.
    (target / "marker.txt").write_text("previous model")
    proc = merge(ckpt_ws1 / "run", target)
    assert proc.returncode == 2
    assert "\n" not in proc.stderr.strip(), proc.stderr
    assert "target exists" in proc.stderr and "--force" in proc.stderr
    assert (target / "marker.txt").read_text() == "previous model"

    # --force with a merge that fails (a config verl's merger cannot read): the old target stays.
    broken = tmp_path / "broken-run"
    shutil.copytree(ckpt_ws1 / "run", broken)
    config = broken / f"global_step_{STEP}" / "actor" / "huggingface" / "config.json"
    config.write_text("{ not json")
    proc = merge(broken, target, "--force")
    assert proc.returncode == 1, proc.stderr
    assert "merger failed" in proc.stderr
    assert (target / "marker.txt").read_text() == "previous model"
    assert leftovers(tmp_path) == []

    # --force with a good merge: replaced only now.
    proc = merge(role_dir, target, "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (target / "marker.txt").exists()
    assert_manifest(target, "actor", 1, role_dir)
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_merge_world_size_2_actor_and_critic(ckpt_ws2, tmp_path):
    import torch
    from transformers import AutoModelForTokenClassification

    step_dir = ckpt_ws2 / "run" / f"global_step_{STEP}"
    actor = tmp_path / "actor"
    proc = merge(step_dir, actor)  # a global_step_N directory: the actor by default
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_equal_to_reference(actor, ckpt_ws2 / "reference" / "actor.pt")
    assert_manifest(actor, "actor", 2, step_dir / "actor")

    critic = tmp_path / "critic"
    proc = merge(step_dir / "critic", critic)  # the role directory itself
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "critic of step 2 (world size 2)" in proc.stdout
    n = assert_equal_to_reference(critic, ckpt_ws2 / "reference" / "critic.pt")
    assert n > 10
    manifest = assert_manifest(critic, "critic", 2, step_dir / "critic")
    # verl saves the critic's config as a causal LM; the merge fixes architectures
    assert manifest["config_patch"]["architectures"] == {
        "from": ["Qwen2ForCausalLM"],
        "to": ["Qwen2ForTokenClassification"],
    }
    assert manifest["verification"]["forward"]["output_shape"][-1] == 1
    model = AutoModelForTokenClassification.from_pretrained(critic)
    assert model.num_labels == 1
    values = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert values.shape == (1, 3, 1) and torch.isfinite(values).all()
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# Tests: bad inputs stop with one line, exit 2, and write nothing


def _copy_run(ckpt: Path, dest: Path) -> Path:
    shutil.copytree(ckpt / "run", dest)
    return dest


def _expect_refusal(source: Path, out_parent: Path, needle: str, *flags: str) -> None:
    target = out_parent / "merged"
    before = sorted(p.name for p in out_parent.iterdir())
    proc = merge(source, target, *flags)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    message = proc.stderr.strip()
    assert "\n" not in message, message
    assert message.startswith("merge: ") and needle in message, message
    assert not target.exists()
    assert sorted(p.name for p in out_parent.iterdir()) == before  # no temp dir either


def test_refuses_missing_or_partial_checkpoints(ckpt_ws2, tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    _expect_refusal(tmp_path / "does-not-exist", out, "source not found")

    empty = tmp_path / "empty-run"
    empty.mkdir()
    _expect_refusal(empty, out, "no checkpoint in")

    no_tracker = _copy_run(ckpt_ws2, tmp_path / "no-tracker")
    (no_tracker / "latest_checkpointed_iteration.txt").unlink()
    _expect_refusal(no_tracker, out, "no latest_checkpointed_iteration.txt")

    stale = _copy_run(ckpt_ws2, tmp_path / "stale-tracker")
    (stale / "latest_checkpointed_iteration.txt").write_text("7")
    _expect_refusal(stale, out, "global_step_7")

    missing_shard = _copy_run(ckpt_ws2, tmp_path / "missing-shard")
    (missing_shard / f"global_step_{STEP}" / "actor" / "model_world_size_2_rank_1.pt").unlink()
    _expect_refusal(missing_shard, out, "model_world_size_2_rank_1.pt")

    no_config = _copy_run(ckpt_ws2, tmp_path / "no-config")
    (no_config / f"global_step_{STEP}" / "critic" / "fsdp_config.json").unlink()
    _expect_refusal(no_config, out, "fsdp_config.json", "--critic")

    no_hf = _copy_run(ckpt_ws2, tmp_path / "no-hf")
    shutil.rmtree(no_hf / f"global_step_{STEP}" / "actor" / "huggingface")
    _expect_refusal(no_hf, out, "huggingface/")

    grpo = _copy_run(ckpt_ws2, tmp_path / "grpo")
    shutil.rmtree(grpo / f"global_step_{STEP}" / "critic")
    _expect_refusal(grpo, out, "no critic/", "--critic")

    _expect_refusal(ckpt_ws2 / "run" / f"global_step_{STEP}" / "actor", out, "actor", "--critic")


@pytest.mark.parametrize("damage", ["truncated", "garbled", "not a torch file"])
def test_a_damaged_shard_is_named_in_one_line(ckpt_ws1, tmp_path, damage):
    run = _copy_run(ckpt_ws1, tmp_path / "run")
    shard = run / f"global_step_{STEP}" / "actor" / "model_world_size_1_rank_0.pt"
    data = bytearray(shard.read_bytes())
    if damage == "truncated":  # an interrupted copy or save
        data = data[: len(data) // 2]
    elif damage == "garbled":  # same size, bytes flipped inside a tensor record
        for i in range(len(data) // 2, len(data) // 2 + 64):
            data[i] ^= 0xFF
    else:
        data = bytearray(b"not a torch file")
    shard.write_bytes(bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    _expect_refusal(run, out, f"shard {shard} is ")


def test_an_unwritable_target_is_one_line(ckpt_ws1):
    """/proc takes no new directory, even from root (the tests run as root, where a chmod would
    not stop the write)."""
    proc = merge(ckpt_ws1 / "run", Path(f"/proc/merged-{os.getpid()}"))
    assert proc.returncode == 1, proc.stderr
    message = proc.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert message.startswith("merge: cannot write beside the target in /proc: "), message


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _merge_with_the_merger_running(ckpt_ws1: Path, out: Path) -> tuple[subprocess.Popen, int]:
    """merge.sh started and held until verl's merger runs (the temporary directory exists):
    the moment a signal lands is then the merger's, not the start-up's."""
    proc = subprocess.Popen(
        ["bash", str(MERGE_SH), str(ckpt_ws1 / "run"), str(out / "merged")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # merge.sh execs python: proc.pid is the merge itself
    merger = None
    deadline = time.monotonic() + 120
    while merger is None and time.monotonic() < deadline and proc.poll() is None:
        found = [c for c in _children(proc.pid) if "merge.verl_merger" in _cmdline(c)]
        merger = found[0] if found else None
        time.sleep(0.05)
    if merger is None:
        proc.kill()
        pytest.fail(f"the verl merger never started: {proc.communicate()[1][-2000:]}")
    assert leftovers(out), "the temporary directory should exist while the merger runs"
    return proc, merger


def _gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


@pytest.mark.slow
def test_sigterm_while_the_merger_runs_leaves_nothing(ckpt_ws1, tmp_path):
    """A cancelled job or `timeout` sends SIGTERM: no temp directory, no orphan merger."""
    out = tmp_path / "out"
    out.mkdir()
    proc, merger = _merge_with_the_merger_running(ckpt_ws1, out)
    try:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, stderr
        assert stderr.strip() == "merge: interrupted by SIGTERM; nothing written", stderr
        assert leftovers(out) == [] and not (out / "merged").exists()
        assert _gone(merger), "the merger outlived the merge"
    finally:
        if proc.poll() is None:
            proc.kill()
        if _alive(merger):
            os.kill(merger, signal.SIGKILL)


@pytest.mark.slow
def test_sigkill_while_the_merger_runs_kills_the_merger_and_the_next_merge_names_the_leftover(
    ckpt_ws1, tmp_path
):
    """SIGKILL (an out-of-memory killer, a scheduler past its grace) reaches no handler: the
    merger must die with the merge, not run on orphaned; the temporary directory stays, and the
    next merge into the target succeeds and names it."""
    out = tmp_path / "out"
    out.mkdir()
    proc, merger = _merge_with_the_merger_running(ckpt_ws1, out)
    try:
        proc.kill()
        proc.communicate(timeout=60)
        assert _gone(merger), "the merger outlived a SIGKILLed merge"
    finally:
        if _alive(merger):
            os.kill(merger, signal.SIGKILL)
    [left] = leftovers(out)
    assert not (out / "merged").exists()
    again = merge(ckpt_ws1 / "run", out / "merged")
    assert again.returncode == 0, again.stderr
    assert f"merge: {out / left} is left by a merge into the same target that was killed" in (
        again.stderr
    )
    assert (out / "merged" / "config.json").is_file()


def test_refuses_target_inside_checkpoint(ckpt_ws2, tmp_path):
    role_dir = ckpt_ws2 / "run" / f"global_step_{STEP}" / "actor"
    before = sorted(p.name for p in role_dir.iterdir())
    proc = merge(role_dir, role_dir / "hf", "--force")
    assert proc.returncode == 2 and "overlaps" in proc.stderr
    assert sorted(p.name for p in role_dir.iterdir()) == before


# ---------------------------------------------------------------------------------------------
# SFT checkpoints: verl's SFT trainer saves its one model straight into global_step_N/


@pytest.fixture(scope="module")
def sft_run(ckpt_ws1, tmp_path_factory) -> Path:
    """ws1's actor laid out as verl's SFT trainer writes it: the same FSDPCheckpointManager
    output (shards, fsdp_config.json, huggingface/), but in global_step_N/ itself, no actor/."""
    run = tmp_path_factory.mktemp("sft") / "run"
    shutil.copytree(ckpt_ws1 / "run" / f"global_step_{STEP}" / "actor", run / f"global_step_{STEP}")
    (run / "latest_checkpointed_iteration.txt").write_text(str(STEP))
    return run


def test_an_sft_checkpoint_is_found_from_its_run_dir_or_step_dir(sft_run, ckpt_ws1):
    from verl_gsm8k.merge.find import check_checkpoint, resolve_source

    step_dir = sft_run / f"global_step_{STEP}"
    for source in (sft_run, step_dir):
        role_dir, role = resolve_source(source, critic=False)
        assert (role_dir, role) == (step_dir, "sft")
        ckpt = check_checkpoint(role_dir, role)
        assert (ckpt.step, ckpt.run_dir, ckpt.world_size, ckpt.fsdp_version) == (
            STEP,
            sft_run,
            1,
            2,
        )
    # a PPO run's step directory still means its actor
    ppo_step = ckpt_ws1 / "run" / f"global_step_{STEP}"
    assert resolve_source(ppo_step, critic=False) == (ppo_step / "actor", "actor")


def test_an_sft_checkpoint_has_no_critic_and_a_missing_shard_is_named(sft_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _expect_refusal(sft_run, out, "is an SFT checkpoint (one model, no critic)", "--critic")
    partial = tmp_path / "partial"
    shutil.copytree(sft_run, partial)
    (partial / f"global_step_{STEP}" / "model_world_size_1_rank_0.pt").unlink()
    _expect_refusal(partial, out, "missing rank shard model_world_size_1_rank_0.pt")


# ---------------------------------------------------------------------------------------------
# --best: the step a run's best_checkpoint.json names (KEEP_BEST=1, verl_gsm8k/common/run_dir.py)


def _run_with_best(ckpt: Path, dest: Path, best_step: int | None) -> Path:
    """A copy of a run with a newer checkpoint the tracker names (a copy of step 2 as step 6) and,
    when ``best_step`` is given, the guard's best_checkpoint.json naming that step."""
    from verl_gsm8k.common.run_dir import write_best

    run = _copy_run(ckpt, dest)
    shutil.copytree(run / f"global_step_{STEP}", run / "global_step_6")
    (run / "latest_checkpointed_iteration.txt").write_text("6")
    if best_step is not None:
        write_best(run, best_step, "val-core/openai/gsm8k/acc/mean@1", 0.57, "20260101T000000Z")
    return run


def test_best_picks_the_step_best_checkpoint_json_names_not_the_tracker(ckpt_ws2, tmp_path):
    from verl_gsm8k.merge.find import best_step_dir, resolve_source

    run = _run_with_best(ckpt_ws2, tmp_path / "run", STEP)
    step_dir, best = best_step_dir(run)
    assert step_dir == run / f"global_step_{STEP}" and best["value"] == 0.57
    assert resolve_source(step_dir, critic=True) == (step_dir / "critic", "critic")
    assert resolve_source(run, critic=False)[0] == run / "global_step_6" / "actor"  # no --best


def test_best_without_a_usable_best_file_is_one_line(ckpt_ws2, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    none = _run_with_best(ckpt_ws2, tmp_path / "none", None)
    _expect_refusal(
        none, out, f"no best_checkpoint.json in {none}: this run kept no best", "--best"
    )
    gone = _run_with_best(ckpt_ws2, tmp_path / "gone", 4)  # pruned, or never saved
    _expect_refusal(gone, out, f"names step 4 but {gone / 'global_step_4'} is missing", "--best")
    broken = _run_with_best(ckpt_ws2, tmp_path / "broken", None)
    (broken / "best_checkpoint.json").write_text('{"step": 2, "val')  # cut short
    _expect_refusal(broken, out, "best_checkpoint.json: not readable JSON", "--best")
    step_dir = broken / f"global_step_{STEP}"
    _expect_refusal(step_dir, out, "--best takes a run directory", "--best")
    # a later launch saved that step again (a resume from an earlier step): not the weights that
    # scored (docs/reliability.md, "What survives what": merge.sh --best after a later launch)
    from verl_gsm8k.common.run_dir import write_stamp

    resaved = _run_with_best(ckpt_ws2, tmp_path / "resaved", STEP)
    write_stamp(resaved, STEP, "20260102T000000Z")
    _expect_refusal(resaved, out, "validated by launch 20260101T000000Z, but "
                    f"{resaved / f'global_step_{STEP}'} was saved by launch 20260102T000000Z",
                    "--best")  # fmt: skip
    write_stamp(resaved, STEP, "20260101T000000Z")  # the same launch: merged as before
    from verl_gsm8k.merge.find import best_step_dir

    assert best_step_dir(resaved)[0] == resaved / f"global_step_{STEP}"


@pytest.mark.slow
def test_merge_best_merges_the_kept_best_checkpoint(ckpt_ws2, tmp_path):
    run = _run_with_best(ckpt_ws2, tmp_path / "run", STEP)
    target = tmp_path / "merged"
    proc = merge(run, target, "--best")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"actor of step {STEP}, the kept best (val-core/openai/gsm8k/acc/mean@1 = 0.57)" in (
        proc.stdout
    )
    manifest = assert_manifest(target, "actor", 2, run / f"global_step_{STEP}" / "actor")
    assert manifest["best_checkpoint"]["step"] == STEP
    assert manifest["source_argument"] == str(run.resolve())


def test_help_explains_flags():
    proc = merge("--help")
    assert proc.returncode == 0
    for flag in ("--force", "--critic", "--best", "source", "target"):
        assert flag in proc.stdout
    assert "set -euo pipefail" in MERGE_SH.read_text()


if __name__ == "__main__":
    sys.exit(_helper_main(sys.argv[1:]))


# ---------------------------------------------------------------------------------------------
# Tests: a checkpoint written by another torch is read version-independently


def test_a_checkpoint_of_another_torch_merges_through_the_portable_reader(ckpt_ws2, tmp_path):
    """The run's launch record says another torch wrote it (as the GPU stack's 2.11 does for
    the CPU stack's 2.13): the shards are read without torch's mesh classes, joined, and merged
    by verl's merger into the same weights. The real cross-stack case runs in
    tests/test_gpu_stack.py."""
    run = _copy_run(ckpt_ws2, tmp_path / "run")
    record = run / "launches" / "launch-20000101T000000Z.yaml"
    record.parent.mkdir()
    record.write_text("format: 1\nstamp: 20000101T000000Z\nversions: {torch: 2.11.0+cu130}\n"
                      "config: {}\n")  # fmt: skip
    target = tmp_path / "actor"
    proc = merge(run, target)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "written by torch 2.11.0+cu130 (launch record), this environment has torch" in (
        proc.stdout
    )
    assert_equal_to_reference(target, ckpt_ws2 / "reference" / "actor.pt")
    manifest = json.loads((target / "merge_manifest.json").read_text())
    assert manifest["portable"]["world_size"] == 2 and "2.11.0" in manifest["portable"]["why"]
    assert leftovers(tmp_path) == [] and not list(target.glob(".portable*"))


def test_the_portable_reader_refuses_what_it_cannot_join_in_one_line():
    from verl_gsm8k.merge.portable import LocalShard, PortableError, _placement, _record_type

    spec = _record_type("DTensorSpec")()
    spec.state = {"placements": (_record_type("Shard")(), _record_type("Shard")())}
    with pytest.raises(PortableError, match="a 2-D device mesh"):
        _placement(LocalShard(None, spec), "w")
    spec.state = {"placements": (_record_type("Partial")(),)}
    with pytest.raises(PortableError, match="placement Partial"):
        _placement(LocalShard(None, spec), "w")


class _Planted:
    """Pickles as a call of os.system: what a crafted shard in a shared run directory could hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_crafted_shard_is_refused_without_running_code(tmp_path):
    import collections

    import torch

    from verl_gsm8k.merge import portable

    marker = tmp_path / "ran"
    crafted = tmp_path / "model_world_size_1_rank_0.pt"
    torch.save({"w": torch.zeros(2), "x": _Planted(marker)}, crafted)
    with pytest.raises(portable.PortableError) as err:
        portable.load_shard(crafted)
    assert str(err.value).count("\n") == 0 and str(crafted) in str(err.value)
    assert "posix.system" in str(err.value) or "os.system" in str(err.value)
    assert not portable.loads_here(crafted) and not marker.exists()
    plain = tmp_path / "plain.pt"  # tensors, sizes, dtypes, an OrderedDict: still load
    torch.save(
        collections.OrderedDict(w=torch.ones(3, dtype=torch.bfloat16), n=torch.Size([3])), plain
    )
    assert portable.load_shard(plain)["w"].dtype == torch.bfloat16 and portable.loads_here(plain)


def _plant_os_system(shard: Path, marker: Path) -> None:
    """Add one entry to a real shard whose pickle is ``GLOBAL os system`` + ``REDUCE`` (pickle
    writes os.system as posix.system; the bytes are set to the name an attacker would write),
    rewriting the archive as torch.load still reads it."""
    import zipfile

    import torch
    import torch.distributed.tensor  # noqa: F401  (the shard's DTensors, weights-only)

    state = torch.load(shard, map_location="cpu", weights_only=True)
    state["planted"] = _Planted(marker)
    torch.save(state, shard)
    with zipfile.ZipFile(shard) as archive:
        records = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(shard, "w") as archive:
        for info, data in records:
            if info.filename.endswith("/data.pkl"):
                assert data.count(b"cposix\nsystem\n") == 1
                data = data.replace(b"cposix\nsystem\n", b"cos\nsystem\n")
            archive.writestr(info, data)


def test_a_crafted_shard_of_this_torch_is_refused_before_verls_merger_loads_it(ckpt_ws1, tmp_path):
    """The common path: the launch record says this torch wrote the run, so verl's own merger
    would torch.load(weights_only=False) its shards and run what they name. Every model shard is
    scanned first: one line naming the file and the global, exit 2, the command never runs."""
    from importlib.metadata import version

    run = _copy_run(ckpt_ws1, tmp_path / "run")
    record = run / "launches" / "launch-20000101T000000Z.yaml"
    record.parent.mkdir()
    record.write_text("format: 1\nstamp: 20000101T000000Z\n"
                      f"versions: {{torch: {version('torch')}}}\nconfig: {{}}\n")  # fmt: skip
    shard = run / f"global_step_{STEP}" / "actor" / "model_world_size_1_rank_0.pt"
    marker = tmp_path / "ran"
    _plant_os_system(shard, marker)
    out = tmp_path / "out"
    out.mkdir()
    proc = merge(run, out / "merged")
    assert not marker.exists(), "the planted os.system ran"
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert proc.stderr.strip() == (
        f"merge: refused to load {shard}: its pickle names the global os.system, which no verl "
        "checkpoint holds"
    )
    assert "verl_merger" not in proc.stdout and list(out.iterdir()) == []


def test_the_scan_follows_every_way_a_pickle_names_a_global(ckpt_ws2, tmp_path):
    """Real shards of this torch (model, optimizer, extra state; actor and critic) pass; a global
    named by GLOBAL, STACK_GLOBAL (memoized strings), INST, or built by a call, a pickle ahead of
    the zip that torch.load would read instead, and a TorchScript archive are refused, in one
    line, and nothing runs."""
    import pickle
    import zipfile

    from verl_gsm8k.common.checkpoint_files import ShardError, check_file

    real = sorted((ckpt_ws2 / "run").rglob("*_world_size_2_rank_*.pt"))
    assert len(real) == 12
    for shard in real:
        check_file(shard)

    marker = tmp_path / "ran"
    planted = _Planted(marker)

    def archive(name: str, pkl: bytes, head: bytes = b"", extra: str = "") -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as out:  # the records torch's reader needs
            out.writestr("archive/data.pkl", pkl)
            out.writestr("archive/version", b"3\n")
            out.writestr("archive/byteorder", b"little")
            if extra:
                out.writestr(f"archive/{extra}", b"")
        path.write_bytes(head + path.read_bytes())
        return path

    memoized = pickle.dumps({"w": [1, 2], "x": planted}, protocol=4)
    assert pickle.STACK_GLOBAL in memoized and pickle.MEMOIZE in memoized
    rot13 = (b"\x80\x04\x8c\x07_codecs\x8c\x06encode\x93\x8c\x02bf\x8c\x05rot13\x86R"
             b"\x8c\x06system\x93.")  # STACK_GLOBAL of encode("bf", "rot13") == "os"  # fmt: skip
    cases = {
        archive("global.pt", pickle.dumps(planted, protocol=2)): "the global posix.system,",
        archive("stack.pt", memoized): "the global posix.system,",
        archive("inst.pt", b"(ios\nsystem\nS'true'\n."): "the global os.system,",
        archive("computed.pt", rot13): "cannot be checked (STACK_GLOBAL requires str)",
        archive("ahead.pt", b"", head=pickle.dumps(planted, protocol=2)): "not one torch zip",
        archive("script.pt", pickle.dumps({}), extra="constants.pkl"): "a TorchScript archive",
        archive("escape.pt", b"\x80\x04\x8c\x02os\x8c\x07sys\x1b[2J\x93."): "os.sys\\x1b[2J,",
    }
    for path, needle in cases.items():
        with pytest.raises(ShardError) as err:
            check_file(path)
        message = str(err.value)
        assert "\n" not in message and str(path) in message and needle in message, message
    assert not marker.exists()


def test_written_by_reads_the_launch_that_logged_the_step_not_mtimes(tmp_path):
    import os
    import shutil

    import yaml

    from verl_gsm8k.merge import portable

    run = tmp_path / "run"
    (run / "launches").mkdir(parents=True)
    (run / "metrics").mkdir()
    for stamp, torch_version, first in (
        ("20260101T000000Z", "2.8.0", 0),
        ("20260102T000000Z", "2.9.0", 15),
    ):
        record = {"format": 1, "stamp": stamp, "versions": {"torch": torch_version}, "config": {}}
        (run / "launches" / f"launch-{stamp}.yaml").write_text(yaml.safe_dump(record))
        (run / "metrics" / f"metrics-{stamp}.jsonl").write_text(
            f'{{"step": {first}, "data": {{}}}}\n'
        )
    for step in (10, 20):
        (run / f"global_step_{step}").mkdir()
        os.utime(run / f"global_step_{step}", (0, 0))  # a copy's reset mtimes must not matter
    assert portable.written_by(run, run / "global_step_10") == "2.8.0"
    assert portable.written_by(run, run / "global_step_20") == "2.9.0"
    shutil.rmtree(run / "metrics")
    assert portable.written_by(run, run / "global_step_10") is None  # two launches, no metrics

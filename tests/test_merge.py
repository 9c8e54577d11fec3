"""scripts/merge.sh on real verl checkpoints (world sizes 1 and 2): every tensor as saved, bf16."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from crafted_shards import plant
from helpers import ROOT, capture

from verl_gsm8k.common import procs
from verl_gsm8k.common.run_dir import TRACKER, write_best, write_stamp
from verl_gsm8k.merge.find import best_step_dir, check_checkpoint, resolve_source

MERGE_SH = ROOT / "scripts" / "merge.sh"
STEP = 1


@pytest.fixture(scope="module")
def ws1(real_checkpoints) -> Path:
    return real_checkpoints / "ws1"


@pytest.fixture(scope="module")
def ws2(real_checkpoints) -> Path:
    return real_checkpoints / "ws2"


def merge(*args: str | Path, code: int = 0) -> subprocess.CompletedProcess:
    return capture(["bash", MERGE_SH, *args], code)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".merging-" in p.name or ".old-" in p.name)


def assert_as_saved(merged_dir: Path, run: Path, role: str) -> int:
    import torch
    from safetensors.torch import load_file

    merged: dict = {}
    for file in sorted(merged_dir.glob("*.safetensors")):
        merged.update(load_file(file))
    saved = torch.load(run / f"saved.{role}.pt", weights_only=True)
    want = {k.removeprefix("param:"): v for k, v in saved.items() if k.startswith("param:")}
    assert set(merged) == set(want)  # a tied lm_head is neither a parameter nor stored
    for key, value in want.items():
        assert merged[key].dtype == torch.bfloat16, key
        assert torch.equal(merged[key], value.to(torch.bfloat16)), key
    return len(want)


def assert_manifest(target: Path, role: str, world_size: int, source_role_dir: Path) -> dict:
    import hashlib

    manifest = json.loads((target / "merge_manifest.json").read_text())
    assert (manifest["role"], manifest["step"]) == (role, STEP)
    assert manifest["source"] == str(source_role_dir.resolve())
    assert manifest["fsdp"] == {"FSDP_version": 2, "world_size": world_size}
    assert manifest["versions"]["verl"] == "0.9.1" and manifest["versions"]["transformers"]
    assert manifest["verification"]["forward"]["finite"] is True
    assert manifest["verification"]["chat_template"] is True and manifest["created_at"]
    files = {p.name: p.read_bytes() for p in target.iterdir() if p.name != "merge_manifest.json"}
    assert {f["path"]: (f["bytes"], f["sha256"]) for f in manifest["files"]} == {
        name: (len(data), hashlib.sha256(data).hexdigest()) for name, data in files.items()
    }
    return manifest


@pytest.mark.slow
def test_merge_actor_world_size_1_then_force(ws1, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target, role_dir = tmp_path / "merged", ws1 / f"global_step_{STEP}" / "actor"
    proc = merge(ws1, target)  # a run directory: its tracker picks the step
    assert f"actor of step {STEP} (world size 1)" in proc.stdout and leftovers(tmp_path) == []
    assert assert_as_saved(target, ws1, "actor") > 10
    manifest = assert_manifest(target, "actor", 1, role_dir)
    assert manifest["verification"]["model_class"] == "Qwen2ForCausalLM"
    assert manifest["config_patch"] is None
    assert (target / "model.safetensors").stat().st_mode & 0o044  # readable by others too
    tokenizer = AutoTokenizer.from_pretrained(target)  # a plain transformers user chats with it
    text = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}],
                                         add_generation_prompt=True, tokenize=False)  # fmt: skip
    assert text.endswith("<|im_start|>assistant\n")
    assert AutoModelForCausalLM.from_pretrained(target).config.architectures == [
        "Qwen2ForCausalLM"]  # fmt: skip
    # --force with a merge that fails (a model type verl's merger cannot build): the old stays
    (target / "marker.txt").write_text("previous model")
    broken = shutil.copytree(ws1, tmp_path / "broken-run")
    config = broken / f"global_step_{STEP}" / "actor" / "huggingface" / "config.json"
    config.write_text('{"model_type": "no-such-model"}')
    proc = merge(broken, target, "--force", code=1)
    assert "merger failed" in proc.stderr, proc.stderr
    assert (target / "marker.txt").read_text() == "previous model" and leftovers(tmp_path) == []
    merge(role_dir, target, "--force")  # a good one: replaced only now
    assert not (target / "marker.txt").exists() and leftovers(tmp_path) == []
    assert_manifest(target, "actor", 1, role_dir)


@pytest.mark.slow
def test_merge_world_size_2_the_kept_best_actor_and_the_critic(ws2, tmp_path):
    import torch
    from transformers import AutoModelForTokenClassification

    run = _run_with_best(ws2, tmp_path / "run", STEP)  # the tracker on step 6
    step_dir, actor, critic = run / f"global_step_{STEP}", tmp_path / "actor", tmp_path / "critic"
    proc = merge(run, actor, "--best")
    assert (f"actor of step {STEP}, the kept best (val-core/openai/gsm8k/acc/mean@1 = 0.57)"
            in proc.stdout)  # fmt: skip
    assert_as_saved(actor, ws2, "actor")
    manifest = assert_manifest(actor, "actor", 2, step_dir / "actor")
    assert manifest["best_checkpoint"]["step"] == STEP
    assert manifest["source_argument"] == str(run.resolve())
    proc = merge(step_dir / "critic", critic)  # the role directory itself
    assert f"critic of step {STEP} (world size 2)" in proc.stdout
    assert assert_as_saved(critic, ws2, "critic") > 10
    manifest = assert_manifest(critic, "critic", 2, step_dir / "critic")
    # verl saves the critic's config as a causal LM's; the merge says token classification
    assert manifest["config_patch"]["architectures"] == {
        "from": ["Qwen2ForCausalLM"], "to": ["Qwen2ForTokenClassification"]}  # fmt: skip
    model = AutoModelForTokenClassification.from_pretrained(critic)
    values = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert model.num_labels == 1 and values.shape == (1, 3, 1) and torch.isfinite(values).all()
    assert leftovers(tmp_path) == []


def main(capsys, *args: str | Path) -> tuple[int, str]:
    from verl_gsm8k.merge.cli import main as merge_main  # merge.sh's, in this process

    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    try:  # main installs its own
        code = merge_main([str(a) for a in args])
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    return code, capsys.readouterr().err.strip()


def refused(capsys, source: Path, out: Path, needle: str, *flags: str):
    out.mkdir(exist_ok=True)
    before = sorted(out.iterdir())
    status, said = main(capsys, source, out / "merged", *flags)
    assert status == 2 and "\n" not in said, (status, said)
    assert said.startswith("merge: ") and needle in said, said
    assert sorted(out.iterdir()) == before  # no target, no temporary directory


def test_refuses_missing_partial_or_crafted_checkpoints(ws2, tmp_path, capsys):
    out, step = tmp_path / "out", f"global_step_{STEP}"
    refused(capsys, tmp_path / "does-not-exist", out, "source not found")
    (tmp_path / "empty").mkdir()
    refused(capsys, tmp_path / "empty", out, "no checkpoint in")

    def damaged(name: str, change) -> Path:
        run = shutil.copytree(ws2, tmp_path / name)
        change(run)
        return run

    cases = [
        ("no-tracker", lambda r: (r / TRACKER).unlink(), f"no {TRACKER}", ()),
        ("stale", lambda r: (r / TRACKER).write_text("7"), "global_step_7", ()),
        ("missing-shard", lambda r: (r / step / "actor" / "model_world_size_2_rank_1.pt")
         .unlink(), "missing rank shard model_world_size_2_rank_1.pt", ()),
        ("no-config", lambda r: (r / step / "critic" / "fsdp_config.json").unlink(),
         "fsdp_config.json", ("--critic",)),
        ("no-hf", lambda r: shutil.rmtree(r / step / "actor" / "huggingface"),
         "huggingface/", ()),
        ("grpo", lambda r: shutil.rmtree(r / step / "critic"), "no critic/", ("--critic",)),
        ("glued", lambda r: plant("glued", r / step / "actor" / "model_world_size_2_rank_0.pt",
         tmp_path / "ran"), "model_world_size_2_rank_0.pt: not one zip archive", ()),
    ]  # fmt: skip
    cases += [(f"deep-{n[:5]}", lambda r, n=n: (r / step / "actor" / n).write_text("[" * 10**5 +
               "]" * 10**5), f"{n}: not readable JSON (nested too deep)", ())
              for n in ("fsdp_config.json", "lora_train_meta.json", "huggingface/config.json")
              ]  # fmt: skip
    for name, change, needle, flags in cases:
        refused(capsys, damaged(name, change), out, needle, *flags)
    refused(capsys, ws2 / step / "actor", out, "is an actor checkpoint", "--critic")
    (out / "merged").mkdir()  # a model there: untouched without --force
    refused(capsys, ws2, out, "merged (pass --force to replace it)")
    role = ws2 / step / "actor"
    refused(capsys, role.parent, role, "overlaps the checkpoint", "--force")  # role/merged
    assert not (tmp_path / "ran").exists()


def test_verls_merger_refuses_a_crafted_shard_at_its_own_load(ws2, tmp_path, capsys, monkeypatch):
    import torch

    from verl_gsm8k.merge import verl_merger  # in this process: verl imported once

    role = shutil.copytree(ws2 / f"global_step_{STEP}" / "actor", tmp_path / "actor")
    shard = plant("payload", role / "model_world_size_2_rank_1.pt", tmp_path / "ran")
    monkeypatch.setattr(torch, "load", torch.load)  # main wraps it: put back after the test
    argv = ["merge", "--backend", "fsdp", "--local_dir", str(role), "--target_dir", f"{tmp_path}/o"]
    monkeypatch.setattr(sys, "argv", ["verl_merger", *argv])
    assert verl_merger.main() == 2
    err = capsys.readouterr().err
    assert (f"verl's merger: refused to load {shard}: Trying to load unsupported GLOBAL "
            "posix.system whose module posix is blocked.") in err, err[-2000:]  # fmt: skip
    assert not (tmp_path / "ran").exists(), "a payload ran"


def test_an_unwritable_target_or_another_torchs_mesh_is_one_line(ws1, tmp_path, capsys):
    """/proc takes no new directory, even from root; a script prints torch's mesh error."""
    status, said = main(capsys, ws1, f"/proc/merged-{os.getpid()}")
    assert status == 1 and said.startswith("merge: cannot write beside the target in /proc: ")
    (fake := tmp_path / "python").write_text("#!/bin/sh\necho torch/distributed/_mesh_layout.py"
                                              "\nexit 1\n")  # fmt: skip
    fake.chmod(0o755)
    status, again = main(capsys, ws1, tmp_path / "merged", "--python", fake)
    assert status == 1 and "merge it with that torch, e.g. PYTHON=" in again, again
    assert "\n" not in said + again and not (tmp_path / "merged").exists()


def _merger_running(ws1: Path, out: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(["bash", str(MERGE_SH), str(ws1), str(out / "merged")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline, merger = time.monotonic() + 120, None  # merge.sh execs python: proc.pid merges
    while merger is None and time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            found = [c.pid for c in psutil.Process(proc.pid).children()
                     if "merge.verl_merger" in " ".join(c.cmdline())]  # fmt: skip
            merger = found[0] if found else None
        time.sleep(0.05)
    if merger is None:
        proc.kill()
        pytest.fail(f"the verl merger never started: {proc.communicate()[1][-2000:]}")
    assert leftovers(out), "the temporary directory should exist while the merger runs"
    return proc, merger


def _gone(pid: int) -> bool:
    return not procs.wait_gone(lambda: [pid] if procs.alive(pid) else [], 5.0)


@pytest.mark.slow
def test_sigterm_or_sigkill_while_the_merger_runs(ws1, tmp_path):
    """No orphan merger; SIGTERM leaves nothing, after SIGKILL the next merge names the leftover."""
    (out := tmp_path / "out").mkdir()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc, merger = _merger_running(ws1, out)
        try:
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=60)
            assert _gone(merger), f"the merger outlived the merge ({sig.name})"
        finally:
            if proc.poll() is None:
                proc.kill()
            procs.send([merger] if procs.alive(merger) else [], signal.SIGKILL)
        assert not (out / "merged").exists()
        if sig == signal.SIGTERM:
            assert proc.returncode == 128 + signal.SIGTERM, stderr
            assert stderr.strip() == "merge: interrupted by SIGTERM; nothing written", stderr
            assert leftovers(out) == []
    [left] = leftovers(out)
    again = merge(ws1, out / "merged")
    assert f"merge: {out / left} is left by a merge into the same target that was killed" in (
        again.stderr)  # fmt: skip
    assert (out / "merged" / "config.json").is_file()


def test_an_sft_checkpoint_is_merged_as_role_sft(ws1, tmp_path, capsys):
    """verl's SFT trainer saves its one model in global_step_N/: found from its run or step."""
    run, ppo_step = tmp_path / "run", ws1 / f"global_step_{STEP}"
    step_dir = shutil.copytree(ppo_step / "actor", run / f"global_step_{STEP}")
    (run / TRACKER).write_text(str(STEP))
    for source in (run, step_dir):
        ckpt = check_checkpoint(*resolve_source(source, critic=False))
        assert (ckpt.role_dir, ckpt.role, ckpt.step, ckpt.run_dir) == (step_dir, "sft", STEP, run)
        assert (ckpt.world_size, ckpt.fsdp_version) == (1, 2)
    assert resolve_source(ppo_step, critic=False) == (ppo_step / "actor", "actor")
    refused(capsys, run, tmp_path / "out", "is an SFT checkpoint (one model, no critic)",
            "--critic")  # fmt: skip
    (step_dir / "model_world_size_1_rank_0.pt").unlink()
    refused(capsys, run, tmp_path / "out", "missing rank shard model_world_size_1_rank_0.pt")


def test_peft_folds_a_lora_adapter_as_w_plus_b_a_alpha_over_r(tiny_model_dir, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from verl_gsm8k.merge.lora import LoraError, fold_adapter

    model = shutil.copytree(tiny_model_dir, tmp_path / "merged")  # the merger's base weights
    lora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    for name, param in lora.named_parameters():  # trained: B no longer zero
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=1.0)
    lora.save_pretrained(model / "lora_adapter")
    base, adapter = load_file(model / "model.safetensors"), load_file(
        model / "lora_adapter" / "adapter_model.safetensors")  # fmt: skip
    assert fold_adapter(model, "actor")["tensors_changed"] == 2 * 2  # q and v of 2 layers
    merged = load_file(model / "model.safetensors")
    for key in (k for k in adapter if "lora_A" in k):
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        a, b = adapter[key].float(), adapter[key.replace("lora_A", "lora_B")].float()
        want = (base[name].float() + b @ a * 8 / 4).to(torch.bfloat16)  # W + B·A·alpha/r
        assert torch.allclose(merged[name].float(), want.float(), rtol=1e-2, atol=1e-2), name
        assert not torch.allclose(merged[name].float(), base[name].float(), atol=0.1), name
    config = model / "lora_adapter" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "lora_alpha": 0}))
    with pytest.raises(LoraError, match="LoRA rank 4, alpha 0 .* give the alpha the run used"):
        fold_adapter(model, "actor")


def _run_with_best(ckpt: Path, dest: Path, best_step: int | None) -> Path:
    """A copy of a run, step 1 copied as step 6 (tracked), its best ``best_step``."""
    run = shutil.copytree(ckpt, dest)
    shutil.copytree(run / f"global_step_{STEP}", run / "global_step_6")
    (run / "latest_checkpointed_iteration.txt").write_text("6")
    if best_step is not None:
        write_best(run, best_step, "val-core/openai/gsm8k/acc/mean@1", 0.57, "20260101T000000Z")
    return run


def test_best_without_a_usable_best_file_is_one_line(ws2, tmp_path, capsys):
    run = _run_with_best(ws2, tmp_path / "run", STEP)
    step_dir, best = best_step_dir(run)  # the best's step, not the tracker's
    assert step_dir == run / f"global_step_{STEP}" and best["value"] == 0.57
    assert resolve_source(run, critic=False)[0] == run / "global_step_6" / "actor"  # no --best
    out = tmp_path / "out"
    none = _run_with_best(ws2, tmp_path / "none", None)
    refused(capsys, none, out, f"no best_checkpoint.json in {none}: this run kept no best",
            "--best")  # fmt: skip
    gone = _run_with_best(ws2, tmp_path / "gone", 4)  # pruned, or never saved
    refused(capsys, gone, out, f"names step 4 but {gone / 'global_step_4'} is missing", "--best")
    (none / "best_checkpoint.json").write_text('{"step": 2, "val')  # cut short
    refused(capsys, none, out, "best_checkpoint.json: not readable JSON", "--best")
    refused(capsys, step_dir, out, "--best takes a run directory", "--best")
    # a later launch saved that step again (resumed from before it): not the weights that scored
    write_stamp(run, STEP, "20260102T000000Z")
    refused(capsys, run, out, "validated by launch 20260101T000000Z, but "
            f"{step_dir} was saved by launch 20260102T000000Z", "--best")  # fmt: skip
    write_stamp(run, STEP, "20260101T000000Z")  # the same launch: merged as before
    assert best_step_dir(run)[0] == step_dir


def test_help_explains_flags():  # test_doc_commands runs merge.sh --help itself
    from verl_gsm8k.merge.cli import build_parser

    text = build_parser().format_help()
    for flag in ("--force", "--critic", "--best", "--lora-alpha", "source", "target"):
        assert flag in text, flag
    assert "set -euo pipefail" in MERGE_SH.read_text()

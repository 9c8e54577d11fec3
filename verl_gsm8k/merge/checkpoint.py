"""merge.sh's merge: the checkpoint checked (find.py), merged by verl's merger (verl_merger.py),
a LoRA adapter folded in (lora.py), proved (loads, template renders, a finite forward) and
recorded (merge_manifest.json) in a hidden directory renamed into place last. The critic's
architectures are rewritten (config_patch): verl saves it as a causal LM's."""

import contextlib
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from verl_gsm8k.common import json_read
from verl_gsm8k.common.children import dies_with_this_process
from verl_gsm8k.common.digest import file_sha256
from verl_gsm8k.merge import find
from verl_gsm8k.merge.lora import LoraError, fold_adapter

PROG = "merge"
MANIFEST = "merge_manifest.json"
PROBE = [{"role": "user", "content": "Natalia sold 48 clips in April. How many?"}]


class MergeError(Exception):
    """The merge or its verification failed: exit 1, nothing left behind."""


def run_verl_merger(ckpt: find.Checkpoint, out_dir: Path, python: str) -> tuple[list[str], float]:
    cmd = [python, "-m", "verl_gsm8k.merge.verl_merger", "merge", "--backend", "fsdp",
           "--local_dir", str(ckpt.role_dir), "--target_dir", str(out_dir)]  # fmt: skip
    print(f"{PROG}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        # its own process group, stopped with its children here, killed with this process
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=dies_with_this_process())  # fmt: skip
        try:  # the proof's imports (torch too) beside the merger's own
            from transformers import AutoModelForCausalLM, logging  # noqa: F401

            logging.disable_progress_bar()
            code = proc.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        log.seek(0)
        output = log.read().decode("utf-8", errors="replace")
    if code != 0 and "torch/distributed/_mesh_layout.py" in output:
        raise MergeError("verl's merger cannot read the checkpoint's device mesh, which another "
                         "torch wrote: merge it with that torch, e.g. PYTHON=.venv-gpu/bin/python "
                         "bash scripts/merge.sh ...")  # fmt: skip
    if code != 0:
        tail = "\n".join(output.strip().splitlines()[-25:])
        raise MergeError(f"verl's merger failed (exit {code}); last output:\n{tail}")
    return cmd, time.perf_counter() - start


def _patch_critic_config(model_dir: Path) -> dict | None:
    """config.json made to say what the weights are: <Arch>ForTokenClassification, one label."""
    path = model_dir / "config.json"
    config = json_read.read(path, max_bytes=1 << 20)
    before = list(config.get("architectures") or [])
    after = [re.sub(r"For(CausalLM|ConditionalGeneration)$", "ForTokenClassification", a)
             for a in before]  # fmt: skip
    patch: dict = {"architectures": {"from": before, "to": after}} if after != before else {}
    if len(config.get("id2label") or {}) != 1:
        patch["num_labels"] = 1
    if patch:
        config.update(architectures=after, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return patch or None


def verify_model(model_dir: Path, role: str) -> dict:
    """Load the model and tokenizer, render the chat template, run one forward pass."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not getattr(tokenizer, "chat_template", None):
        raise MergeError(f"the merged tokenizer has no chat template ({model_dir})")
    prompt = tokenizer.apply_chat_template(PROBE, add_generation_prompt=True, tokenize=False)
    if not isinstance(prompt, str) or PROBE[0]["content"] not in prompt:
        raise MergeError("the chat template did not render the probe message")
    input_ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    critic = role == "critic"
    auto = AutoModelForTokenClassification if critic else AutoModelForCausalLM
    model, info = auto.from_pretrained(model_dir, dtype=torch.bfloat16, output_loading_info=True,
                                       **({"num_labels": 1} if critic else {}))  # fmt: skip
    bad = {k: sorted(map(str, info.get(k) or []))[:5]
           for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}  # fmt: skip
    if any(bad.values()):
        raise MergeError(f"{auto.__name__} did not load the merged weights cleanly: {bad}")
    vocab = model.get_input_embeddings().weight.shape[0]
    if int(input_ids.max()) >= vocab:
        raise MergeError(f"tokenizer ids reach {int(input_ids.max())} but the model has {vocab}")
    with torch.no_grad():
        output = model.eval()(input_ids=input_ids).logits
    if not bool(torch.isfinite(output.float()).all()):
        raise MergeError("the forward pass gave non-finite outputs")
    if critic and output.shape[-1] != 1:
        raise MergeError(f"the critic's value head gives {output.shape[-1]} outputs, expected 1")
    shape, params = list(output.shape), list(model.parameters())
    return {"auto_class": auto.__name__, "model_class": type(model).__name__,
            "dtype": str(params[0].dtype).replace("torch.", ""),
            "num_parameters": sum(p.numel() for p in params),
            "tokenizer_class": type(tokenizer).__name__, "chat_template": True,
            "forward": {"input_tokens": input_ids.shape[1], "output_shape": shape,
                        "finite": True}}  # fmt: skip


def _normalize_modes(model_dir: Path) -> None:
    """Files as a normal save would make them (the merger leaves some owner-only)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in model_dir.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def file_list(model_dir: Path) -> list[dict]:
    files = [p for p in sorted(model_dir.rglob("*")) if p.is_file() and p.name != MANIFEST]
    return [{"path": p.relative_to(model_dir).as_posix(), "bytes": p.stat().st_size,
             "sha256": file_sha256(p)} for p in files]  # fmt: skip


def _versions() -> dict:
    out: dict = {"python": platform.python_version()}
    for name in ("verl", "torch", "transformers", "safetensors"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def merge(source: Path, target: Path, force: bool, critic: bool, python: str,
          lora_alpha: float | None = None, best: bool = False) -> dict:  # fmt: skip
    """``source``'s checkpoint (``best``: its best step) merged into ``target``; the manifest."""
    source, target = source.expanduser().resolve(), target.expanduser().resolve()
    chosen, best_record = find.best_step_dir(source) if best else (source, None)
    role_dir, role = find.resolve_source(chosen, critic)
    ckpt = find.check_checkpoint(role_dir, role)
    _check_target(target, ckpt, force)
    prefix = f".{target.name}.merging-"
    for stale in sorted(target.parent.glob(f"{prefix}*")):
        print(f"{PROG}: {stale} is left by a merge into the same target that was killed; nothing "
              "reads it: remove it once no other merge into this target runs",
              file=sys.stderr)  # fmt: skip
    started = time.perf_counter()
    try:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    except OSError as err:
        raise MergeError(f"cannot write beside the target in {target.parent}: {err.strerror}"
                         ) from None  # fmt: skip
    old: Path | None = None
    try:
        manifest = _merge_into(tmp, ckpt, source, target, best_record, python, lora_alpha)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / "model")
        try:
            os.replace(tmp, target)  # the result appears whole, or not at all
        except OSError:
            if old is not None:
                os.replace(old / "model", target)  # the previous model back
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not (old / "model").exists():
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    manifest["total_seconds"] = round(time.perf_counter() - started, 2)
    return manifest


def _check_target(target: Path, ckpt: find.Checkpoint, force: bool) -> None:
    if target.exists() or target.is_symlink():
        if not force:
            raise find.CheckpointError(f"target exists: {target} (pass --force to replace it)")
        if not target.is_dir():
            raise find.CheckpointError(f"target exists and is not a directory: {target}")
    if target.is_relative_to(ckpt.role_dir) or ckpt.role_dir.is_relative_to(target):
        raise find.CheckpointError(f"target {target} overlaps the checkpoint {ckpt.role_dir}")
    if not target.parent.is_dir():
        raise find.CheckpointError(f"no parent directory for the target: {target.parent}")


def _merge_into(tmp: Path, ckpt: find.Checkpoint, source: Path, target: Path, best: dict | None,
                python: str, lora_alpha: float | None) -> dict:  # fmt: skip
    """The merged model in ``tmp``, proved, with its manifest."""
    tmp.chmod(0o755)
    cmd, merge_seconds = run_verl_merger(ckpt, tmp, python)
    config_patch = _patch_critic_config(tmp) if ckpt.role == "critic" else None
    try:  # verl's merger leaves a LoRA adapter aside: folded in, or refused
        lora = fold_adapter(tmp, ckpt.role, lora_alpha)
    except LoraError as err:
        raise find.CheckpointError(str(err)) from None
    _normalize_modes(tmp)
    manifest = {
        "source": str(ckpt.role_dir), "source_argument": str(source),
        "run_dir": str(ckpt.run_dir) if ckpt.run_dir else None, "step": ckpt.step,
        "best_checkpoint": best, "role": ckpt.role,  # best: --best's best_checkpoint.json
        "fsdp": {"FSDP_version": ckpt.fsdp_version, "world_size": ckpt.world_size},
        "target": str(target), "merger_command": [Path(cmd[0]).name, *cmd[1:8]],
        "merge_seconds": round(merge_seconds, 2), "config_patch": config_patch, "lora": lora,
        "verification": verify_model(tmp, ckpt.role), "versions": _versions(),
        "files": file_list(tmp),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest

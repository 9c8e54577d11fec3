"""Merge a verl 0.9.1 FSDP checkpoint into a Hugging Face model directory, prove it, record it.

    bash scripts/merge.sh SOURCE TARGET_DIR [--force] [--critic] [--best]
    # = python -m verl_gsm8k.merge, whose command line is merge/cli.py

SOURCE is a run directory (``trainer.default_local_dir``: its tracker picks a step directory;
with ``--best``, its ``best_checkpoint.json``, the kept best checkpoint of KEEP_BEST=1), one step
directory, or a role directory itself (``actor/`` or ``critic/`` of a step directory); the names:
common/run_dir.py. A checkpoint of verl's SFT trainer (recipes/sft_qwen2.5-0.5b_gsm8k.sh) holds
its one model directly in the step directory (shards, ``fsdp_config.json``, ``huggingface/``; no
``actor/``): it is merged as a causal LM like an actor, recorded with role ``sft``, and is a model
the PPO recipes take as ``MODEL_PATH``. Finding and checking that checkpoint: merge/find.py.

The merge itself is verl's own merger, run as a subprocess with its ``torch.load`` the checked
load (merge/verl_merger.py)::

    python -m verl_gsm8k.merge.verl_merger merge --backend fsdp --local_dir <...>/actor \
        --target_dir <tmp>

Then the result is proved: the model loads with transformers (``AutoModelForCausalLM`` for the
actor; ``AutoModelForTokenClassification`` with one label for the critic, see below) with no
missing or unexpected weights, the tokenizer and its chat template load and render, and one
forward pass gives finite outputs. ``merge_manifest.json`` is written next to the weights (source,
step, role, versions, every file with size and sha256).

Critic: verl trains the critic as ``<Arch>ForTokenClassification`` with ``num_labels=1``, but
saves the actor's ``config.json`` (``architectures: [<Arch>ForCausalLM]``), so verl's merger
writes token-classification weights (``score.weight``/``score.bias``, no ``lm_head``) under a
causal-LM config. Loaded as a causal LM the value head would be silently dropped. This script
loads the critic as token classification and rewrites ``architectures`` accordingly (recorded
in the manifest as ``config_patch``).

Safety: everything is written to a temporary directory beside TARGET_DIR and renamed into place
only when complete and verified. An existing TARGET_DIR is refused unless ``--force``, and is then
replaced only after success. A missing, partial or corrupt checkpoint (a shard that is not a
whole torch file, or fails its checksums) stops before anything is written, with one line naming
what is wrong, exit 2. So does a shard that is not one zip archive from byte 0 or whose pickle
names a global outside the allow-list of what verl's FSDP shards hold: every model shard is
checked before verl's merger or any ``torch.load`` of ours reads it, whichever torch wrote it,
and every load is torch's weights-only one (common/checkpoint_files.py), so a crafted shard in a
shared run directory runs no code. Other failures (an
unwritable target directory included) exit 1 with one line. SIGTERM and SIGINT stop the merger's
process group and remove the temporary directory, exit 128 + the signal number. SIGKILL (an
out-of-memory killer, a scheduler past its grace) reaches no handler: the merger dies with the
merge (Linux's parent-death signal), and the hidden temporary directory ``.TARGET.merging-*``
stays; no merge reads it, and the next merge into that target names it for removal.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import pickle
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verl_gsm8k.common import json_read
from verl_gsm8k.common.children import dies_with_this_process
from verl_gsm8k.common.digest import file_sha256
from verl_gsm8k.merge.find import (
    SFT,
    Checkpoint,
    CheckpointError,
    best_step_dir,
    check_checkpoint,
    resolve_source,
)
from verl_gsm8k.merge.lora import LoraError, fold_adapter
from verl_gsm8k.merge.portable import PortableError, needs_rewrite, rewrite_as_one_rank

PROG = "merge"
MANIFEST = "merge_manifest.json"
PROBE_MESSAGES = [{"role": "user", "content": "Natalia sold 48 clips in April. How many?"}]


class MergeError(Exception):
    """The merge or its verification failed: exit 1, nothing left behind."""


PORTABLE_DIR = ".portable"  # inside the temporary target: removed with it, whatever happens


def readable_copy(ckpt: Checkpoint, tmp: Path) -> tuple[Checkpoint, dict | None]:
    """The checkpoint verl's merger can read here: itself, or, when another torch wrote it, a
    plain one-rank copy made by merge/portable.py (read version-independently)."""
    folder = ckpt.role_dir if ckpt.role == SFT else ckpt.role_dir.parent
    rewrite, why = needs_rewrite(ckpt.role_dir, ckpt.world_size, ckpt.run_dir, folder)
    if not rewrite:
        return ckpt, None
    print(f"{PROG}: the checkpoint {why}: reading its shards version-independently", flush=True)
    try:
        copy = rewrite_as_one_rank(ckpt.role_dir, ckpt.world_size, tmp / PORTABLE_DIR)
    except (PortableError, pickle.UnpicklingError, AttributeError, ImportError) as err:
        raise CheckpointError(
            f"the checkpoint {why}, and its layout cannot be read across versions ({err}): "
            "merge it with the torch that wrote it, e.g. PYTHON=<that environment>/bin/python "
            f"bash scripts/merge.sh {ckpt.role_dir} OUT"
        ) from None
    replaced = Checkpoint(copy, ckpt.role, ckpt.step, ckpt.run_dir, ckpt.fsdp_version, 1)
    return replaced, {"why": why, "world_size": ckpt.world_size}


def run_verl_merger(ckpt: Checkpoint, out_dir: Path, python: str) -> tuple[list[str], float]:
    cmd = [
        python,
        "-m",
        "verl_gsm8k.merge.verl_merger",  # verl.model_merger, its torch.load the checked load
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(ckpt.role_dir),
        "--target_dir",
        str(out_dir),
    ]
    print(f"{PROG}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        # Its own process group, so that a failure or a signal here stops it and its children;
        # and killed with this process where nothing here runs (SIGKILL).
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=dies_with_this_process(),  # noqa: PLW1509  # one prctl call in the child
        )
        try:
            _import_verification_stack()  # in parallel with the merger's own (slow) imports
            code = proc.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        log.seek(0)
        output = log.read().decode("utf-8", errors="replace")
    seconds = time.perf_counter() - start
    if code != 0:
        tail = "\n".join(output.strip().splitlines()[-25:])
        raise MergeError(f"verl's merger failed (exit {code}); last output:\n{tail}")
    return cmd, seconds


def _import_verification_stack() -> None:
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _patch_critic_config(model_dir: Path) -> dict | None:
    """Make config.json say what the weights are: <Arch>ForTokenClassification, one label."""
    path = model_dir / "config.json"
    try:
        config = json_read.read(path, max_bytes=1 << 20)
    except (OSError, json_read.JsonError) as err:
        raise MergeError(f"the merged {path} cannot be read ({err})") from None
    if not isinstance(config, dict):
        raise MergeError(f"the merged {path} holds no JSON object")
    before = list(config.get("architectures") or [])
    after = [
        re.sub(r"For(CausalLM|ConditionalGeneration)$", "ForTokenClassification", a) for a in before
    ]
    patch = None
    if after != before:
        config["architectures"] = after
        patch = {"architectures": {"from": before, "to": after}}
    if len(config.get("id2label") or {}) != 1:
        config["id2label"] = {"0": "LABEL_0"}
        config["label2id"] = {"LABEL_0": 0}
        patch = {**(patch or {}), "num_labels": 1}
    if patch:
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return patch


def verify_model(model_dir: Path, role: str) -> dict:
    """Load the merged model and tokenizer, render the chat template, run one forward pass."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise MergeError(f"the merged tokenizer has no chat template ({model_dir})")
    prompt = tokenizer.apply_chat_template(
        PROBE_MESSAGES, add_generation_prompt=True, tokenize=False
    )
    if not isinstance(prompt, str) or PROBE_MESSAGES[0]["content"] not in prompt:
        raise MergeError("the chat template did not render the probe message")
    input_ids = tokenizer(prompt, return_tensors="pt")["input_ids"]

    auto_class = AutoModelForTokenClassification if role == "critic" else AutoModelForCausalLM
    kwargs = {"num_labels": 1} if role == "critic" else {}
    model, info = auto_class.from_pretrained(
        model_dir, dtype=torch.bfloat16, output_loading_info=True, **kwargs
    )
    problems = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys")}
    mismatched = [str(m) for m in info.get("mismatched_keys") or []]
    if any(problems.values()) or mismatched:
        raise MergeError(
            f"{auto_class.__name__} did not load the merged weights cleanly: missing "
            f"{problems['missing_keys'][:5]}, unexpected {problems['unexpected_keys'][:5]}, "
            f"mismatched {mismatched[:5]}"
        )
    vocab = model.get_input_embeddings().weight.shape[0]
    if int(input_ids.max()) >= vocab:
        raise MergeError(f"tokenizer ids reach {int(input_ids.max())} but the model has {vocab}")
    model.eval()
    with torch.no_grad():
        output = model(input_ids=input_ids).logits
    finite = bool(torch.isfinite(output.float()).all())
    if not finite:
        raise MergeError("the forward pass gave non-finite outputs")
    if role == "critic" and output.shape[-1] != 1:
        raise MergeError(f"the critic's value head gives {output.shape[-1]} outputs, expected 1")
    return {
        "auto_class": auto_class.__name__,
        "model_class": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "tokenizer_class": type(tokenizer).__name__,
        "chat_template": True,
        "forward": {
            "input_tokens": int(input_ids.shape[1]),
            "output_shape": list(output.shape),
            "finite": finite,
        },
    }


def _normalize_modes(model_dir: Path) -> None:
    """Files as a normal save would make them (the merger leaves some owner-only)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in model_dir.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def file_list(model_dir: Path) -> list[dict]:
    return [
        {
            "path": p.relative_to(model_dir).as_posix(),
            "bytes": p.stat().st_size,
            "sha256": file_sha256(p),
        }
        for p in sorted(model_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    ]


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("verl", "torch", "transformers", "safetensors"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _is_within(path: Path, parent: Path) -> bool:
    try:
        path.relative_to(parent)
    except ValueError:
        return False
    return True


def merge(
    source: Path,
    target: Path,
    force: bool,
    critic: bool,
    python: str,
    lora_alpha: float | None = None,
    best: bool = False,
) -> dict:
    """Merge the checkpoint at ``source`` (its best step with ``best``) into a Hugging Face
    model at ``target``: built and verified in a temporary directory beside it, then renamed into
    place whole; the manifest it wrote, with the time it took."""
    source, target = source.expanduser().resolve(), target.expanduser().resolve()
    chosen, best_record = best_step_dir(source) if best else (source, None)
    role_dir, role = resolve_source(chosen, critic)
    ckpt = check_checkpoint(role_dir, role)
    _check_target(target, ckpt, force)
    temp_prefix = f".{target.name}.merging-"
    for stale in sorted(target.parent.glob(f"{temp_prefix}*")):
        print(
            f"{PROG}: {stale} is left by a merge into the same target that was killed; nothing "
            "reads it: remove it once no other merge into this target runs",
            file=sys.stderr,
        )
    started = time.perf_counter()
    try:
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix, dir=target.parent))
    except OSError as err:
        raise MergeError(
            f"cannot write beside the target in {target.parent}: {err.strerror}"
        ) from None
    old: Path | None = None
    try:
        manifest = _merge_into(tmp, ckpt, role, source, target, best_record, python, lora_alpha)
        # tmp is renamed into place whole below: that rename is what makes the result atomic.
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / "model")
        try:
            os.replace(tmp, target)
        except OSError:
            if old is not None:
                os.replace(old / "model", target)  # put the previous model back
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


def _check_target(target: Path, ckpt: Checkpoint, force: bool) -> None:
    """Refuse a target that exists (without ``force``, or not a directory), overlaps the
    checkpoint, or has no parent directory."""
    if target.exists() or target.is_symlink():
        if not force:
            raise CheckpointError(f"target exists: {target} (pass --force to replace it)")
        if not target.is_dir():
            raise CheckpointError(f"target exists and is not a directory: {target}")
    if _is_within(ckpt.role_dir, target) or _is_within(target, ckpt.role_dir):
        raise CheckpointError(f"target {target} overlaps the checkpoint {ckpt.role_dir}")
    if not target.parent.is_dir():
        raise CheckpointError(f"parent directory of the target does not exist: {target.parent}")


def _merge_into(
    tmp: Path,
    ckpt: Checkpoint,
    role: str,
    source: Path,
    target: Path,
    best_record: dict | None,
    python: str,
    lora_alpha: float | None,
) -> dict:
    """The merged model in ``tmp``: verl's merger on a readable copy of the shards, the critic's
    config patched, a LoRA adapter folded in, the model loaded and run once; its manifest,
    written there too."""
    tmp.chmod(0o755)
    merged_from, portable = readable_copy(ckpt, tmp)
    cmd, merge_seconds = run_verl_merger(merged_from, tmp, python)
    shutil.rmtree(tmp / PORTABLE_DIR, ignore_errors=True)
    config_patch = _patch_critic_config(tmp) if role == "critic" else None
    try:  # verl's merger leaves a LoRA adapter aside: fold it in, or refuse
        lora = fold_adapter(tmp, role, lora_alpha)
    except LoraError as err:
        raise CheckpointError(str(err)) from None
    _normalize_modes(tmp)
    verification = verify_model(tmp, role)
    manifest = {
        "source": str(ckpt.role_dir),
        "source_argument": str(source),
        "run_dir": str(ckpt.run_dir) if ckpt.run_dir else None,
        "step": ckpt.step,
        "best_checkpoint": best_record,  # --best: the run's best_checkpoint.json
        "role": role,
        "fsdp": {"FSDP_version": ckpt.fsdp_version, "world_size": ckpt.world_size},
        "target": str(target),
        "merger_command": [Path(cmd[0]).name, *cmd[1:8]],
        "merge_seconds": round(merge_seconds, 2),
        "config_patch": config_patch,
        "portable": portable,
        "lora": lora,
        "verification": verification,
        "versions": _versions(),
        "files": file_list(tmp),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest

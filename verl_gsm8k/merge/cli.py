"""The command line of the merge: ``bash scripts/merge.sh SOURCE TARGET_DIR [flags]`` runs
``python -m verl_gsm8k.merge`` (merge/__main__.py), which is ``main`` here; the merge itself is
merge/checkpoint.py.

Exit 0 merged; 2 a missing, partial or corrupt checkpoint, an existing target, or ``--best`` without
a usable best_checkpoint.json (one line, nothing written); 1 other errors; 128 + the signal number
when stopped by SIGTERM or SIGINT (the merger stopped too, nothing left behind).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from verl_gsm8k.common.run_dir import BEST_FILE, STEP_N, TRACKER
from verl_gsm8k.merge.checkpoint import MANIFEST, PROG, MergeError, merge
from verl_gsm8k.merge.find import DESCRIBED, SFT, CheckpointError


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived: unwinds like any failure, so the clean-up runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, _frame: object) -> None:
    # A second signal must not cut short the clean-up that the first one starts.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Interrupted(signum)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="merge.sh",
        description="Merge a verl FSDP checkpoint (a PPO run's actor by default, or an SFT run's "
        "model) into a Hugging Face model directory with verl's own merger, verify that it loads "
        "and runs, and write "
        f"{MANIFEST} beside it. Exit 2: missing/partial/corrupt checkpoint, target exists, or "
        f"--best without a usable {BEST_FILE}.",
    )
    parser.add_argument(
        "source",
        type=Path,
        help=f"a run directory (its {TRACKER} picks {STEP_N}), a {STEP_N} directory, "
        f"or a role directory ({STEP_N}/actor or {STEP_N}/critic); an SFT run's "
        f"{STEP_N} holds its model directly and is merged as such",
    )
    parser.add_argument(
        "target", type=Path, help="the Hugging Face model directory to create (must not exist)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing target directory; the old one is removed only after the new "
        "model is merged and verified",
    )
    parser.add_argument(
        "--best",
        action="store_true",
        help=f"merge the run's kept best checkpoint: the step its {BEST_FILE} names (KEEP_BEST=1), "
        "not the one its tracker names; SOURCE must be the run directory",
    )
    parser.add_argument(
        "--critic",
        action="store_true",
        help="merge the critic (value model, loaded as token classification with one label) "
        "instead of the actor",
    )
    parser.add_argument(
        "--lora-alpha",
        type=float,
        help="LoRA alpha of the run, for a LoRA checkpoint without lora_train_meta.json (verl "
        "would use 0, i.e. drop the adapter); by default read from the checkpoint",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter that runs 'python -m verl.model_merger' (default: this one)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupt)
    try:
        manifest = merge(
            args.source, args.target, args.force, args.critic, args.python, args.lora_alpha,
            best=args.best,
        )  # fmt: skip
    except CheckpointError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except MergeError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # e.g. the disk filled up while writing
        where = f" {err.filename}" if err.filename else ""
        print(f"{PROG}: cannot write{where}: {err.strerror or err}", file=sys.stderr)
        return 1
    except Interrupted as sig:
        print(f"{PROG}: interrupted by {sig}; nothing written", file=sys.stderr)
        return 128 + sig.signum
    ver = manifest["verification"]
    step = "?" if manifest["step"] is None else manifest["step"]
    described = DESCRIBED.get(manifest["role"], manifest["role"])
    best = manifest["best_checkpoint"]
    kept = f", the kept best ({best.get('metric')} = {best['value']:.4g})" if best else ""
    print(
        f"{PROG}: {described} of step {step}{kept} (world size {manifest['fsdp']['world_size']}) "
        f"-> {manifest['target']}\n"
        f"  {ver['model_class']}, {ver['num_parameters']:,} parameters in {ver['dtype']}; "
        f"tokenizer + chat template OK; forward {ver['forward']['output_shape']} finite\n"
        + (
            f"  LoRA adapter folded in: rank {manifest['lora']['rank']}, alpha "
            f"{manifest['lora']['alpha']:g} ({manifest['lora']['tensors_changed']} tensors)\n"
            if manifest["lora"]
            else ""
        )
        + (
            f"  a Hugging Face causal LM: MODEL_PATH={manifest['target']} starts the PPO/GRPO "
            "recipes from it\n"
            if manifest["role"] == SFT
            else ""
        )
        + f"  manifest: {Path(manifest['target']) / MANIFEST} ({len(manifest['files'])} files); "
        f"done in {manifest['total_seconds']:.1f} s"
    )
    return 0

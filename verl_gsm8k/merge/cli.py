"""``bash scripts/merge.sh SOURCE TARGET_DIR [flags]`` runs ``python -m verl_gsm8k.merge``: exit 0
merged; 2 a missing, partial, corrupt or refused checkpoint, an existing target, ``--best``
without a usable best_checkpoint.json; 1 other errors; 128 + the signal on SIGTERM or SIGINT.
"""

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
    # a second signal must not cut short the clean-up the first one starts
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Interrupted(signum)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="merge.sh",
        description="Merge a verl FSDP checkpoint (a PPO run's actor by default, or an SFT run's "
        "model) into a Hugging Face model directory with verl's own merger, verify that it loads "
        f"and runs, and write {MANIFEST} beside it. Exit 2: missing/partial/corrupt checkpoint, "
        f"target exists, or --best without a usable {BEST_FILE}.",
    )
    add = parser.add_argument
    add("source", type=Path, help=f"a run directory (its {TRACKER} picks {STEP_N}), a {STEP_N} "
        f"directory, or a role directory ({STEP_N}/actor or {STEP_N}/critic); an SFT run's "
        f"{STEP_N} holds its model directly and is merged as such")  # fmt: skip
    add("target", type=Path, help="the Hugging Face model directory to create (must not exist)")
    add("--force", action="store_true", help="replace an existing target directory; the old one "
        "is removed only after the new model is merged and verified")  # fmt: skip
    add("--best", action="store_true", help=f"merge the run's kept best checkpoint: the step its "
        f"{BEST_FILE} names (KEEP_BEST=1), not the one its tracker names; SOURCE must be the run "
        "directory")  # fmt: skip
    add("--critic", action="store_true", help="merge the critic (value model, loaded as token "
        "classification with one label) instead of the actor")  # fmt: skip
    add("--lora-alpha", type=float, help="LoRA alpha of the run, for a LoRA checkpoint without "
        "lora_train_meta.json (verl would use 0, i.e. drop the adapter); by default read from "
        "the checkpoint")  # fmt: skip
    add("--python", default=sys.executable,
        help="interpreter that runs 'python -m verl.model_merger' (default: this one)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupt)
    try:
        m = merge(args.source, args.target, args.force, args.critic, args.python,
                  args.lora_alpha, best=args.best)  # fmt: skip
    except (CheckpointError, MergeError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2 if isinstance(err, CheckpointError) else 1
    except OSError as err:  # e.g. the disk filled up while writing
        where = f" {err.filename}" if err.filename else ""
        print(f"{PROG}: cannot write{where}: {err.strerror or err}", file=sys.stderr)
        return 1
    except Interrupted as sig:
        print(f"{PROG}: interrupted by {sig}; nothing written", file=sys.stderr)
        return 128 + sig.signum
    ver, best, lora = m["verification"], m["best_checkpoint"], m["lora"]
    kept = f", the kept best ({best.get('metric')} = {best['value']:.4g})" if best else ""
    step = "?" if m["step"] is None else m["step"]
    lines = [f"{PROG}: {DESCRIBED[m['role']]} of step {step}{kept} (world size "
             f"{m['fsdp']['world_size']}) -> {m['target']}",
             f"  {ver['model_class']}, {ver['num_parameters']:,} parameters in {ver['dtype']}; "
             f"tokenizer + chat template OK; forward {ver['forward']['output_shape']} "
             "finite"]  # fmt: skip
    if lora:
        lines.append(f"  LoRA adapter folded in: rank {lora['rank']}, alpha {lora['alpha']:g} "
                     f"({lora['tensors_changed']} tensors)")  # fmt: skip
    if m["role"] == SFT:
        lines.append(f"  a Hugging Face causal LM: MODEL_PATH={m['target']} starts the PPO/GRPO "
                     "recipes from it")  # fmt: skip
    lines.append(f"  manifest: {Path(m['target']) / MANIFEST} ({len(m['files'])} files); done in "
                 f"{m['total_seconds']:.1f} s")  # fmt: skip
    print("\n".join(lines))
    return 0

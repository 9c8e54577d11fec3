"""Which attention a run uses, with padding removal or not, and why: the one decision behind the
launcher's ``attention:`` line (recipes/common.sh), the preflight's device line and the fallback
plugin verl loads in its workers (verl_gsm8k/verl_plugins/attention_fallback.py).

The ``ATTENTION`` knob asks (auto, the default; fa2, fa4 or sdpa); auto takes the first that works:

1. ``fa2``: flash-attn 2, where its CUDA extension loads (verl_gsm8k/common/flash_attention.py);
   ``flash_attention_2`` with padding removal, as verl's configs expect.
2. ``fa4``: flash-attn 4 (PyPI ``flash-attn-4``, CuTe DSL, no compilation), where it is installed
   and every GPU nvidia-smi lists has compute capability 9.0 or more: its backward runs only on
   SM 9.x and newer, and transformers 5.9 takes ``flash_attention_4`` only there. Padding removal
   on: verl's unpad/pad fall back to plain torch without flash-attn 2, and transformers'
   flash-attention path takes the packed row through ``flash_attn.cute``'s varlen kernel.
3. ``sdpa``: PyTorch attention without padding removal (configs/attention/sdpa.yaml).

On the CPU (DEVICE=cpu) the answer is sdpa. A request that cannot be met here (fa4 on a card
below SM 9, fa2 without a loading extension) is refused with one line, before anything starts.

    python -m verl_gsm8k.common.attention [--want auto|fa2|fa4|sdpa] [--cpu] [--fa4-card]
    # exit 0: prints the choice (fa2, fa4 or sdpa), then its one-line statement;
    # exit 2: prints the refusal, one line

The compute capability comes from ``nvidia-smi --query-gpu=compute_cap`` (no CUDA context is
created, so the launcher, the preflight and Ray's driver can ask it without taking GPU memory).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass

from verl_gsm8k.common.flash_attention import flash_attn_problem, has_distribution

WANTS = ("auto", "fa2", "fa4", "sdpa")
FA4_DISTRIBUTION = "flash-attn-4"
FA4_MODULE = "flash_attn.cute"  # what transformers 5.9 imports for flash_attention_4
FA4_MIN_CAPABILITY = (9, 0)  # flash-attn-4's backward: SM 9.x and newer (forward from SM 8.x)
# What each choice asks verl for: (attn_implementation, padding removal, config overlay). The
# overlays in configs/attention/ say the same (tests/test_attention_choice.py compares them).
PATHS = {
    "fa2": ("flash_attention_2", True, None),  # verl's own configs: no overlay
    "fa4": ("flash_attention_4", True, "fa4"),
    "sdpa": ("sdpa", False, "sdpa"),
}
SDPA_COST = "slower updates, more activation memory"


class AttentionRefused(ValueError):
    """ATTENTION asks for a path this machine cannot run; the message is the one line to print."""


@dataclass(frozen=True)
class Choice:
    name: str  # fa2, fa4 or sdpa
    why: str

    @property
    def implementation(self) -> str:
        return PATHS[self.name][0]

    @property
    def padding_removal(self) -> bool:
        return PATHS[self.name][1]

    @property
    def overlay(self) -> str | None:
        """configs/attention/<overlay>.yaml (PPO; SFT adds _sft), None for verl's defaults."""
        return PATHS[self.name][2]

    def line(self) -> str:
        """The statement the launcher and the preflight print after ``attention:``."""
        return statement(self.implementation, self.padding_removal, self.why)


def statement(implementation: str, padding_removal: bool, why: str) -> str:
    cost = f": {SDPA_COST}" if not padding_removal else ""
    return f"{implementation}, padding removal {'on' if padding_removal else 'off'} ({why}{cost})"


def gpu_capabilities() -> list[tuple[int, int]] | None:
    """The compute capability of every GPU nvidia-smi lists; [] without a GPU (or nvidia-smi);
    None where it cannot say (an old driver without ``compute_cap``)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (subprocess.SubprocessError, OSError):
        return None
    caps = []
    for line in out.split():
        major, dot, minor = line.strip().partition(".")
        if not (dot and major.isdigit() and minor.isdigit()):
            return None
        caps.append((int(major), int(minor)))
    return caps


def fa4_installed() -> bool:
    return has_distribution(FA4_DISTRIBUTION) and importlib.util.find_spec("flash_attn") is not None


def fa4_import_problem() -> str | None:
    """None when flash-attn-4's module imports (CuTe DSL included); otherwise why not."""
    try:
        importlib.import_module("torch")
        importlib.import_module(FA4_MODULE)
    except Exception as exc:  # ImportError, OSError...: all mean "unusable"
        detail = " ".join(str(exc).split())[:300]
        name = type(exc).__name__
        return f"flash-attn-4 is installed but {FA4_MODULE} does not import ({name}: {detail})"
    return None


def fa4_problem(
    caps: list[tuple[int, int]] | None, installed: bool, load: bool = True
) -> str | None:
    """None when flash-attn-4 can train here; otherwise why not, in words. Imports the module
    (``load``) only on a card that could use it."""
    need = "flash-attn-4 needs compute capability {}.{}+".format(*FA4_MIN_CAPABILITY)
    if not caps:
        return f"{need}, {'no GPU seen' if caps == [] else 'nvidia-smi does not report it'}"
    low = min(caps)
    if low < FA4_MIN_CAPABILITY:
        return f"{need}, this card has {low[0]}.{low[1]}"
    if not installed:
        return (
            f"flash-attn-4 not installed on this {low[0]}.{low[1]} card "
            "(FLASH_ATTN=4 bash scripts/setup.sh installs it)"
        )
    return fa4_import_problem() if load else None


def choose(
    want: str,
    on_cpu: bool,
    fa2: str | None,
    caps: list[tuple[int, int]] | None,
    fa4_is_installed: bool,
) -> Choice:
    """The attention for ATTENTION=``want`` given what was probed: ``fa2`` is flash-attn 2's
    problem (None: it loads), ``caps`` the GPUs' compute capabilities. Raises AttentionRefused
    when ``want`` cannot be met."""
    if want not in WANTS:
        raise AttentionRefused(f"ATTENTION={want} is not one of {', '.join(WANTS)}")
    if want == "sdpa":
        return Choice("sdpa", "ATTENTION=sdpa")
    if on_cpu:
        if want != "auto":
            raise AttentionRefused(f"ATTENTION={want}: the CPU runs sdpa only (DEVICE=cpu)")
        return Choice("sdpa", "trains on the CPU")
    if want in ("auto", "fa2") and fa2 is None:
        return Choice("fa2", "flash-attn 2 loads")
    if want == "fa2":
        raise AttentionRefused(f"ATTENTION=fa2: {fa2}")
    fa4 = fa4_problem(caps, fa4_is_installed)
    if fa4 is None:
        low = min(caps or [FA4_MIN_CAPABILITY])
        return Choice("fa4", f"{fa2}; flash-attn-4 on compute capability {low[0]}.{low[1]}")
    if want == "fa4":
        raise AttentionRefused(f"ATTENTION=fa4: {fa4}; use ATTENTION=auto or sdpa")
    return Choice("sdpa", f"{fa2}; {fa4}")


def probe(want: str, on_cpu: bool = False) -> Choice:
    """choose() with this machine's facts (imports torch; never creates a CUDA context)."""
    if want == "sdpa" or (on_cpu and want in WANTS):
        return choose(want, on_cpu, None, None, False)
    return choose(want, on_cpu, flash_attn_problem(), gpu_capabilities(), fa4_installed())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.common.attention",
        description="Print which attention a run uses here (fa2, fa4 or sdpa) and its one-line "
        "statement; exit 2 with one line when the request cannot be met.",
    )
    parser.add_argument(
        "--want", default="auto", help="the ATTENTION knob: auto (default), fa2, fa4 or sdpa"
    )
    parser.add_argument("--cpu", action="store_true", help="the run trains on the CPU (sdpa)")
    parser.add_argument(
        "--fa4-card",
        action="store_true",
        help="only say whether every GPU here can train with flash-attn 4 (compute capability "
        "9.0+): exit 0, or exit 1 with why not (scripts/setup.sh asks it before installing it)",
    )
    args = parser.parse_args(argv)
    if args.fa4_card:
        problem = fa4_problem(gpu_capabilities(), installed=True, load=False)
        if problem is not None:
            print(problem)
            return 1
        return 0
    try:
        choice = probe(args.want, args.cpu)
    except AttentionRefused as refused:
        print(f"attention: {refused}")
        return 2
    print(choice.name)
    print(choice.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Which attention a run uses, with padding removal or not, and why: the one decision behind the
launcher's ``attention:`` line (verl_gsm8k/launch/), the preflight's device line and the fallback
plugin verl loads in its workers (verl_gsm8k/verl_plugins/attention_fallback.py).

The ``ATTENTION`` knob asks (auto, the default; fa2, fa4, sdpa or sdpa_packed). auto:

1. ``fa2``: flash-attn 2, where its CUDA extension loads (verl_gsm8k/common/flash_attention.py);
   ``flash_attention_2`` with padding removal, as verl's configs expect.
2. else, on a GPU, ``sdpa_packed``: PyTorch attention with padding removal
   (configs/attention/sdpa_packed.yaml): verl's unpad/pad fall back to plain torch without
   flash-attn 2 (verl/utils/attention_utils.py) and transformers builds a block-diagonal causal
   mask from the packed row's ``position_ids`` (tests/test_packed_sdpa.py: the padded path's
   log-probs). On an H100 it took a fraction of the padded path's log-prob memory (docs/gpu.md).
3. on the CPU (DEVICE=cpu), ``sdpa``: without padding removal (configs/attention/sdpa.yaml);
   packed steps measured slower on a 2-core CPU, and the learning bounds were measured padded
   (docs/gpu.md, docs/learning.md). ATTENTION=sdpa_packed packs there too.

``fa4`` (flash-attn 4, PyPI ``flash-attn-4``, CuTe DSL; compute capability 9.0+, padding removal
on) is never chosen by auto, only by ATTENTION=fa4: on an H100 its packed backward (the path
verl's padding removal feeds it) measured about 20 times slower than sdpa_packed's (docs/gpu.md).
A request that cannot be met here (fa4 on a card below SM 9 or without the package, fa2 without
a loading extension, either on the CPU) is refused with one line, before anything starts.

    python -m verl_gsm8k.common.attention [--want WANT] [--cpu] [--fa4-card]  # WANT: ATTENTION's
    # exit 0: prints the choice (fa2, fa4, sdpa or sdpa_packed), then its one-line statement;
    # exit 2: prints the refusal, one line

The compute capability comes from nvidia-smi's one query of the node's GPUs (common/gpus.py).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from dataclasses import dataclass

from verl_gsm8k.common import gpus
from verl_gsm8k.common.flash_attention import flash_attn_problem, has_distribution

WANTS = ("auto", "fa2", "fa4", "sdpa", "sdpa_packed")
FA4_DISTRIBUTION = "flash-attn-4"
FA4_MODULE = "flash_attn.cute"  # what transformers 5.9 imports for flash_attention_4
FA4_MIN_CAPABILITY = (9, 0)  # flash-attn-4's backward: SM 9.x and newer (forward from SM 8.x)
# What each choice asks verl for: (attn_implementation, padding removal, config overlay). The
# overlays in configs/attention/ say the same (tests/test_attention_choice.py compares them).
PATHS = {
    "fa2": ("flash_attention_2", True, None),  # verl's own configs: no overlay
    "fa4": ("flash_attention_4", True, "fa4"),
    "sdpa": ("sdpa", False, "sdpa"),
    "sdpa_packed": ("sdpa", True, "sdpa_packed"),
}
# What a path costs against the default where it runs, said after its reason (docs/gpu.md
# measured each: the GPU probe on an H100, the CPU smoke runs padded and packed).
SDPA_COST = "the padding computed too, more log-prob memory than sdpa_packed on a GPU (docs/gpu.md)"
FA4_COST = "its packed backward measured ~20x slower than sdpa_packed's on an H100 (docs/gpu.md)"
CPU_PACKED_COST = "packed steps measured slower than padded on a 2-core CPU (docs/gpu.md)"


class AttentionRefused(ValueError):
    """ATTENTION asks for a path this machine cannot run; the message is the one line to print."""


@dataclass(frozen=True)
class Choice:
    name: str  # fa2, fa4, sdpa or sdpa_packed
    why: str
    cost: str = ""  # what it costs here against the default, when anything

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
        return statement(self.implementation, self.padding_removal, self.why, self.cost)


def statement(implementation: str, padding_removal: bool, why: str, cost: str = "") -> str:
    said = f"{why}: {cost}" if cost else why
    return f"{implementation}, padding removal {'on' if padding_removal else 'off'} ({said})"


def gpu_capabilities() -> list[tuple[int, int]] | None:
    """The compute capability of every GPU nvidia-smi lists; [] without a GPU (or nvidia-smi);
    None where it cannot say (an old driver without ``compute_cap``)."""
    return gpus.capabilities(gpus.listed())


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
    problem (None: it loads), ``caps`` the GPUs' compute capabilities (read for fa4 only).
    Raises AttentionRefused when ``want`` cannot be met."""
    if want not in WANTS:
        raise AttentionRefused(f"ATTENTION={want} is not one of {', '.join(WANTS)}")
    if want == "sdpa":
        return Choice("sdpa", "ATTENTION=sdpa", "" if on_cpu else SDPA_COST)
    if want == "sdpa_packed":
        return Choice("sdpa_packed", "ATTENTION=sdpa_packed", CPU_PACKED_COST if on_cpu else "")
    if on_cpu:
        if want != "auto":
            raise AttentionRefused(
                f"ATTENTION={want}: the CPU runs sdpa or sdpa_packed only (DEVICE=cpu)"
            )
        return Choice("sdpa", "trains on the CPU, where packed steps measured slower")
    if want in ("auto", "fa2") and fa2 is None:
        return Choice("fa2", "flash-attn 2 loads")
    if want == "fa2":
        raise AttentionRefused(f"ATTENTION=fa2: {fa2}")
    if want == "auto":
        return Choice("sdpa_packed", f"{fa2}; packed rows, block-diagonal mask from position_ids")
    fa4 = fa4_problem(caps, fa4_is_installed)
    if fa4 is not None:
        raise AttentionRefused(f"ATTENTION=fa4: {fa4}; use ATTENTION=auto (sdpa_packed)")
    low = min(caps or [FA4_MIN_CAPABILITY])
    return Choice("fa4", f"ATTENTION=fa4, compute capability {low[0]}.{low[1]}", FA4_COST)


def probe(want: str, on_cpu: bool = False) -> Choice:
    """choose() with this machine's facts (imports torch; never creates a CUDA context)."""
    if want in ("sdpa", "sdpa_packed") or (on_cpu and want in WANTS):
        return choose(want, on_cpu, None, None, False)
    if want != "fa4":  # auto and fa2 never read the card's capability nor flash-attn 4
        return choose(want, on_cpu, flash_attn_problem(), None, False)
    return choose(want, on_cpu, flash_attn_problem(), gpu_capabilities(), fa4_installed())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.common.attention",
        description="Print which attention a run uses here (fa2, fa4, sdpa or sdpa_packed) and its "
        "one-line statement; exit 2 with one line when the request cannot be met.",
    )
    parser.add_argument(
        "--want",
        default="auto",
        help="the ATTENTION knob: auto (default), fa2, fa4, sdpa or sdpa_packed",
    )
    parser.add_argument(
        "--cpu", action="store_true", help="the run trains on the CPU (auto: sdpa, padded)"
    )
    parser.add_argument(
        "--fa4-card",
        action="store_true",
        help="only say whether every GPU here can train with flash-attn 4 (compute capability "
        "9.0+): exit 0, or exit 1 with why not (scripts/setup.sh asks it after FLASH_ATTN=4)",
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

"""Which attention a run uses, with padding removal or not, and why: the one decision behind the
launch line, the preflight and the critic's fallback plugin."""

import argparse
import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass

from verl_gsm8k.common import gpus

WANTS = ("auto", "fa2", "fa4", "sdpa", "sdpa_packed")
FA4_MIN_CAPABILITY = (9, 0)
# (attn_implementation, padding removal, configs/attention/<overlay>[_sft].yaml) of each choice
PATHS = {
    "fa2": ("flash_attention_2", True, None),
    "fa4": ("flash_attention_4", True, "fa4"),
    "sdpa": ("sdpa", False, "sdpa"),
    "sdpa_packed": ("sdpa", True, "sdpa_packed"),
}
SDPA_COST = "the padding computed too, more log-prob memory than sdpa_packed on a GPU (docs/gpu.md)"
FA4_COST = "its packed backward measured ~20x slower than sdpa_packed's on an H100 (docs/gpu.md)"
CPU_PACKED_COST = "packed steps measured slower than padded on a 2-core CPU (docs/gpu.md)"


class AttentionRefused(ValueError):
    """ATTENTION asks for what this machine cannot run: one line."""


@dataclass(frozen=True)
class Choice:
    name: str  # a key of PATHS
    why: str
    cost: str = ""

    implementation = property(lambda self: PATHS[self.name][0])
    padding_removal = property(lambda self: PATHS[self.name][1])
    overlay = property(lambda self: PATHS[self.name][2])  # None: verl's own configs

    def line(self) -> str:
        return statement(self.implementation, self.padding_removal, self.why, self.cost)


def statement(implementation: str, padding_removal: bool, why: str, cost: str = "") -> str:
    said = f"{why}: {cost}" if cost else why
    return f"{implementation}, padding removal {'on' if padding_removal else 'off'} ({said})"


def _import_problem(module: str, what: str) -> str | None:
    """Why ``module`` does not import after torch (a build for another torch fails only here)."""
    try:
        importlib.import_module("torch")
        importlib.import_module(module)
    except Exception as exc:  # ImportError, OSError from the loader...: all mean "unusable"
        return f"{what} does not load ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"
    return None


def _installed(distribution: str) -> bool:
    try:
        return bool(importlib.metadata.distribution(distribution))
    except importlib.metadata.PackageNotFoundError:
        return False


def flash_attn_problem() -> str | None:
    """Why flash-attention 2 cannot be used here, or None."""
    if importlib.util.find_spec("flash_attn") is None:
        return "flash_attn not installed"
    if importlib.util.find_spec("flash_attn_2_cuda") is None and _installed("flash-attn-4"):
        return "flash_attn 2 not installed (flash_attn holds flash-attn-4 alone)"
    return _import_problem("flash_attn_2_cuda", "flash_attn is installed but its CUDA extension "
                           "flash_attn_2_cuda")  # fmt: skip


def gpu_capabilities() -> list[tuple[int, int]] | None:
    return gpus.capabilities(gpus.listed())


def fa4_installed() -> bool:
    return _installed("flash-attn-4") and importlib.util.find_spec("flash_attn") is not None


def fa4_import_problem() -> str | None:
    return _import_problem("flash_attn.cute", "flash-attn-4 is installed but flash_attn.cute")


def fa4_problem(caps: list[tuple[int, int]] | None, installed: bool) -> str | None:
    """Why flash-attn-4 cannot train here, or None (imported only on a card that could)."""
    need = "flash-attn-4 needs compute capability {}.{}+".format(*FA4_MIN_CAPABILITY)
    if not caps:
        return f"{need}, {'no GPU seen' if caps == [] else 'nvidia-smi does not report it'}"
    low = min(caps)
    if low < FA4_MIN_CAPABILITY:
        return f"{need}, this card has {low[0]}.{low[1]}"
    if not installed:
        return (f"flash-attn-4 not installed on this {low[0]}.{low[1]} card "
                "(FLASH_ATTN=4 bash scripts/setup.sh installs it)")  # fmt: skip
    return fa4_import_problem()


def choose(
    want: str, on_cpu: bool, fa2: str | None, caps: list[tuple[int, int]] | None, fa4: bool
) -> Choice:
    """The attention for ATTENTION=``want`` from the probed ``fa2``/``fa4``; else
    AttentionRefused."""
    if want not in WANTS:
        raise AttentionRefused(f"ATTENTION={want} is not one of {', '.join(WANTS)}")
    if want == "sdpa":
        return Choice("sdpa", "ATTENTION=sdpa", "" if on_cpu else SDPA_COST)
    if want == "sdpa_packed":
        return Choice("sdpa_packed", "ATTENTION=sdpa_packed", CPU_PACKED_COST if on_cpu else "")
    if on_cpu and want != "auto":
        raise AttentionRefused(f"ATTENTION={want}: the CPU runs sdpa or sdpa_packed only "
                               "(DEVICE=cpu)")  # fmt: skip
    if on_cpu:
        return Choice("sdpa", "trains on the CPU, where packed steps measured slower")
    if want in ("auto", "fa2") and fa2 is None:
        return Choice("fa2", "flash-attn 2 loads")
    if want == "fa2":
        raise AttentionRefused(f"ATTENTION=fa2: {fa2}")
    if want == "auto":
        return Choice("sdpa_packed", f"{fa2}; packed rows, block-diagonal mask from position_ids")
    problem = fa4_problem(caps, fa4)
    if problem is not None:
        raise AttentionRefused(f"ATTENTION=fa4: {problem}; use ATTENTION=auto (sdpa_packed)")
    low = min(caps or [FA4_MIN_CAPABILITY])
    return Choice("fa4", f"ATTENTION=fa4, compute capability {low[0]}.{low[1]}", FA4_COST)


def probe(want: str, on_cpu: bool = False) -> Choice:
    """choose() with this machine's facts, each asked only where read."""
    if want in ("sdpa", "sdpa_packed") or (on_cpu and want in WANTS):
        return choose(want, on_cpu, None, None, False)
    fa4 = want == "fa4"
    caps, installed = (gpu_capabilities(), fa4_installed()) if fa4 else (None, False)
    return choose(want, on_cpu, flash_attn_problem(), caps, installed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_gsm8k.common.attention", description=(
        "Print which attention a run uses here and its one-line statement; exit 2 with one line "
        "when the request cannot be met."))  # fmt: skip
    parser.add_argument("--want", default="auto", help="ATTENTION: auto (default), fa2, fa4, "
                        "sdpa or sdpa_packed")  # fmt: skip
    parser.add_argument("--cpu", action="store_true", help="the run trains on the CPU")
    args = parser.parse_args(argv)
    try:
        choice = probe(args.want, args.cpu)
    except AttentionRefused as refused:
        print(f"attention: {refused}")
        return 2
    print(f"{choice.name}\n{choice.line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

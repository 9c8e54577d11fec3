"""Whether flash-attention 2 works in this environment: the one probe behind every choice between
flash-attention and PyTorch's sdpa (verl_gsm8k/launch/, the preflight, the attention fallback
plugin that verl loads in its workers).

Finding the ``flash_attn`` package is not enough. A wheel built for another torch or CUDA installs
without complaint and fails only when its CUDA extension ``flash_attn_2_cuda`` is loaded
(``ImportError: ... undefined symbol: ...``), which verl's workers do minutes into a run. So the
probe loads that extension, after torch (the extension links against torch's libraries).

    python -m verl_gsm8k.common.flash_attention   # exit 0: usable; exit 1: prints why not
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util

PACKAGE = "flash_attn"
EXTENSION = "flash_attn_2_cuda"  # what flash_attn.flash_attn_interface imports first


def has_distribution(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def flash_attn_problem() -> str | None:
    """None when flash-attention 2 can be used here; otherwise why not, in one line."""
    if importlib.util.find_spec(PACKAGE) is None:
        return "flash_attn not installed"
    if importlib.util.find_spec(EXTENSION) is None and has_distribution("flash-attn-4"):
        # flash-attn-4 installs flash_attn/cute/ as a namespace package, without flash-attn 2
        return "flash_attn 2 not installed (flash_attn holds flash-attn-4 alone)"
    try:
        importlib.import_module("torch")
        importlib.import_module(EXTENSION)
    except Exception as exc:  # ImportError, OSError from the loader...: all mean "unusable"
        detail = " ".join(str(exc).split())[:300]
        return (
            f"flash_attn is installed but its CUDA extension {EXTENSION} does not load "
            f"({type(exc).__name__}: {detail})"
        )
    return None


def main() -> int:
    problem = flash_attn_problem()
    if problem is not None:
        print(problem)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

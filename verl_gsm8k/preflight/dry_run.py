"""A recipe's DRY_RUN=1 in one Python process: the preflight, then verl's own entry point with
Hydra's ``--cfg job`` (it prints the composed config and exits), on the same overrides.

Two processes did the same before, and each imported verl (torch, tensordict: about 6 s of the
~18 s dry run on 2 cores); here the second import is free. verl's entry point runs as
``python -m`` runs it (``runpy``, as ``__main__``, its own command line), only once the
preflight has passed, with the token budget the preflight picked (TOKEN_BUDGET=auto) where the
launcher would add it; a failing preflight's status is the process's.

    python -m verl_gsm8k.preflight.dry_run --verl-module verl.trainer.main_ppo \\
        --config-path configs --trainer ppo --config-name gsm8k_ppo -- key=value ...
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from verl_gsm8k.preflight.cli import main as preflight


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_gsm8k.preflight.dry_run")
    parser.add_argument("--verl-module", required=True, help="verl's entry point, run with -m")
    parser.add_argument("--config-path", required=True, help="verl's --config-path")
    parser.add_argument("--trainer", required=True, help="as for python -m verl_gsm8k.preflight")
    parser.add_argument("--config-name", required=True)
    parser.add_argument(
        "--fit-budget", type=Path, default=None, help="as for the preflight; its pick joins verl's"
    )
    parser.add_argument(
        "--user-args", type=int, default=0, help="how many overrides at the end are the launch's"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides key=value (after --)")
    args = parser.parse_args(argv)
    fit = ["--fit-budget", str(args.fit_budget)] if args.fit_budget is not None else []
    status = preflight([*fit, "--trainer", args.trainer, "--config-name", args.config_name, "--",
                        *args.overrides])  # fmt: skip
    if status != 0:
        return status
    # the launcher's order: the recipe's overrides, the budget the preflight picked, the user's
    cut = len(args.overrides) - args.user_args
    picked = []
    if args.fit_budget is not None and args.fit_budget.is_file():
        picked = [line for line in args.fit_budget.read_text().splitlines() if line]
    overrides = [*args.overrides[:cut], *picked, *args.overrides[cut:]]
    return print_config(args.verl_module, Path(args.config_path), args.config_name, overrides)


def print_config(
    verl_module: str, config_path: Path, config_name: str, overrides: list[str]
) -> int:
    """verl's entry point with Hydra's ``--cfg job``, in this process: the composed config."""
    sys.argv = [verl_module, "--config-path", str(config_path), "--config-name", config_name,
                "--cfg", "job", *overrides]  # fmt: skip
    try:
        runpy.run_module(verl_module, run_name="__main__", alter_sys=True)
    except SystemExit as done:  # Hydra ends --cfg job with sys.exit
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

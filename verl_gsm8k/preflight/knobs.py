"""The recipes' knobs and the check each value must pass: one table, standard library only.

    python -m verl_gsm8k.preflight.knobs NAME=VALUE [NAME=VALUE ...]  # check; a line per bad value
    python -m verl_gsm8k.preflight.knobs --names      # the knob names in the table
    python -m verl_gsm8k.preflight.knobs --markdown   # the table as docs/knobs.md shows it

recipes/common.sh runs it on every knob it has set, before the (slow, verl-importing)
preflight, so a mistyped value stops the launch in well under a second with one line naming
the knob and the value. A NAME not in the table is ignored. Exit 0: all good; 2: at least one
bad value.

To add a knob: one row in KNOBS (name + a Check; build a new Check from a rule in words and a
predicate on the raw string, e.g. one_of("auto", "gpu", "cpu")), then regenerate the table in
docs/knobs.md with --markdown.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass

from verl_gsm8k.warm_start.band import is_band

# Values as Hydra parses them into numbers: a leading zero ("007") or a sign would make Hydra read
# a string or surprise the user, so only plain decimal forms pass.
INT = re.compile(r"0|[1-9][0-9]*")
NUMBER = re.compile(r"(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# verl.utils.tracking.Tracking.supported_backend of verl 0.9.1 (tests compare the two).
VERL_LOGGERS = (
    "wandb",
    "mlflow",
    "swanlab",
    "vemlp_wandb",
    "tensorboard",
    "console",
    "clearml",
    "trackio",
    "file",
    "rl_insight",
)


@dataclass(frozen=True)
class Check:
    rule: str  # what a good value is, in words: shown in errors and in docs/knobs.md
    ok: Callable[[str], bool]  # the test on the raw string the user set


@dataclass(frozen=True)
class Knob:
    name: str
    check: Check


def _int(value: str) -> int | None:
    return int(value) if INT.fullmatch(value) else None


def _number(value: str) -> float | None:
    return float(value) if NUMBER.fullmatch(value) and math.isfinite(float(value)) else None


def _int_above(value: str, low: int) -> bool:
    number = _int(value)
    return number is not None and number > low


def _number_in(value: str, low: float, high: float, low_open: bool) -> bool:
    number = _number(value)
    if number is None:
        return False
    return (number > low if low_open else number >= low) and number <= high


def one_of(*values: str) -> Check:
    return Check(f"one of {', '.join(values)}", lambda value: value in values)


POSITIVE_INT = Check("an integer > 0", lambda v: _int_above(v, 0))
POSITIVE_NUMBER = Check("a number > 0 (e.g. 1e-6)", lambda v: _number_in(v, 0, math.inf, True))
NON_NEGATIVE_NUMBER = Check("a number >= 0", lambda v: _number_in(v, 0, math.inf, False))
FRACTION = Check("a number in (0, 1]", lambda v: _number_in(v, 0, 1, True))
FREQUENCY = Check(
    "an integer > 0 (every N steps) or -1 (never)", lambda v: v == "-1" or _int_above(v, 0)
)
STEPS = Check(
    "null (run TOTAL_EPOCHS) or an integer > 0", lambda v: v == "null" or _int_above(v, 0)
)
KEEP = Check(
    "an integer > 0, or null (keep every checkpoint)", lambda v: v == "null" or _int_above(v, 0)
)
FUNCTION_NAME = Check("a Python function name", str.isidentifier)
LOGGERS = Check(
    f"a comma-separated list of verl loggers ({', '.join(VERL_LOGGERS)})",
    lambda v: bool(v) and all(name in VERL_LOGGERS for name in v.split(",")),
)
SWITCH = one_of("0", "1")
# recipes/learn_tiny.sh's ALGO, each the name of its config, configs/gsm8k_<name>.yaml
LEARN_ALGOS = (
    "ppo", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax", "drgrpo", "dapo",
    "gspo",
)  # fmt: skip
NON_NEGATIVE_INT = Check("an integer >= 0", lambda v: _int_above(v, -1))

# One row per knob. Paths are not here: the preflight checks that they exist and load.
KNOBS: tuple[Knob, ...] = (
    Knob("DEVICE", one_of("auto", "gpu", "cpu")),
    Knob("ATTENTION", one_of("auto", "fa2", "fa4", "sdpa", "sdpa_packed")),
    Knob("NNODES", POSITIVE_INT),
    Knob("NDEVICES_PER_NODE", POSITIVE_INT),
    Knob("TRAIN_BATCH_SIZE", POSITIVE_INT),
    Knob("PPO_MINI_BATCH_SIZE", POSITIVE_INT),
    Knob("MAX_PROMPT_LENGTH", POSITIVE_INT),
    Knob("MAX_RESPONSE_LENGTH", POSITIVE_INT),
    Knob("ACTOR_LR", POSITIVE_NUMBER),
    Knob("CRITIC_LR", POSITIVE_NUMBER),
    Knob("KL_COEF", NON_NEGATIVE_NUMBER),
    Knob("SFT_LR", POSITIVE_NUMBER),
    Knob("MAX_LENGTH", POSITIVE_INT),
    Knob("ROLLOUT_TP", POSITIVE_INT),
    Knob("ROLLOUT_GPU_MEM_UTIL", FRACTION),
    Knob("ROLLOUT_N", POSITIVE_INT),
    Knob("TOTAL_EPOCHS", POSITIVE_INT),
    Knob("TOTAL_TRAINING_STEPS", STEPS),
    Knob("SAVE_FREQ", FREQUENCY),
    Knob("TEST_FREQ", FREQUENCY),
    Knob("MAX_CKPT_TO_KEEP", KEEP),
    Knob("REWARD_FN", FUNCTION_NAME),
    Knob("LOGGER", LOGGERS),
    Knob("LORA_RANK", POSITIVE_INT),
    Knob("LORA_ALPHA", POSITIVE_NUMBER),
    Knob("SMOKE_PROMPTS", POSITIVE_INT),
    Knob("ALGO", one_of(*LEARN_ALGOS)),
    Knob("SEED", NON_NEGATIVE_INT),
    Knob("WARM_START_STEPS", POSITIVE_INT),
    Knob(
        "WARM_START_ACC",
        Check(
            "last, or an accuracy band LOW-HIGH with 0 <= LOW <= HIGH <= 1 (e.g. 0.30-0.45)",
            lambda v: v == "last" or is_band(v),
        ),
    ),  # fmt: skip
    Knob("TOY_TASK", one_of("easy", "hard")),
    Knob("TRACE_SAMPLES", NON_NEGATIVE_INT),
    Knob("WATCHDOG", one_of("stop", "warn", "off")),
    Knob("KEEP_BEST", SWITCH),
    Knob(
        "BEST_METRIC",
        Check(
            "a verl metric name (e.g. val-core/openai/gsm8k/acc/mean@1)",
            lambda v: bool(v) and " " not in v,
        ),
    ),  # fmt: skip
    Knob("STOP_GRACE_S", NON_NEGATIVE_INT),
    Knob("LOCK_WAIT_S", NON_NEGATIVE_INT),
    Knob("RESUME", one_of("auto", "force", "disable")),
    Knob("DRY_RUN", SWITCH),
    Knob("SKIP_PREFLIGHT", SWITCH),
    Knob("TOKEN_BUDGET", one_of("auto", "recipe")),
)
BY_NAME = {knob.name: knob for knob in KNOBS}


def shown(name: str, value: str) -> str:
    """NAME=value as the user would type it in a shell."""
    return f"{name}={shlex.quote(value)}"


def batch_split_problem(
    batch: int,
    mini: int,
    batch_name: str = "TRAIN_BATCH_SIZE",
    mini_name: str = "PPO_MINI_BATCH_SIZE",
) -> str | None:
    """Why a batch of `batch` prompts does not split into mini-batches of `mini`, or None.

    verl asserts batch % mini == 0 when it splits a step's batch for the first update (both are
    multiplied by rollout.n first, which changes nothing here).
    """
    if mini > batch:
        return f"{mini_name}={mini} is larger than {batch_name}={batch}"
    if batch % mini:
        return (
            f"{batch_name}={batch} does not split into mini-batches of {mini_name}={mini} "
            f"(verl asserts {batch} % {mini} == 0 at the first update)"
        )
    return None


def problems(values: dict[str, str]) -> list[str]:
    """One line per bad value (knobs not in the table are ignored), then the cross-checks."""
    lines = [
        f"{shown(name, value)} is not {BY_NAME[name].check.rule}"
        for name, value in values.items()
        if name in BY_NAME and not BY_NAME[name].check.ok(value)
    ]
    batch = _int(values.get("TRAIN_BATCH_SIZE", ""))
    mini = _int(values.get("PPO_MINI_BATCH_SIZE", ""))
    if batch and mini:  # both valid: a bad one has its own line already
        split = batch_split_problem(batch, mini)
        if split:
            lines.append(split)
    return lines


def markdown_table() -> str:
    rows = ["| knob | a good value |", "|---|---|"]
    rows += [f"| `{knob.name}` | {knob.check.rule} |" for knob in KNOBS]
    return "\n".join(rows) + "\n"


def parse_assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.preflight.knobs",
        description="Check recipe knob values against the table of knobs (one line per bad "
        "value, exit 2), or print the table.",
    )
    parser.add_argument(
        "assignments",
        nargs="*",
        type=parse_assignment,
        metavar="NAME=VALUE",
        help="knob values to check; names not in the table are ignored",
    )
    parser.add_argument("--names", action="store_true", help="print every knob name and exit")
    parser.add_argument(
        "--markdown", action="store_true", help="print the table as Markdown and exit"
    )
    args = parser.parse_args(argv)
    if args.names:
        print("\n".join(knob.name for knob in KNOBS))
        return 0
    if args.markdown:
        print(markdown_table(), end="")
        return 0
    lines = problems(dict(args.assignments))
    for line in lines:
        print(f"knobs: {line}", file=sys.stderr)
    return 2 if lines else 0


if __name__ == "__main__":
    sys.exit(main())

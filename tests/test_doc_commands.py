"""Every command in a ```bash block of README.md, recipes/README.md and docs/ is one a user can
run as written: checked on the CPU without training or downloading anything.

- `python -m <module> ...` and `bash scripts/<script> ...`: the line itself, run with `--help`
  appended (argparse checks the flags and values before it, then prints the help and exits 0),
  and every `--flag` of the line named in that help;
- `bash recipes/<recipe>.sh ...` and `sbatch ... slurm/<file> recipes/<recipe>.sh ...`: the files
  exist, every `NAME=value` before it is a knob whose value passes the knob's check (or one of the
  few other variables below), every `key=value` after it is a key of the recipe's composed
  config (each recipe's own dry run: tests/test_recipes.py, tests/test_algorithms.py);
- `make <target>`: a target of the Makefile;
- tools that are not this repository's (git, ray, nvidia-smi, wandb, the shell's own) are named
  in EXTERNAL: they are not run here (nvidia-smi and a GPU's `ray start` need the GPU machine).
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT
from omegaconf import OmegaConf

from verl_gsm8k.launch.knobs import BY_NAME, recipe_arguments

DOCS = [ROOT / "README.md", ROOT / "recipes" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
# Commands of other tools, shown as the user runs them; not run by this test.
EXTERNAL = {"git", "source", "export", "cat", "ray", "nvidia-smi", "wandb"}
# Variables the docs set that are not knobs: the interpreter, wandb's and Ray's own, a doc's own
# shorthand for a shared mount.
OTHER_VARIABLES = {
    "PYTHON", "WANDB_MODE", "WANDB_API_KEY", "RAY_ADDRESS", "RAY_JOB_STOP_WAIT_TIME_S",
    "RAY_enable_worker_prestart", "SHARED",
}  # fmt: skip
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
PLACEHOLDER = re.compile(r"[<\[]|\.\.\.|HEAD_IP")
ABSENT = object()  # OmegaConf.select's answer for a key the config does not have


def doc_commands() -> list[tuple[str, list[str]]]:
    """(where, words) for every command line of every bash block; a `for ... do X; done` loop
    gives X."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for block in BLOCK.finditer(text):
            first = text.count("\n", 0, block.start()) + 2
            for n, line in enumerate(block.group(1).replace("\\\n", " ").splitlines()):
                words = shlex.split(line, comments=True)
                if words[:1] == ["for"] and "do" in words:
                    words = words[words.index("do") + 1 : words.index("done")]
                words = [w.rstrip(";") for w in words]
                if words:
                    found.append((f"{path.relative_to(ROOT)}:{first + n}", words))
    return found


COMMANDS = doc_commands()


@functools.cache
def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z-]*):", text, re.M))


@functools.cache
def recipe_config(recipe: Path):
    from verl_gsm8k.preflight.compose import compose

    args = recipe_arguments(recipe)  # the config names its trainer's defaults (PPO or SFT)
    return compose(ROOT / "configs", args[args.index("--config") + 1], [])


def variables(words: list[str]) -> tuple[list[str], list[str]]:
    """The problems of the line's leading NAME=value words, and the words after them."""
    problems = []
    while words and (match := ASSIGNMENT.fullmatch(words[0])):
        name, value = match.groups()
        words = words[1:]
        if name in BY_NAME:
            placeholder = PLACEHOLDER.search(value) or "$" in value
            if not placeholder and not BY_NAME[name].check.ok(value):
                problems.append(f"{name}={value} is not {BY_NAME[name].check.rule}")
        elif name not in OTHER_VARIABLES:
            problems.append(f"{name} is neither a knob (docs/knobs.md) nor a variable we know")
    return problems, words


def recipe_problems(recipe: str, args: list[str]) -> list[str]:
    if PLACEHOLDER.search(recipe):
        return []  # recipes/<recipe>.sh: every recipe; its arguments below are placeholders too
    path = ROOT / recipe
    if not path.is_file():
        return [f"{recipe} does not exist"]
    problems = []
    for arg in args:
        if arg == "--help" or PLACEHOLDER.search(arg.partition("=")[0]):
            continue  # a placeholder key ([key=value ...]); a placeholder value (<repo>) is fine
        key, sep, _ = arg.partition("=")
        if not sep:
            problems.append(f"{arg}: a recipe takes key=value overrides")
        elif (
            not key.startswith("+")
            and OmegaConf.select(recipe_config(path), key, default=ABSENT) is ABSENT
        ):
            problems.append(f"{key} is not a key of {recipe}'s config")
    return problems


def help_problems(command: list[str], args: list[str]) -> list[str]:
    """The line run with --help appended: exit 0, and each of its flags in the help."""
    done = subprocess.run(
        [*command, *args, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        return [f"exit {done.returncode} with --help: {(done.stderr or done.stdout)[-400:]}"]
    flags = {arg.split("=")[0] for arg in args if arg.startswith("--")}
    return [f"{flag} is not in its --help" for flag in sorted(flags) if flag not in done.stdout]


def problems_of(words: list[str]) -> list[str]:
    problems, words = variables(words)
    if not words:
        return problems  # an assignment alone
    tool, args = words[0], words[1:]
    if "=" in tool and "." in tool.partition("=")[0]:  # overrides alone: the PPO recipe's keys
        return problems + recipe_problems("recipes/ppo_qwen2.5-0.5b_gsm8k.sh", words)
    if tool in EXTERNAL:
        return problems
    if tool in ("python", "python3", ".venv/bin/python"):
        if args[:1] == ["-c"]:
            return problems  # a snippet checking the installed stack (docs/gpu.md)
        assert args[:1] == ["-m"], words
        module, rest = args[1], args[2:]
        if module == "pytest":
            return problems + [f"{t} does not exist" for t in rest if t.startswith("tests/")
                               and not (ROOT / t.split("::")[0]).exists()]  # fmt: skip
        return problems + help_problems([sys.executable, "-m", module], rest)
    if tool == "bash":
        script, rest = args[0], args[1:]
        if script.startswith("recipes/"):
            return problems + recipe_problems(script, rest)
        if not (ROOT / script).is_file():
            return problems + [f"{script} does not exist"]
        return problems + help_problems(["bash", script], rest)
    if tool == "make":
        return problems + [f"no make target {t}" for t in args if t not in makefile_targets()]
    if tool == "sbatch":
        files = [a for a in args if not a.startswith("--")]
        if not (ROOT / files[0]).is_file():
            return problems + [f"{files[0]} does not exist"]
        return problems + recipe_problems(files[1], files[2:])
    return problems + [f"{tool}: not a command of this repository, nor in EXTERNAL"]


@pytest.mark.parametrize("where, words", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_documented_command_runs_as_written(where: str, words: list[str]):
    assert problems_of(words) == [], f"{where}: {shlex.join(words)}"


def test_the_commands_were_found():
    """The parser above sees the README's quickstart (a check that reads nothing passes)."""
    readme = [words for where, words in COMMANDS if where.startswith("README.md")]
    assert ["make", "setup"] in readme and ["python", "-m", "data_prep.gsm8k"] in readme
    assert len(COMMANDS) > 100, len(COMMANDS)

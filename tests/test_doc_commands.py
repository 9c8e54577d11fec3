"""Every command in a ```bash block of README.md, recipes/README.md and docs/ is one a user can
run as written: checked on the CPU without training or downloading anything.

- `python -m <module> ...` and `bash scripts/<script> ...`: the line itself, run with `--help`
  appended (argparse checks the flags and values before it, then prints the help and exits 0),
  every `--flag` of the line named in that help, and every flag its usage line requires given;
- `bash recipes/<recipe>.sh ...` and `sbatch ... slurm/<file> recipes/<recipe>.sh ...`: the files
  exist, every `NAME=value` before it is a knob whose value passes the knob's check (or one of the
  few other variables below), every `key=value` after it is a key of the recipe's composed
  config (each recipe's own dry run: tests/test_recipes.py, tests/test_algorithms.py);
- `make <target>`: a target of the Makefile;
- tools that are not this repository's (git, ray, nvidia-smi, wandb, the shell's own) are named
  in EXTERNAL: they are not run here (nvidia-smi and a GPU's `ray start` need the GPU machine).

The prose too: every inline `command` span gets the same checks (its flags against its own
module's --help, run once per module), and every span word that starts with a repository folder
(`verl_gsm8k/...`, `recipes/...`) names a path that exists. A line no check can read (a path of
verl's repository, a file of an earlier commit) carries `<!-- unchecked: why -->`.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
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
# Variables the docs set that are not knobs: the set-up's (scripts/setup.sh), wandb's and Ray's
# own, a doc's own shorthand for a shared mount.
OTHER_VARIABLES = {
    "PYTHON", "SETUP_PYTHON", "FLASH_ATTN", "UPGRADE", "WHEELHOUSE", "STACK", "DIR", "EXCLUDE",
    "TORCH_CPU_INDEX",
    "TEST_WORKERS", "CI", "WANDB_MODE",
    "WANDB_API_KEY", "RAY_ADDRESS", "RAY_JOB_STOP_WAIT_TIME_S",
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
# A prose line a check cannot read mechanically says so (and why) with this marker; nothing on
# that line is checked. Silence is never an exemption.
UNCHECKED = "<!-- unchecked:"
SPAN = re.compile(r"`([^`\n]+)`")
COMMAND_START = re.compile(r"([A-Z_][A-Z0-9_]*=\S+ )*(python -m |bash |make |sbatch )")
REPO_PATH = re.compile(
    r"(?:verl_gsm8k|scripts|recipes|configs|slurm|docs|tests|data_prep|rewards|\.ci)/[\w./*-]*"
)


def prose_spans(docs: list[Path] = DOCS) -> list[tuple[str, str]]:
    """(where, text) of every inline code span outside the fenced blocks, but on a line marked
    unchecked."""
    found = []
    for path in docs:
        text = BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text("utf-8"))
        for n, line in enumerate(text.splitlines(), start=1):
            if UNCHECKED not in line:
                where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{n}"
                found += [(where, m.group(1)) for m in SPAN.finditer(line)]
    return found


SPANS = prose_spans()
INLINE = [(where, span) for where, span in SPANS if COMMAND_START.match(span)]


def path_problems(span: str) -> list[str]:
    """A word of a span that starts with a repository folder names a path that exists (a glob:
    one that matches; a word with a placeholder, <x> or an upper-case NAME, is a pattern)."""
    problems = []
    for word in span.split():
        match = REPO_PATH.match(word)
        if match is None or re.search(r"<|/[A-Z][A-Z_]*(\.|/|$)", word):
            continue
        path = match.group(0).rstrip(".")
        if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
            problems.append(f"{path} does not exist")
    return problems


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
        if arg in ("--help", "key=value") or PLACEHOLDER.search(arg.partition("=")[0]):
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


def required_flags(help_text: str) -> set[str]:
    """The flags argparse's usage line shows outside brackets: those a command cannot run
    without (a choice between flags, ``(--a | --b)``, is left out)."""
    usage = help_text.split("\n\n", 1)[0]
    while (bare := re.sub(r"\[[^\[\]]*\]|\([^()]*\|[^()]*\)", "", usage)) != usage:
        usage = bare
    return set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", usage))


# Run with --help: this repository's modules and scripts, whose argparse prints the help and
# exits (a command that ignored --help would run for real: .ci/run is only checked to exist).
OWN_MODULES = ("verl_gsm8k", "data_prep")
OWN_SCRIPTS = ("scripts/",)


@functools.cache
def run_help(line: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run([*line, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)


def help_problems(command: list[str], args: list[str], whole_line: bool = True) -> list[str]:
    """The line run with --help appended (``whole_line``; else the command's own --help, once per
    command: its flags' values unchecked): exit 0, each of its flags in the help, and every flag
    the usage line requires given (--help alone ends argparse before it checks those)."""

    def subcommand(arg: str) -> bool:  # not a flag, nor a pattern (one-node|multi-node, RUN_DIR)
        return not arg.startswith("-") and not PLACEHOLDER.search(arg) and arg.lower() == arg and (
            "|" not in arg)  # fmt: skip

    leading = list(itertools.takewhile(subcommand, args))
    done = run_help(tuple(command + (args if whole_line else leading)))  # subcommands kept
    if done.returncode != 0:
        return [f"exit {done.returncode} with --help: {(done.stderr or done.stdout)[-400:]}"]
    flags = {arg.split("=")[0] for arg in args if arg.startswith("--")}
    problems = [f"{flag} is not in its --help" for flag in sorted(flags) if flag not in done.stdout]
    # a line showing the help needs nothing else; an inline span of the module alone names it
    if "--help" not in args and (whole_line or args):
        missing = sorted(required_flags(done.stdout) - flags)
        problems += [f"{flag} is required (its usage line)" for flag in missing]
    return problems


def problems_of(words: list[str], whole_line: bool = True) -> list[str]:
    """What is wrong with one documented command; ``whole_line``: run it with --help (a fenced
    block's line), else check its flags against its command's help (an inline one)."""
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
        if PLACEHOLDER.search(module):
            return problems  # python -m verl_gsm8k.<stage>: a pattern, not a module
        if module == "pytest":
            return problems + [f"{t} does not exist" for t in rest if t.startswith("tests/")
                               and not (ROOT / t.split("::")[0]).exists()]  # fmt: skip
        if not whole_line and not module.startswith(OWN_MODULES):  # verl's, vLLM's: importable
            found = importlib.util.find_spec(module.split(".", 1)[0]) is not None
            return problems + ([] if found else [f"no module {module}"])
        return problems + help_problems([sys.executable, "-m", module], rest, whole_line)
    if tool == "bash":
        script, rest = args[0], args[1:]
        if script.startswith("recipes/"):
            return problems + recipe_problems(script, rest)
        if not (ROOT / script).is_file():
            return problems + [f"{script} does not exist"]
        if not script.startswith(OWN_SCRIPTS) and not whole_line:
            return problems
        return problems + help_problems(["bash", script], rest, whole_line)
    if tool == "make":
        targets = [t for t in args if not ASSIGNMENT.fullmatch(t)]  # make setup FLASH_ATTN=4
        problems += variables([t for t in args if ASSIGNMENT.fullmatch(t)])[0]
        return problems + [f"no make target {t}" for t in targets if t not in makefile_targets()]
    if tool == "sbatch":
        files = [a for a in args if not a.startswith("--")]
        if not files:
            return problems  # sbatch's own flags, named in prose
        if not (ROOT / files[0]).is_file():
            return problems + [f"{files[0]} does not exist"]
        return problems + recipe_problems(files[1], files[2:])
    return problems + [f"{tool}: not a command of this repository, nor in EXTERNAL"]


@pytest.mark.parametrize("where, words", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_documented_command_runs_as_written(where: str, words: list[str]):
    assert problems_of(words) == [], f"{where}: {shlex.join(words)}"


@pytest.mark.parametrize("where, span", INLINE, ids=[c[0] for c in INLINE])
def test_a_command_in_the_prose_runs_as_written(where: str, span: str):
    """An inline command: the same checks, its flags against its command's own --help."""
    words = shlex.split(span.replace("…", "..."))
    assert problems_of(words, whole_line=False) == [], f"{where}: {span}"


def test_every_path_a_doc_names_exists():
    problems = [f"{where}: {p}" for where, span in SPANS for p in path_problems(span)]
    assert problems == []


def test_the_commands_were_found():
    """The parser above sees the README's quickstart (a check that reads nothing passes)."""
    readme = [words for where, words in COMMANDS if where.startswith("README.md")]
    assert ["make", "setup"] in readme and ["python", "-m", "data_prep.gsm8k"] in readme
    assert len(COMMANDS) > 100, len(COMMANDS)


def test_the_checks_go_red_on_planted_defects(tmp_path):
    """Each kind of defect, planted: an unknown flag, a missing required flag, a variable that is
    no knob, a knob value its check refuses, a recipe and a path that do not exist; a marked line
    is left out, and only it."""
    report = [sys.executable, "-m", "verl_gsm8k.report"]
    assert help_problems(report, ["--no-such-flag"], whole_line=False) == [
        "--no-such-flag is not in its --help"
    ]
    bench = shlex.split("python -m verl_gsm8k.bench.gpu_probe --models tiny")
    assert problems_of(bench, whole_line=False) == ["--out is required (its usage line)"]
    assert problems_of(["ACTOR_RL=1e-6", "bash", "recipes/smoke_tiny.sh"]) == [
        "ACTOR_RL is neither a knob (docs/knobs.md) nor a variable we know"
    ]
    assert problems_of(["ACTOR_LR=fast", "bash", "recipes/smoke_tiny.sh"]) == [
        f"ACTOR_LR=fast is not {BY_NAME['ACTOR_LR'].check.rule}"
    ]
    assert problems_of(["bash", "recipes/smoke.sh"]) == ["recipes/smoke.sh does not exist"]
    assert path_problems("see verl_gsm8k/launch/knob.py") == [
        "verl_gsm8k/launch/knob.py does not exist"
    ]
    assert path_problems("verl_gsm8k/launch/knobs.py, recipes/*.sh, launch/NAME.py") == []
    doc = tmp_path / "page.md"
    doc.write_text("`bash recipes/a.sh` and\n`bash recipes/b.sh` <!-- unchecked: planted -->\n")
    assert prose_spans([doc]) == [(f"{doc}:1", "bash recipes/a.sh")]

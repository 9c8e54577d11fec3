"""Every command of a ```bash block in README.md, recipes/README.md and docs/ parses as written
(`--help` after argparse parsed the whole line; a recipe's knobs and config keys; make targets),
and inline `command` spans name real flags and paths. `<!-- unchecked: why -->` skips a line.
"""

import functools
import importlib.util
import itertools
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import ROOT, capture
from omegaconf import OmegaConf

from verl_gsm8k.launch.knobs import BY_NAME, recipe_arguments
from verl_gsm8k.launch.knobs import problems as knob_problems
from verl_gsm8k.launch.plan import recipe_plan

DOCS = [ROOT / "README.md", ROOT / "recipes" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
EXTERNAL = {"git", "source", "export", "cat", "ray", "nvidia-smi", "wandb"}
# Not knobs: the set-up's (scripts/setup.sh), CI's, wandb's, Ray's, a doc's shorthand.
OTHER_VARIABLES = {
    "PYTHON", "SETUP_PYTHON", "FLASH_ATTN", "UPGRADE", "WHEELHOUSE", "STACK", "DIR", "EXCLUDE",
    "TORCH_CPU_INDEX", "TEST_WORKERS", "CI", "WANDB_MODE", "WANDB_API_KEY", "RAY_ADDRESS",
    "RAY_JOB_STOP_WAIT_TIME_S", "RAY_enable_worker_prestart", "SHARED",
}  # fmt: skip
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
PLACEHOLDER = re.compile(r"[<\[]|\.\.\.|HEAD_IP")
ABSENT = object()  # OmegaConf.select's answer for a key the config does not have


def doc_commands() -> list[tuple[str, list[str]]]:
    """(where, words) of every line of every bash block; `for ... do X; done` gives X."""
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
UNCHECKED = "<!-- unchecked:"
# A span may wrap across line breaks, not across a paragraph's end (a blank line).
SPAN = re.compile(r"`([^`\n]+(?:\n(?!\s*\n)[^`\n]*)*)`")
COMMAND_START = re.compile(r"([A-Z_][A-Z0-9_]*=\S+ )*(python -m |bash |make |sbatch )")
REPO_PATH = re.compile(
    r"(?:verl_gsm8k|scripts|recipes|configs|slurm|docs|tests|data_prep|rewards|\.ci)/[\w./*-]*"
)


def prose_spans(docs: list[Path] = DOCS) -> list[tuple[str, str]]:
    """(where, text) of every inline span outside the blocks, but those on an unchecked line."""
    found = []
    for path in docs:
        text = BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text("utf-8"))
        lines = text.splitlines()
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for match in SPAN.finditer(text):
            first = text.count("\n", 0, match.start())
            touched = lines[first : first + 1 + match.group(1).count("\n")]
            if not any(UNCHECKED in line for line in touched):
                found.append((f"{name}:{first + 1}", re.sub(r"\s*\n\s*", " ", match.group(1))))
    return found


SPANS = prose_spans()
INLINE = [(where, span) for where, span in SPANS if COMMAND_START.match(span)]


def path_problems(span: str) -> list[str]:
    """Each word starting with a repository folder names a path (a glob: one that matches)."""
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


def variables(words: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """The leading NAME=value words' problems (the launcher's check), the knobs, the rest."""
    problems, knobs = [], {}
    while words and (match := ASSIGNMENT.fullmatch(words[0])):
        name, value = match.groups()
        words = words[1:]
        if name in BY_NAME and not (PLACEHOLDER.search(value) or "$" in value):
            knobs[name] = value
        elif name not in BY_NAME and name not in OTHER_VARIABLES:
            problems.append(f"{name} is neither a knob (docs/knobs.md) nor a variable we know")
    return problems + knob_problems(knobs), knobs, words


def recipe_problems(recipe: str, args: list[str], knobs: dict[str, str]) -> list[str]:
    if PLACEHOLDER.search(recipe):
        return []  # recipes/<recipe>.sh: every recipe; its arguments below are placeholders too
    path = ROOT / recipe
    if not path.is_file():
        return [f"{recipe} does not exist"]
    user = [arg for arg in args if "=" in arg and not PLACEHOLDER.search(arg)]
    problems = [p for p in recipe_plan(path, knobs, user=user).problems()
                if p not in knob_problems(knobs)]  # fmt: skip
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
    """The flags outside brackets in argparse's usage line (``(--a | --b)`` left out)."""
    usage = help_text.split("\n\n", 1)[0]
    while (bare := re.sub(r"\[[^\[\]]*\]|\([^()]*\|[^()]*\)", "", usage)) != usage:
        usage = bare
    return set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", usage))


# Run with --help: ours only (another command might ignore it and run for real).
OWN_MODULES = ("verl_gsm8k", "data_prep")
OWN_SCRIPTS = ("scripts/",)


# A sitecustomize that makes --help wait until argparse has parsed the whole line.
PARSE_THEN_HELP = """import argparse, sys
asked, depth = [], [0]
argparse._HelpAction.__call__ = lambda self, parser, *_: asked.append(parser)
def _whole(method):
    def parse(self, *args, **kwargs):
        depth[0] += 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            depth[0] -= 1
        if asked and not depth[0]:
            asked[0].print_help()
            sys.exit(0)
        return result
    return parse
for name in ("parse_args", "parse_known_args"):
    setattr(argparse.ArgumentParser, name, _whole(getattr(argparse.ArgumentParser, name)))
"""
SITE = tempfile.TemporaryDirectory(prefix="doc-commands-")
(Path(SITE.name) / "sitecustomize.py").write_text(PARSE_THEN_HELP)


@functools.cache
def run_help(line: tuple[str, ...], whole: bool = False):
    path = os.pathsep.join([SITE.name, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path} if whole else None
    return capture([*line, "--help"], None, 120, cwd=ROOT, env=env)


def help_problems(command: list[str], args: list[str], whole_line: bool = True) -> list[str]:
    """--help of the line (``whole_line``) or of the command: exit 0, each flag named; for a
    span, the required flags given and each choice's value one of them."""

    def subcommand(arg: str) -> bool:  # not a flag, nor a pattern (one-node|multi-node, RUN_DIR)
        return not arg.startswith("-") and not PLACEHOLDER.search(arg) and arg.lower() == arg and (
            "|" not in arg)  # fmt: skip

    leading = list(itertools.takewhile(subcommand, args))
    whole = whole_line and "--help" not in args
    done = run_help(tuple(command + (args if whole_line else leading)), whole)  # subcommands kept
    if done.returncode != 0:
        said = ((done.stderr or done.stdout).strip() or "(nothing)").splitlines()[-1]
        return [f"exit {done.returncode} with --help: {said}"]
    flags = {arg.split("=")[0] for arg in args if arg.startswith("--")}
    problems = [f"{flag} is not in its --help" for flag in sorted(flags) if flag not in done.stdout]
    # a line showing the help needs nothing else; an inline span of the module alone names it
    if not whole_line and args and "--help" not in args:
        missing = sorted(required_flags(done.stdout) - flags)
        problems += [f"{flag} is required (its usage line)" for flag in missing]
        choices = dict(re.findall(r"(--[\w-]+) \{([^}]*)\}", done.stdout))
        pairs = [*zip(args, args[1:], strict=False), *(a.split("=", 1) for a in args if "=" in a)]
        problems += [f"{flag} {value} is not one of {{{choices[flag]}}}" for flag, value in pairs
                     if flag in choices and value not in choices[flag].split(",")
                     and not PLACEHOLDER.search(value) and "|" not in value]  # fmt: skip
    return problems


def problems_of(words: list[str], whole_line: bool = True) -> list[str]:
    problems, knobs, words = variables(words)
    if not words:
        return problems  # an assignment alone
    tool, args = words[0], words[1:]
    if "=" in tool and "." in tool.partition("=")[0]:  # overrides alone: the PPO recipe's keys
        return problems + recipe_problems("recipes/ppo_qwen2.5-0.5b_gsm8k.sh", words, knobs)
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
            return problems + recipe_problems(script, rest, knobs)
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
        return problems + recipe_problems(files[1], files[2:], knobs)
    return problems + [f"{tool}: not a command of this repository, nor in EXTERNAL"]


@pytest.mark.parametrize("where, words", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_documented_command_runs_as_written(where: str, words: list[str]):
    assert problems_of(words) == [], f"{where}: {shlex.join(words)}"


@pytest.mark.parametrize("where, span", INLINE, ids=[c[0] for c in INLINE])
def test_a_command_in_the_prose_runs_as_written(where: str, span: str):
    words = shlex.split(span.replace("…", "..."))
    assert problems_of(words, whole_line=False) == [], f"{where}: {span}"


def test_every_path_a_doc_names_exists():
    problems = [f"{where}: {p}" for where, span in SPANS for p in path_problems(span)]
    assert problems == []


def test_the_commands_are_found_and_the_checks_go_red_on_planted_defects(tmp_path):
    readme = [words for where, words in COMMANDS if where.startswith("README.md")]
    assert ["make", "setup"] in readme and ["python", "-m", "data_prep.gsm8k"] in readme
    assert len(COMMANDS) > 100, len(COMMANDS)
    for line, whole_line, said in [
        ("python -m verl_gsm8k.report --no-such-flag", False,
         "--no-such-flag is not in its --help"),
        ("python -m verl_gsm8k.report RUN --step lats", False,
         "--step lats is not one of {last,best}"),
        ("bash scripts/merge.sh runs/x", True,
         "exit 2 with --help: merge.sh: error: the following arguments are required: target"),
        ("python -m verl_gsm8k.bench.gpu_probe --models tiny", False,
         "--out is required (its usage line)"),
        ("ACTOR_RL=1e-6 bash recipes/smoke_tiny.sh", True,
         "ACTOR_RL is neither a knob (docs/knobs.md) nor a variable we know"),
        ("ACTOR_LR=fast bash recipes/smoke_tiny.sh", True,
         f"ACTOR_LR=fast is not {BY_NAME['ACTOR_LR'].check.rule}"),
        ("bash recipes/smoke.sh", True, "recipes/smoke.sh does not exist"),
    ]:  # fmt: skip
        assert problems_of(shlex.split(line), whole_line) == [said], line
    split = "TRAIN_BATCH_SIZE=100 does not split into mini-batches of PPO_MINI_BATCH_SIZE=64"
    for line in ("TRAIN_BATCH_SIZE=100 PPO_MINI_BATCH_SIZE=64 make test", "TRAIN_BATCH_SIZE=100 "
                 "bash recipes/ppo_qwen2.5-0.5b_gsm8k.sh"):  # fmt: skip
        assert [p.split(" (")[0] for p in problems_of(shlex.split(line))] == [split], line
    assert path_problems("see verl_gsm8k/launch/knob.py") == [
        "verl_gsm8k/launch/knob.py does not exist"]  # fmt: skip
    assert path_problems("verl_gsm8k/launch/knobs.py, recipes/*.sh, launch/NAME.py") == []
    doc = tmp_path / "page.md"
    doc.write_text("`bash recipes/a.sh` and\n`bash recipes/b.sh` <!-- unchecked: planted -->\n"
                   "a `bash\n  recipes/c.sh` then `d`\n\n`e\n\nf`\n")  # fmt: skip
    assert prose_spans([doc]) == [(f"{doc}:1", "bash recipes/a.sh"),
                                  (f"{doc}:3", "bash recipes/c.sh"), (f"{doc}:4", "d")]  # fmt: skip

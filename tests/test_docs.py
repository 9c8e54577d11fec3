"""Every measured figure has one home (none in LINK_ONLY files, a test count in docs/testing.md
only); the links, cited tests and knob defaults are true."""

import re
from pathlib import Path

import pytest
from helpers import ROOT

from verl_gsm8k.launch.knobs import BY_NAME

LINK_ONLY = ("README.md", "recipes/README.md", "Makefile", "docs/guide.md")
TEST_COUNT_HOME = "docs/testing.md"

_NUMBER = r"\d+(?:\.\d+)?"
FIGURE = re.compile(
    r"(?<![\w.])(?:"
    rf"{_NUMBER}(?:-{_NUMBER})?\s?(?:ms|s|sec|min|minutes|h|hours|GiB|GB|MiB|MB)\b(?! card| GPU)"
    r"|\d+ (?:passed|failed)\b"
    r"|0\.\d{2,}"  # an accuracy or a rate
    rf"|{_NUMBER} ?%"
    r")"
)
# Three digits or two decimals, a GiB figure with one decimal, h+min or min+s, or two digits not
# a multiple of 5 (round ones, 10 s or 30 s, are mostly settings).
DISTINCTIVE = re.compile(
    r"(?<![\w.])((?:\d{3,}|\d+\.\d{2,}|\d{2,}\.\d+)\s?(?:s|min|h|GiB|GB|MiB|MB)"
    r"|\d+\s?h \d+\s?(?:min|m)|\d+\s?(?:min|m) \d+\s?s"
    r"|[1-9][1-46-9]\s?(?:s|min|h)"
    r"|[1-9]\.\d\s?(?:GiB|GB))\b"
)
TEST_COUNT = re.compile(r"(?<![\w.])\d+ passed\b")

# Text of a figure's shape in a link-only file that is a setting or a version: blanked.
NOT_MEASURED = {
    "docs/guide.md": ("vLLM 0.24", "by at least 0.20", "above 90 %"),  # a version, CI, a threshold
    "Makefile": ("vLLM 0.24",),
    "recipes/README.md": (
        "0.37M-parameter",  # the tiny model's size, a property of its config
        "(3 %\nwarm-up",  # the SFT schedule's warm-up share
        "(90% of one group of writers' answers, 10%\nof the other's)",  # the toy data's design
    ),
}
# A distinctive figure two docs share by coincidence: the same number, not one measurement.
SHARED = {"120 s", "66 s"}  # a setting and a measurement; two measurements


def _lines(root: Path, path: str) -> list[str]:
    text = (root / path).read_text(encoding="utf-8")
    for allowed in NOT_MEASURED.get(path, ()):
        text = text.replace(allowed, re.sub(r"\S", "x", allowed))
    return text.splitlines()


def figures_outside_their_home(root: Path, link_only=LINK_ONLY) -> list[str]:
    """Every breach of the one-home rule, as ``file:line: figure (why)``."""
    problems = []
    for path in link_only:
        for number, line in enumerate(_lines(root, path), 1):
            for match in FIGURE.finditer(line):
                problems.append(f"{path}:{number}: {match.group(0)!r} in a link-only file")
    docs = [f"docs/{p.name}" for p in sorted((root / "docs").glob("*.md")) if p.name != "guide.md"]
    seen: dict[str, str] = {}
    for path in docs:
        for number, line in enumerate(_lines(root, path), 1):
            if path != TEST_COUNT_HOME:
                problems += [
                    f"{path}:{number}: {m.group(0)!r}: test counts live in {TEST_COUNT_HOME}"
                    for m in TEST_COUNT.finditer(line)
                ]
            for match in DISTINCTIVE.finditer(line):
                figure = re.sub(r"(\d)\s?([a-zA-Z])", r"\1 \2", match.group(1))
                figure = re.sub(r"(\d) min\b", r"\1 m", figure)  # 8 h 41 min is 8h 41m
                first = seen.setdefault(figure, f"{path}:{number}")
                if not first.startswith(f"{path}:") and figure not in SHARED:
                    problems.append(f"{path}:{number}: {figure!r} is also in {first}")
    return problems


def test_a_copied_figure_is_named_and_a_round_setting_is_not(tmp_path):
    fake = tmp_path / "repo"
    (fake / "docs").mkdir(parents=True)
    (fake / "README.md").write_text("The smoke run takes 154 s on a CPU.\n")
    for name, text in (("cpu", "**154 s**, wall 3m 21s"), ("testing", "1938 s, 878 passed"),
                       ("gpu", "the suite took 1938 s (878 passed)"),
                       ("reading", "logged 8 h 41 min; a step took 67 s"),
                       ("slurm", "a run of 8 h 41 min, 67 s a step, KillWait 30 s"),
                       ("compare", "wall 3m 21s, 8h 41m; the 30 s default")):  # fmt: skip
        (fake / "docs" / f"{name}.md").write_text(text + "\n")
    assert sorted(figures_outside_their_home(fake, ("README.md",))) == [
        "README.md:1: '154 s' in a link-only file",
        "docs/cpu.md:1: '3 m 21 s' is also in docs/compare.md:1",
        "docs/gpu.md:1: '878 passed': test counts live in docs/testing.md",
        "docs/reading.md:1: '8 h 41 m' is also in docs/compare.md:1",
        "docs/slurm.md:1: '67 s' is also in docs/reading.md:1",
        "docs/slurm.md:1: '8 h 41 m' is also in docs/compare.md:1",
        "docs/testing.md:1: '1938 s' is also in docs/gpu.md:1",
    ]


def test_the_readme_reads_in_five_minutes():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 130, len(lines)
    text = "\n".join(lines)
    for item in ("another size", "bigger model", "8 GPUs", "Slurm", "wandb", "resume",
                 "reward", "dataset", "report", "compare runs", "evaluate a checkpoint",
                 "run the tests"):  # fmt: skip
        assert item in text, item


# A test name, not part of a path or key (`val/test_score`); a trailing `_` is a prefix.
TEST_NAME = re.compile(r"(?:(?<=tests/)|(?<![\w/.\-]))(test_\w+?)(\.py)?(?![\w.*])")


def _doc_texts(root: Path):
    """(path, text) of README.md, recipes/README.md and docs/*.md, those there are."""
    docs = sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))
    for path in ("README.md", "recipes/README.md", *docs):
        if (root / path).is_file():
            yield path, (root / path).read_text(encoding="utf-8")


def cited_tests_missing(root: Path) -> list[str]:
    tests = root / "tests"
    defined = set(re.findall(r"^\s*(?:async )?def (test_\w+)", "\n".join(
        p.read_text(encoding="utf-8") for p in tests.glob("*.py")), re.M))  # fmt: skip
    problems = []
    for path, text in _doc_texts(root):
        for number, line in enumerate(text.splitlines(), 1):
            for name, py in TEST_NAME.findall(line):
                if py:
                    found = (tests / f"{name}.py").is_file()
                elif name.endswith("_"):
                    found = any(d.startswith(name) for d in defined)
                else:
                    found = name in defined
                if not found:
                    problems.append(f"{path}:{number}: {name}{py} is not in tests/")
    return problems


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    heads = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def links_outside_the_repository(root: Path) -> list[str]:
    """Relative links that leave the repository, name nothing in it, or a missing heading."""
    problems = []
    for path, text in _doc_texts(root):
        base = (root / path).parent
        for number, line in enumerate(text.splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # https://..., mailto:
                    continue
                page, _, anchor = target.partition("#")
                resolved = (base / page if page else root / path).resolve()
                if not resolved.is_relative_to(root.resolve()):
                    problems.append(f"{path}:{number}: {target} is outside the repository")
                elif not resolved.exists():  # docs/'s ../shared/ is the repository's, and absent
                    problems.append(f"{path}:{number}: {target} is not in the repository")
                elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                    problems.append(f"{path}:{number}: {target}: no such heading")
    return problems


KNOB_ROW = re.compile(r"^\|([^|]*)\|([^|]*)\|")


def knob_defaults_outside_knobs_md(root: Path) -> list[str]:
    """``| `KNOB` | its default |`` in a table whose 2nd column is "Default", outside docs/knobs.md
    (``| `A`, `B` | `1`, `2` |`` pairs in order); other tables hold settings for a case."""
    problems = []
    for path, text in _doc_texts(root):
        lines = text.splitlines() if path != "docs/knobs.md" else []
        header = ""
        for number, line in enumerate(lines, 1):
            if number < len(lines) and re.match(r"^\|\s*:?-{3,}", lines[number]):
                header = line
            match = KNOB_ROW.match(line)
            head = KNOB_ROW.match(header)
            if not match or not head or head.group(2).strip().lower() != "default":
                continue
            names = re.findall(r"`([A-Z][A-Z0-9_]+)`", match.group(1))
            values = [v.strip().strip("`").strip() for v in match.group(2).split(",")]
            for name, value in zip(names, values, strict=False):
                knob = BY_NAME.get(name)
                if knob is not None and knob.default not in (None, "") and value == knob.default:
                    problems.append(f"{path}:{number}: {name}'s default ({value}) in a table: "
                                    "link to docs/knobs.md instead")  # fmt: skip
    return problems


# A default in prose: "`K=V` (the default", "`K` (default `V`", "`K` knob, `V` by default", "`K`
# defaults to V", "`K` is 50 by default" (not "is on by default"); "`K=V` (default `W`)" says W.
PROSE_DEFAULTS = (
    re.compile(r"`([A-Z][A-Z0-9_]+)=([^`\s]+)`,?\s+\(?(?:the\s+)?default\b(?!:?\s+`)"),
    re.compile(r"`([A-Z][A-Z0-9_]+)`(?:\s+knob)?,?\s+\(?default:?\s+`?([^`\s,;)]+)`?"),
    re.compile(r"`([A-Z][A-Z0-9_]+)=[^`\s]+`,?\s+\(default:?\s+`([^`\s,;)]+)`"),
    re.compile(r"`([A-Z][A-Z0-9_]+)`(?:\s+knob)?,\s+`?([^`\s,;]+)`?\s+by\s+default"),
    re.compile(r"`([A-Z][A-Z0-9_]+)`\s+defaults\s+to\s+`?([^`\s,;)]+)"),
    re.compile(r"`([A-Z][A-Z0-9_]+)`\s+(?:is\s+|\()(`[^`\s]+`|-?\d[^\s,;)]*)\s+by\s+default"),
)


def knob_defaults_said_wrong(root: Path) -> list[str]:
    problems = []
    for path, text in _doc_texts(root):
        for pattern in PROSE_DEFAULTS:
            for match in pattern.finditer(text):
                name, value = match.group(1), match.group(2).strip("`").rstrip(".:")
                knob = BY_NAME.get(name)
                if knob is None or knob.default in (None, "") or value == knob.default:
                    continue
                number = text.count("\n", 0, match.start()) + 1
                problems.append(f"{path}:{number}: {name}'s default said as {value!r}; the "
                                f"table's is {knob.default!r} (docs/knobs.md)")  # fmt: skip
    return problems


CHECKS = [figures_outside_their_home, cited_tests_missing, links_outside_the_repository,
          knob_defaults_outside_knobs_md, knob_defaults_said_wrong]  # fmt: skip


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_the_docs_hold_each_figure_once_cite_what_exists_and_say_defaults_as_the_table(check):
    assert check(ROOT) == []


def test_the_citation_and_default_checks_go_red_on_planted_cases(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests" / "test_real.py").write_text("def test_real_name():\n    pass\n")
    (tmp_path / "README.md").write_text(
        "`tests/test_real.py::test_real_name`, `test_real_`, `val/test_score`, "
        "`trainer.test_freq`\n`tests/test_gone.py::test_made_up`\n[notes](../shared/notes.md), "
        "[ok](docs/x.md), [web](https://example.com)\n\n| Knob | Default |\n|---|---|\n"
        "| `TEST_FREQ` | `5` |\n\n| knob | 1 GPU |\n|---|---|\n| `TEST_FREQ` | 5 |\n"
    )
    (tmp_path / "docs" / "x.md").write_text(
        "`test_grpo_trains_on_cpu` [up](../../x.md)\n[shared](../shared/notes.md) [me](x.md)\n"
        "## Its Title, here\n[a](x.md#its-title-here) [b](#its-title-here) [c](../README.md#x) "
        "[d](#nope)\n"
    )
    missing = cited_tests_missing(tmp_path)
    assert missing == ["README.md:2: test_gone.py is not in tests/",
                       "README.md:2: test_made_up is not in tests/",
                       "docs/x.md:1: test_grpo_trains_on_cpu is not in tests/"]  # fmt: skip
    assert links_outside_the_repository(tmp_path) == [
        "README.md:3: ../shared/notes.md is outside the repository",
        "docs/x.md:1: ../../x.md is outside the repository",
        "docs/x.md:2: ../shared/notes.md is not in the repository",
        "docs/x.md:4: ../README.md#x: no such heading",
        "docs/x.md:4: #nope: no such heading",
    ]
    assert knob_defaults_outside_knobs_md(tmp_path) == [
        "README.md:7: TEST_FREQ's default (5) in a table: link to docs/knobs.md instead"
    ]
    (tmp_path / "docs" / "y.md").write_text(
        "`KEEP_BEST=0` (the default), `KEEP_BEST=1`, the default;\n"
        "`TRACE_SAMPLES` (default 8), the `ATTENTION` knob, `fa2` by default,\n"
        "`REWARD_FN` defaults to `compute_score`, `ACTOR_LR` (default `1e-6`),\n"
        "`DEVICE=cpu` (default `auto`), `SAVE_FREQ` defaults\nto 7\n"
        "`TEST_FREQ` is 50 by default, `ROLLOUT_N` (`4` by\ndefault), `WATCHDOG` is on by default\n"
    )
    said = "{}'s default said as '{}'; the table's is '{}' (docs/knobs.md)"
    assert sorted(knob_defaults_said_wrong(tmp_path)) == [
        f"docs/y.md:{n}: " + said.format(*case) for n, *case in [
            (1, "KEEP_BEST", 0, 1), (2, "ATTENTION", "fa2", "auto"), (2, "TRACE_SAMPLES", 8, 4),
            (4, "SAVE_FREQ", 7, 20), (6, "ROLLOUT_N", 4, 1), (6, "TEST_FREQ", 50, 5)]
    ]  # fmt: skip

"""Every measured figure has one home, and the README's commands and links are true.

A measured figure (a duration, a size, a test count, an accuracy) lives in the doc that measured
it, with the machine and date; every other place links to it. Two rules hold that:

* the link-only files (README.md, recipes/README.md, the Makefile, docs/guide.md) hold no figure
  of that shape at all, except the few settings and thresholds in ``NOT_MEASURED`` that only look
  like one;
* a distinctive figure (a duration or size of three significant digits or more, e.g.
  ``1938 s``, ``35.6 min``, or a size like ``4.6 GB``) appears in one doc of docs/ only, and a
  test count (``878 passed``) only in docs/testing.md.

A failure names the file, the line and the figure. Standard library only; well under a second.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
DISTINCTIVE = re.compile(
    r"(?<![\w.])((?:\d{3,}|\d+\.\d{2,}|\d{2,}\.\d+)\s?(?:s|min|h|GiB|GB|MiB|MB)"
    r"|[1-9]\.\d\s?(?:GiB|GB))\b"
)
TEST_COUNT = re.compile(r"(?<![\w.])\d+ passed\b")

# Text in a link-only file that has a figure's shape but is a setting, a threshold or a version,
# never a measurement; blanked before the check.
NOT_MEASURED = {
    "docs/guide.md": (
        "vLLM 0.24",  # a version
        "| `KL_COEF` | 0.001 |",  # a knob's default
        "longer than 30 s",  # STOP_GRACE_S's default against a GPU step
        "by at least 0.20",  # what CI asserts, not what a run gave
        "above 90 %",  # the preflight's warning threshold
        "3 %\nwarm-up",
        "0.30-0.45",  # WARM_START_ACC's default with TOY_TASK=hard, a band to stop at
    ),
    "Makefile": ("vLLM 0.24",),
    "recipes/README.md": (
        "0.37M-parameter",  # the tiny model's size, a property of its config
        "above 90 % of a",  # the preflight's warning threshold
        "(3 %\nwarm-up",  # the SFT schedule's warm-up share, a setting
        "(90% of one group of writers' answers, 10%\nof the other's)",  # the toy data's design
        "0.30-0.45",  # WARM_START_ACC's default with TOY_TASK=hard, a band to stop at
    ),
}
# A distinctive figure two docs share by coincidence: the same number, not the same measurement.
SHARED = {
    "159 s": "docs/gpu.md's flash-attn 4 compile on a GPU and docs/testing.md's `make setup` of "
    "the 2026-11-27 forenoon clone: two measurements that happen to match",
    "120 s": "docs/preflight.md stopped verl after 120 s; docs/reliability.md's Slurm signal "
    "comes 120 s before the time limit: both settings",
}


def _lines(path: str) -> list[str]:
    text = (ROOT / path).read_text(encoding="utf-8")
    for allowed in NOT_MEASURED.get(path, ()):
        text = text.replace(allowed, re.sub(r"\S", "x", allowed))
    return text.splitlines()


def figures_outside_their_home(link_only=LINK_ONLY, docs: list[str] | None = None) -> list[str]:
    """Every breach of the one-home rule, as ``file:line: figure (why)``."""
    problems = []
    for path in link_only:
        for number, line in enumerate(_lines(path), 1):
            for match in FIGURE.finditer(line):
                problems.append(
                    f"{path}:{number}: {match.group(0)!r} is a measured figure's shape in a "
                    "link-only file: link to the doc that measured it"
                )
    docs = docs or sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md") if p.name != "guide.md"
    )
    seen: dict[str, str] = {}
    for path in docs:
        for number, line in enumerate(_lines(path), 1):
            if path != TEST_COUNT_HOME:
                problems += [
                    f"{path}:{number}: {m.group(0)!r}: test counts live in {TEST_COUNT_HOME}"
                    for m in TEST_COUNT.finditer(line)
                ]
            for match in DISTINCTIVE.finditer(line):
                figure = re.sub(r"(\d)\s?([a-zA-Z])", r"\1 \2", match.group(1))
                first = seen.setdefault(figure, f"{path}:{number}")
                if not first.startswith(f"{path}:") and figure not in SHARED:
                    problems.append(
                        f"{path}:{number}: {figure!r} is also in {first}: one home, the other "
                        "links to it"
                    )
    return problems


def test_every_measured_figure_has_one_home():
    assert figures_outside_their_home() == []


def test_a_figure_copied_into_the_readme_is_named(tmp_path, monkeypatch):
    """The rule goes red when a figure is copied from its home, naming the file and the line."""
    fake = tmp_path / "repo"
    (fake / "docs").mkdir(parents=True)
    (fake / "README.md").write_text("# x\n\nThe smoke run takes 154 s on a CPU.\n")
    (fake / "docs" / "cpu.md").write_text("| wall time | **154 s** (2026-11-26) |\n")
    (fake / "docs" / "testing.md").write_text("| `make test` | 1938 s, 878 passed |\n")
    (fake / "docs" / "gpu.md").write_text("the suite took 1938 s (878 passed)\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    problems = figures_outside_their_home(("README.md",))
    assert problems[0].startswith("README.md:3: '154 s' is a measured figure's shape")
    assert "docs/gpu.md:1: '878 passed': test counts live in docs/testing.md" in problems
    assert "docs/testing.md:1: '1938 s' is also in docs/gpu.md:1: one home" in problems[-1]
    assert len(problems) == 3


# ---------------------------------------------------------------------------------------------
# The README's commands and links are true


def _readme_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line:
                commands.append(shlex.split(line))
    return commands


def test_every_readme_command_names_what_exists():
    from verl_gsm8k.evaluate.cli import build_parser

    makefile = (ROOT / "Makefile").read_text()
    from verl_gsm8k.launch.knobs import BY_NAME

    eval_flags = {o for a in build_parser()._actions for o in a.option_strings}
    checked = 0
    for words in _readme_commands():
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            knob = words.pop(0).split("=")[0]
            assert knob in BY_NAME or knob in ("WANDB_API_KEY", "WANDB_MODE", "PYTHON"), knob
            checked += 1
        if words[:1] == ["make"]:
            assert re.search(rf"^{words[1]}:", makefile, re.M), words
        if words[:1] == ["bash"] and not words[1].startswith("recipes/"):
            assert (ROOT / words[1]).is_file(), words
        if words[:1] == ["bash"] and words[1].startswith("recipes/"):
            assert (ROOT / words[1]).is_file(), words
        if words[1:2] == ["scripts/eval.sh"]:
            flags = [w for w in words if w.startswith("--")]
            assert set(flags) <= eval_flags, flags
        checked += 1
    assert checked > 20


PENDING = {"docs/slurm.md"}  # linked before it was written: links into it are not checked


def test_every_readme_link_and_anchor_exists():
    def anchors(path: Path) -> set[str]:
        heads = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
        return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}

    for source in ("README.md", "docs/guide.md", "recipes/README.md"):
        base = (ROOT / source).parent
        text = (ROOT / source).read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+\.md)(#[^)]+)?\)", text):
            path, anchor = target
            resolved = (base / path).resolve()
            if str(resolved.relative_to(ROOT)) in PENDING:
                continue
            assert resolved.is_file(), f"{source}: {path}"
            if anchor:
                assert anchor[1:] in anchors(resolved), f"{source}: {path}{anchor}"


def test_the_readme_reads_in_five_minutes():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, len(lines)
    text = "\n".join(lines)
    for item in ("another size", "bigger model", "8 GPUs", "Slurm", "wandb", "resume",
                 "reward", "dataset", "report", "compare runs", "evaluate a checkpoint",
                 "run the tests"):  # fmt: skip
        assert item in text, item

"""Comments and docstrings a reader can follow: no issue numbers, dates or one machine's paths.

Evidence (a measurement, its machine and date) lives in docs/. No comment or docstring carries an
issue number (an upstream issue is cited by its URL), a date, or one machine's path. Other string
literals are data and are not read.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("verl_gsm8k", "data_prep", "rewards", "scripts", "tests")

_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
FORBIDDEN = {
    "an issue number": re.compile(r"\b[Ii]ssues? #?\d+|(?<![#&\w])#\d+\b"),
    "a date": re.compile(rf"\b20\d\d-[01]\d-[0-3]\d\b|\b{_MONTH} [0-3]?\d\b"),
    "a path of one machine": re.compile(r"(?<![\w.~])/(?:work|root)/|/home/\w+/|/tmp/bench"),
    "a session reference": re.compile(r"\bthis session\b", re.I),
}


def python_files() -> list[Path]:
    return sorted(path for tree in TREES for path in (ROOT / tree).rglob("*.py"))


def _comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment, its leading '#'s stripped."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string.lstrip("#")))
    return found


def _docstrings(source: str, name: str) -> list[tuple[int, str]]:
    """(line, text) of every line of every module, class and function docstring, as written."""
    found = []
    tree = ast.parse(source, name)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if not (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            continue
        literal = body[0].value
        text = ast.get_source_segment(source, literal) or ""
        found += [(literal.lineno + i, line) for i, line in enumerate(text.splitlines())]
    return found


def problems_in(path: Path) -> list[str]:
    """Every forbidden reference in ``path``'s comments and docstrings, as ``file:line: ...``."""
    source = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    problems = []
    read = (("comment", _comments(source)), ("docstring", _docstrings(source, str(path))))
    for kind, lines in read:
        for line, text in lines:
            for what, pattern in FORBIDDEN.items():
                match = pattern.search(text)
                if match:
                    problems.append(
                        f"{rel}:{line}: {kind} carries {what} ({match.group(0)!r}): say what the "
                        "code does and why; cite the docs/ section that holds the evidence"
                    )
    return problems


def test_no_comment_or_docstring_carries_an_issue_a_date_or_a_machine_path() -> None:
    problems = [p for path in python_files() for p in problems_in(path)]
    assert not problems, "\n".join(problems)


def test_the_check_reads_comments_and_docstrings_and_leaves_data_alone(tmp_path: Path) -> None:
    """Each form is found, by file and line; a date in a plain string (test data) is not."""
    module = tmp_path / "probe.py"
    module.write_text(
        '"""A module (issue 35)."""\n'
        "STAMP = '2026-11-25'  # data, not a comment\n"
        "X = 1  # measured 2026-11-25\n"
        "\n"
        "\n"
        "def f():\n"
        '    """Read from\n'
        '    /work/fixtures/learn_ppo."""\n'
        "    # fixed in #38, seen on Nov 25, in this session\n"
        "    return '#### 72'  # the answer line, '####' then the number\n"
        "\n"
        "\n"
        "class C:\n"
        '    """Upstream: https://github.com/verl-project/verl/issues/5210, step 3 of 8."""\n'
    )
    found = problems_in(module)
    where = [(p.split(":")[1], p.split(" carries ")[1].split(" (")[0]) for p in found]
    assert where == [
        ("3", "a date"),
        ("9", "an issue number"),
        ("9", "a date"),
        ("9", "a session reference"),
        ("1", "an issue number"),
        ("8", "a path of one machine"),
    ], found

"""The package layout: LAYERS in verl_gsm8k/__init__.py is the import order, and it is true.

Every import between our packages (also inside functions and via importlib.import_module) is
read from the source, so a new upward import fails here, naming the file and line.
"""

import ast
from pathlib import Path

import verl_gsm8k
from verl_gsm8k import LAYERS

ROOT = Path(verl_gsm8k.__file__).parent
REPO = ROOT.parent
MAX_PACKAGE_LINES = 3000
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80  # from its def line to its last line: one job a reader can hold
# Functions allowed over MAX_FUNCTION_LINES, "path/under/verl_gsm8k.py:function": {why it is one
# job that cannot be cut}.
LONG_FUNCTIONS: dict[str, str] = {}


def packages() -> list[str]:
    return sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())


def layer_of() -> dict[str, int]:
    return {name: i for i, layer in enumerate(LAYERS) for name in layer}


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, package) of every import of a verl_gsm8k package in one module."""
    tree = ast.parse(path.read_text(), str(path))
    own = path.relative_to(ROOT).parts
    found: list[tuple[int, str]] = []
    constants = {  # NAME = "verl_gsm8k...." at module level, for import_module(NAME)
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def add(line: int, dotted: str) -> None:
        parts = dotted.split(".")
        if parts[0] == "verl_gsm8k" and len(parts) > 1:
            found.append((line, parts[1]))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["verl_gsm8k", *own[: len(own) - node.level]]
                dotted = ".".join(base + ([node.module] if node.module else []))
            else:
                dotted = node.module or ""
            if dotted == "verl_gsm8k":
                for alias in node.names:
                    add(node.lineno, f"verl_gsm8k.{alias.name}")
            else:
                add(node.lineno, dotted)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
        ):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                add(node.lineno, arg.value)
            elif isinstance(arg, ast.Name) and arg.id in constants:
                add(node.lineno, constants[arg.id])
    return found


def test_every_package_is_in_one_layer() -> None:
    listed = [name for layer in LAYERS for name in layer]
    assert len(listed) == len(set(listed)), f"a package is in two layers: {listed}"
    assert sorted(listed) == packages(), (
        f"LAYERS {sorted(listed)} != the packages on disk {packages()}")  # fmt: skip


def test_no_package_imports_its_own_layer_or_above() -> None:
    layers = layer_of()
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if len(rel.parts) < 2:
            continue  # verl_gsm8k/__init__.py
        mine = rel.parts[0]
        for line, other in imported_packages(path):
            if other != mine and layers[other] >= layers[mine]:
                upward.append(
                    f"{rel}:{line} ({mine}, layer {layers[mine]}) imports {other} "
                    f"(layer {layers[other]})"
                )
    assert not upward, "imports against LAYERS:\n" + "\n".join(upward)


def test_the_layer_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The reader above is what makes the test able to fail: each form is found."""
    module = ROOT / "guard" / "_layout_probe.py"
    module.write_text(
        "import importlib\n"
        "import verl_gsm8k.report.cli\n"
        "PLUGIN = 'verl_gsm8k.bench.reward'\n"
        "from verl_gsm8k.compare import cli\n"
        "from ..replay import load\n"
        "from verl_gsm8k import runpage\n"
        "def f():\n"
        "    from verl_gsm8k.questions.table import build\n"
        "    importlib.import_module('verl_gsm8k.ppo_trainer.traced')\n"
        "    importlib.import_module(PLUGIN)\n"
    )
    try:
        found = [name for _, name in imported_packages(module)]
    finally:
        module.unlink()
    expected = {"report", "compare", "replay", "runpage", "questions", "ppo_trainer", "bench"}
    assert sorted(found) == sorted(expected), found


def test_sizes() -> None:
    big_packages, big_modules = [], []
    for name in packages():
        total = 0
        for path in (ROOT / name).rglob("*.py"):
            lines = len(path.read_text().splitlines())
            total += lines
            if lines > MAX_MODULE_LINES:
                big_modules.append(f"{path.relative_to(REPO)}: {lines}")
        if total > MAX_PACKAGE_LINES:
            big_packages.append(f"{name}: {total}")
    assert not big_packages, f"packages over {MAX_PACKAGE_LINES} lines: {big_packages}"
    assert not big_modules, f"modules over {MAX_MODULE_LINES} lines: {big_modules}"


def long_functions(root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{"path:function": lines}`` of every function or method over ``limit`` lines (nested ones
    counted on their own too; a name defined twice in a module is counted at its longest)."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                name = f"{path.relative_to(root).as_posix()}:{node.name}"
                if lines > limit and lines > found.get(name, 0):
                    found[name] = lines
    return found


def test_no_function_is_longer_than_a_reader_can_hold() -> None:
    found = long_functions()
    new = {name: lines for name, lines in found.items() if name not in LONG_FUNCTIONS}
    assert not new, (
        f"functions over {MAX_FUNCTION_LINES} lines (split them along their seams, or add them to "
        f"LONG_FUNCTIONS with the reason): "
        + ", ".join(f"verl_gsm8k/{name} ({lines} lines)" for name, lines in sorted(new.items()))
    )
    stale = sorted(set(LONG_FUNCTIONS) - set(found))
    assert not stale, f"LONG_FUNCTIONS names functions no longer over the limit: {stale}"


def test_the_length_check_counts_a_long_function(tmp_path: Path) -> None:
    """The scan that makes the rule able to fail: a method 81 lines long is found, by name."""
    body = "".join(f"        x{i} = {i}\n" for i in range(79))
    (tmp_path / "probe.py").write_text(f"class C:\n    def long(self):\n{body}        return 0\n")
    assert long_functions(tmp_path) == {"probe.py:long": 81}


def test_every_package_is_named_in_the_map() -> None:
    architecture = (REPO / "docs" / "architecture.md").read_text()
    missing = [n for n in packages() if f"\n  {n}/ " not in architecture]
    assert not missing, f"docs/architecture.md's map omits {missing}"

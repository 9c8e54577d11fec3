"""The tools the recipes can give the model (TOOLS=<name>): configs/tools/<name>.yaml, verl's tool
config, each naming its class here (calculator.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "tools"
TOOLS = ("calculator",)
TURNS = 3  # the model's turns in a tool response, in training (TOOL_TURNS) and in the evaluation


def config_path(name: str) -> Path:
    """The tool config a launch gives verl (``multi_turn.tool_config_path``)."""
    return CONFIG_DIR / f"{name}.yaml"


def schemas(config: Path) -> list[dict[str, Any]]:
    """The tools of a verl tool config as the chat template shows them (what verl's agent loop
    dumps from the same file: tests/test_calculator.py checks it), read with PyYAML alone: the
    evaluation's environment has no verl."""
    import yaml

    with open(config, encoding="utf-8") as handle:
        return [tool["tool_schema"] for tool in yaml.safe_load(handle)["tools"]]

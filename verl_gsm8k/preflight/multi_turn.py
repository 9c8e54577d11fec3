"""A tool launch (multi_turn.tool_config_path): rows run the tool_agent loop, prompts fit with
the tools block, the response budget covers every turn."""

from pathlib import Path
from typing import Any

from verl_gsm8k.preflight.lines import Report, one_line


def tools_of(cfg: Any, report: Report) -> list[dict[str, Any]] | None:
    """The tool schemas the model is shown; None for a launch without tools."""
    from verl_gsm8k.tools import schemas

    path = cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path
    if not path:
        return None
    try:
        return schemas(Path(path))
    except Exception as exc:
        report.error("tools", f"tool config {path} cannot be read as verl reads it: "
                     f"{one_line(exc)}")  # fmt: skip
        return []


def check_loops(cfg: Any, table: Any, path: Path, split: str, report: Report) -> None:
    """Every row runs tool_agent (a row without ``agent_name`` runs the default loop)."""
    default = cfg.actor_rollout_ref.rollout.agent.default_agent_loop
    have = table.column_names
    loops = table.column("agent_name").to_pylist() if "agent_name" in have else []
    loops = [loop or default for loop in loops] or [default] * table.num_rows
    other = {loop for loop in loops if loop != "tool_agent"}
    if other:
        count = sum(loop != "tool_agent" for loop in loops)
        report.error("tools", f"{split} file {path}: {count} of {len(loops)} rows run verl's "
                     f"{', '.join(sorted(other))} loop, which shows the model no tools; write "
                     "the rows with `python -m data_prep.gsm8k --tools <name>` (agent_name "
                     "tool_agent)")  # fmt: skip
    else:
        report.ok("tools", f"{split} file {path.name}: every row runs verl's tool_agent loop")


def check_budget(cfg: Any, tools: list[dict[str, Any]], report: Report) -> None:
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    turns, chars = multi_turn.max_assistant_turns, multi_turn.max_tool_response_length
    names = ", ".join(tool["function"]["name"] for tool in tools)
    report.ok("tools", f"{names}: max_response_length {cfg.data.max_response_length} tokens is "
              f"the whole response, every turn and the tool's replies included (model turns: "
              f"{turns or 'no limit'}; replies cut at {chars} characters); the memory estimate "
              "counts all of it")  # fmt: skip

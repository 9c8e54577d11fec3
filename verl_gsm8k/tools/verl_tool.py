"""The tools as verl's agent loop calls them: the classes configs/tools/*.yaml name."""

from __future__ import annotations

from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

from verl_gsm8k.tools.calculator import calculate


class CalculatorTool(BaseTool):
    """One instance per agent-loop worker; each call computes its arguments' expression."""

    async def execute(self, instance_id: str, parameters: Any, **kwargs: Any):
        return ToolResponse(text=calculate(parameters)), 0.0, {}

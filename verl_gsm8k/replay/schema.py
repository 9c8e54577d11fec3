"""The types a trace line may hold (``verl_gsm8k.trace.record`` writes them), checked before a
page is built from it: a trace in a shared folder is untrusted input. ``problem(line)`` names the
first field of the wrong type, or returns None."""

from __future__ import annotations

from typing import Any

Kind = str  # "int", "num", "str", "scalar" (str, number or bool), each also allowing null


def _is(kind: Kind, value: Any) -> bool:
    if value is None:
        return True
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "num":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    return isinstance(value, (str, int, float, bool))  # "scalar"


# Fields of a step line and of a sample line, by their dotted path.
STEP_FIELDS: dict[str, Kind] = {
    "step": "int", "traced": "int", "of": "int",
    "run.experiment": "str", "run.metrics_file": "str", "run.adv_estimator": "str",
    "run.gamma": "num", "run.lam": "num", "run.norm_adv_by_std_in_grpo": "scalar",
    "run.rollout_n": "int", "run.max_response_length": "int",
    "run.kl.in": "str", "run.kl.estimator": "str", "run.kl.coef": "num", "run.kl.controller": "str",
}  # fmt: skip
SAMPLE_FIELDS: dict[str, Kind] = {
    "step": "int", "key": "str", "uid": "str", "session": "int", "score": "num",
    "data_source": "scalar", "ground_truth": "scalar",
}  # fmt: skip
# Mappings whose every value has one kind, and lists whose every item has one kind.
STEP_MAPS: dict[str, Kind] = {
    "metrics": "num", "batch.groups": "num", "batch.response_lengths": "int",
    "batch.advantage_whitening": "num",
}  # fmt: skip
SAMPLE_MAPS: dict[str, Kind] = {"reward_extra": "scalar", "absent": "str"}
SAMPLE_LISTS: dict[str, Kind] = {
    "prompt.tokens": "str", "prompt.ids": "int", "response.tokens": "str", "response.ids": "int",
}  # fmt: skip


def _get(line: dict[str, Any], path: str) -> tuple[bool, Any]:
    """(found, value) at a dotted path; a parent that is not a mapping is itself the problem."""
    value: Any = line
    for part in path.split("."):
        if not isinstance(value, dict):
            return True, value
        if part not in value:
            return False, None
        value = value[part]
    return True, value


def _name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def problem(line: dict[str, Any]) -> str | None:
    """The first field of ``line`` (a step or a sample line) of the wrong type, in one phrase."""
    step = line.get("kind") == "step"
    for path in ("run", "run.kl", "batch") if step else ("prompt", "response", "per_token"):
        found, value = _get(line, path)
        if found and value is not None and not isinstance(value, dict):
            return f"field {path} is a {_name(value)}, not a mapping"
    for path, kind in (STEP_FIELDS if step else SAMPLE_FIELDS).items():
        found, value = _get(line, path)
        if found and not _is(kind, value):
            return f"field {path} is a {_name(value)}, not a {kind}"
    for path, kind in (STEP_MAPS if step else SAMPLE_MAPS).items():
        found, value = _get(line, path)
        if not found or value is None:
            continue
        if not isinstance(value, dict):
            return f"field {path} is a {_name(value)}, not a mapping"
        for key, item in value.items():
            if not _is(kind, item):
                return f"field {path}.{key} is a {_name(item)}, not a {kind}"
    if step:
        return None
    lists = dict(SAMPLE_LISTS)
    lists.update({f"per_token.{name}": "num" for name in line.get("per_token") or {}})
    for path, kind in lists.items():
        found, value = _get(line, path)
        if not found or value is None:
            continue
        if not isinstance(value, list):
            return f"field {path} is a {_name(value)}, not a list"
        for index, item in enumerate(value):
            nullable = path.startswith("per_token.")  # NaN and inf were written as null
            if (item is None and not nullable) or not _is(kind, item):
                return f"field {path}[{index}] is a {_name(item)}, not a {kind}"
    return None

"""The one config diff: a verl config as dotted keys, and the keys whose values differ between
configs. The resume's same-config check (resume/same_config.py) and the run comparison
(compare/config.py) both use it. Standard library only."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def leaves(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": [1, 2]}, "c": {}} -> {"a.b": [1, 2]}: a list is one value; an empty mapping
    or list holds no setting."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(leaves(value, f"{prefix}{key}."))
        elif value != []:
            flat[f"{prefix}{key}"] = value
    return flat


def _norm(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _norm(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    try:  # a number, or one left unresolved as written: "1e-6"
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return str(value)


def canonical(value: Any) -> str:
    """Equal settings, equal text: numbers as numbers (1e-6, 0.000001 and "1e-6"; 1 and 1.0),
    true apart from 1, a mapping's order ignored, a list's kept."""
    return json.dumps(_norm(value), sort_keys=True)


def differing(flats: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys (of ``leaves``) whose values are not the same in every config, in the order
    first seen; a key some config lacks differs."""
    keys = dict.fromkeys(key for flat in flats for key in flat)
    return [
        key
        for key in keys
        if len({canonical(flat[key]) if key in flat else "" for flat in flats}) > 1
    ]

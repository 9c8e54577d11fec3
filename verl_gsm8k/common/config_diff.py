"""The one config diff (resume check, run comparison): a verl config as dotted keys, and the keys
whose values differ."""

import json
from collections.abc import Mapping, Sequence
from typing import Any


def leaves(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": [1, 2]}, "c": {}, "d": []} -> {"a.b": [1, 2]}."""
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
    """Equal settings, equal text: 1e-6 == "1e-6", 1 == 1.0, true != 1, mapping order ignored."""
    return json.dumps(_norm(value), sort_keys=True)


def differing(flats: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys (of ``leaves``) not the same in every config (missing in one: differs)."""
    keys = dict.fromkeys(key for flat in flats for key in flat)
    return [k for k in keys if len({canonical(f[k]) if k in f else "" for f in flats}) > 1]

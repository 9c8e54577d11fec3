"""Overrides and the composed config: split an override, find legacy keys, compose against the
installed verl config, and say why a composition failed in one line (the closest valid key for an
unknown key, the override Hydra cannot parse)."""

from __future__ import annotations

import copy
import difflib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verl_gsm8k.preflight.lines import Report, one_line

# prefix -> (replacement prefix, why); a prefix ending in "." matches every key under it, and a
# replacement of "" means "remove it".
LegacyKeys = dict[str, tuple[str, str]]


def split_override(override: str) -> tuple[str, str]:
    """'++a.b=c' -> ('a.b', 'c'); '~a.b' -> ('a.b', '')."""
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def legacy_key_problems(
    keys: list[str], table: LegacyKeys, cfg: Any = None, kind: str = "a legacy key"
) -> list[str]:
    """One line per key the table lists, with the key to use; given the composed ``cfg``, a key
    to use that it lacks is named with Hydra's ``+``, so that it composes as printed."""
    from omegaconf import OmegaConf

    problems, absent = [], object()
    for key in keys:
        for prefix, (replacement, why) in table.items():
            if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
                use = replacement + key[len(prefix) :] if replacement else ""
                if use and cfg is not None and OmegaConf.select(cfg, use, default=absent) is absent:
                    use = f"+{use}"
                problems.append(f"'{key}' is {kind}: {why}; {f'use {use}' if use else 'remove it'}")
                break
    return problems


def verl_config_dir() -> Path:
    """The installed verl's config folder, found without importing verl (its ``__init__`` imports
    torch and tensordict, seconds of a launch), as the configs' ``pkg://`` searchpath would."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed (make setup)")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


# Configs composed in this process: the preflight and the launch record ask for the same one.
_COMPOSED: dict[tuple[str, str, tuple[str, ...]], Any] = {}


def compose(config_dir: Path, config_name: str, overrides: list[str]):
    """The config verl composes from ``config_dir/config_name`` and the overrides (a copy)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    key = (str(config_dir), config_name, tuple(overrides))
    if key not in _COMPOSED:
        searchpath = f"hydra.searchpath=[file://{verl_config_dir()}]"
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            _COMPOSED[key] = hydra_compose(config_name, overrides=[searchpath, *overrides])
    return copy.deepcopy(_COMPOSED[key])


def flat_keys(node: Any, prefix: str = "") -> Iterator[str]:
    for name, value in node.items() if isinstance(node, dict) else ():
        yield f"{prefix}{name}"
        yield from flat_keys(value, f"{prefix}{name}.")


def closest_keys(bad_key: str, valid: list[str]) -> list[str]:
    """Valid keys with the same leaf first (ranked by similarity), else the most similar."""
    leaf = bad_key.rsplit(".", 1)[-1]
    same_leaf = [k for k in valid if k.rsplit(".", 1)[-1] == leaf]
    ranked = difflib.get_close_matches(bad_key, same_leaf, n=2, cutoff=0.0)
    return ranked or difflib.get_close_matches(bad_key, valid, n=2, cutoff=0.6)


def compose_error(exc: Exception, config_dir: Path, config_name: str) -> str:
    """The one line a failed ``compose`` is: an unknown key with the closest ones, an override
    Hydra cannot parse, or the error itself."""
    from hydra.errors import OverrideParseException
    from omegaconf import OmegaConf

    if isinstance(exc, OverrideParseException):
        why = str(exc).split("\nSee https://", 1)[0].splitlines()[-1]
        return (
            f"override {exc.override!r} is not in Hydra's override grammar ({why}); a value "
            "holding $ ( ) or spaces goes in quotes inside the argument: key='value' "
            "(https://hydra.cc/docs/advanced/override_grammar/basic/)"
        )
    match = re.search(r"Could not override '([^']+)'", str(exc))
    if not match:
        return one_line(exc)
    base = OmegaConf.to_container(compose(config_dir, config_name, []), resolve=False)
    near = closest_keys(match[1], list(flat_keys(base)))
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    return f"unknown key '{match[1]}' in the installed verl config{hint}"


def compose_checked(config_dir: Path, config_name: str, overrides: list[str], report: Report):
    """The composed config, or None after the config check's error line."""
    try:
        return compose(config_dir, config_name, overrides)
    except Exception as exc:  # Hydra raises several types; all mean "does not compose"
        report.error("config", compose_error(exc, config_dir, config_name))
        return None

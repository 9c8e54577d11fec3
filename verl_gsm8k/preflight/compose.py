"""Overrides split, legacy keys found, the config composed against the installed verl, and one
line on why it did not compose."""

import copy
import difflib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verl_gsm8k.preflight.lines import Report, one_line

# prefix (ending in "." for every key under it) -> (the key to use, "" to remove it; why)
LegacyKeys = dict[str, tuple[str, str]]
_COMPOSED: dict[tuple[str, str, tuple[str, ...]], Any] = {}  # the preflight's, the record's


def split_override(override: str) -> tuple[str, str]:
    """'++a.b=c' -> ('a.b', 'c'); '~a.b' -> ('a.b', '')."""
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def legacy_key_problems(keys: list[str], table: LegacyKeys, cfg: Any = None,
                        kind: str = "a legacy key") -> list[str]:  # fmt: skip
    """One line per key the table lists, with the key to use (``+`` if new)."""
    from omegaconf import OmegaConf

    problems, absent = [], object()
    for key in keys:
        prefix = next((p for p in table if key == p or p[-1] == "." and key.startswith(p)), None)
        if prefix is not None:
            replacement, why = table[prefix]
            use = replacement + key[len(prefix) :] if replacement else ""
            if use and cfg is not None and OmegaConf.select(cfg, use, default=absent) is absent:
                use = f"+{use}"
            problems.append(f"'{key}' is {kind}: {why}; {f'use {use}' if use else 'remove it'}")
    return problems


def compose(config_dir: Path, config_name: str, overrides: list[str]) -> Any:
    """A copy of the config verl composes (its configs found without importing verl)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    key = (str(config_dir), config_name, tuple(overrides))
    if key not in _COMPOSED:
        spec = importlib.util.find_spec("verl")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("verl is not installed (make setup)")
        verl = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            searchpath = f"hydra.searchpath=[file://{verl}]"
            _COMPOSED[key] = hydra_compose(config_name, overrides=[searchpath, *overrides])
    return copy.deepcopy(_COMPOSED[key])


def flat_keys(node: Any, prefix: str = "") -> Iterator[str]:
    for name, value in node.items() if isinstance(node, dict) else ():
        yield f"{prefix}{name}"
        yield from flat_keys(value, f"{prefix}{name}.")


def compose_error(exc: Exception, config_dir: Path, config_name: str) -> str:
    from hydra.errors import OverrideParseException
    from omegaconf import OmegaConf

    if isinstance(exc, OverrideParseException):
        why = str(exc).split("\nSee https://", 1)[0].splitlines()[-1]
        return (f"override {exc.override!r} is not in Hydra's override grammar ({why}); quote a "
                "value holding $ ( ) or spaces inside the argument: key='value'")  # fmt: skip
    bad = re.search(r"Could not override '([^']+)'", str(exc))
    if not bad:
        return one_line(exc)
    valid = list(flat_keys(OmegaConf.to_container(compose(config_dir, config_name, []))))
    leaf = [k for k in valid if k.rsplit(".", 1)[-1] == bad[1].rsplit(".", 1)[-1]]
    near = difflib.get_close_matches(bad[1], leaf, n=2, cutoff=0.0) or difflib.get_close_matches(
        bad[1], valid, n=2, cutoff=0.6)  # fmt: skip
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    return f"unknown key '{bad[1]}' in the installed verl config{hint}"


def compose_checked(config_dir: Path, config_name: str, overrides: list[str], report: Report):
    try:
        return compose(config_dir, config_name, overrides)
    except Exception as exc:  # Hydra raises several types; all mean "does not compose"
        report.error("config", compose_error(exc, config_dir, config_name))
        return None

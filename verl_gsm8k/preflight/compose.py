"""Overrides and the composed config, for both preflights (cli.py: PPO; sft.py: SFT): split an
override, refuse legacy keys with the key to use, compose against the installed verl config, and
name the closest valid key when an override names one that does not exist."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from typing import Any

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
    """One line per key of ``keys`` that the table lists ("'key' is <kind>: why; use ..."), with
    the key to use instead. Given the composed config ``cfg``, a key to use that it lacks is
    named with Hydra's ``+`` (append), so that the suggestion composes as printed."""
    problems = []
    for key in keys:
        for prefix, (replacement, why) in table.items():
            exact = not prefix.endswith(".")
            if (exact and key == prefix) or (not exact and key.startswith(prefix)):
                suggestion = replacement + key[len(prefix) :] if replacement else ""
                if suggestion and cfg is not None and not has_key(cfg, suggestion):
                    suggestion = "+" + suggestion
                fix = f"use {suggestion}" if suggestion else "remove it"
                problems.append(f"'{key}' is {kind}: {why}; {fix}")
                break
    return problems


def has_key(cfg: Any, dotted: str) -> bool:
    """Whether the composed config has the key (its value may be null)."""
    from omegaconf import OmegaConf

    absent = object()
    return OmegaConf.select(cfg, dotted, default=absent) is not absent


def verl_config_dir() -> Path:
    """The installed verl's config folder, found without importing verl: the configs' searchpath
    ``pkg://verl.trainer.config`` makes Hydra import the package, and verl's ``__init__`` imports
    torch and tensordict (~7 s of a launch on 2 cores)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed (make setup)")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


# Configs composed in this process, by (config dir, name, overrides): the launcher's preflight and
# its launch record ask for the same one (about a second each on 2 cores); each caller gets a copy.
_COMPOSED: dict[tuple[str, str, tuple[str, ...]], Any] = {}


def compose(config_dir: Path, config_name: str, overrides: list[str]):
    """The config verl composes from ``config_dir/config_name`` and the overrides; verl's own
    configs are read from their folder (``verl_config_dir``), the same files as the configs'
    ``pkg://`` searchpath names; a searchpath among the overrides still wins."""
    import copy

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    key = (str(config_dir), config_name, tuple(overrides))
    if key not in _COMPOSED:
        searchpath = f"hydra.searchpath=[file://{verl_config_dir()}]"
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=[searchpath, *overrides])
        _COMPOSED[key] = cfg
    return copy.deepcopy(_COMPOSED[key])


def flat_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    if isinstance(node, dict):
        for name, value in node.items():
            full = f"{prefix}.{name}" if prefix else str(name)
            keys.append(full)
            keys.extend(flat_keys(value, full))
    return keys


def closest_keys(bad_key: str, valid: list[str]) -> list[str]:
    """Valid keys with the same leaf first (ranked by similarity), else the most similar."""
    leaf = bad_key.rsplit(".", 1)[-1]
    same_leaf = [k for k in valid if k.rsplit(".", 1)[-1] == leaf]
    ranked = difflib.get_close_matches(bad_key, same_leaf, n=2, cutoff=0.0) if same_leaf else []
    return ranked or difflib.get_close_matches(bad_key, valid, n=2, cutoff=0.6)


def unknown_key_message(exc: BaseException, config_dir: Path, config_name: str) -> str | None:
    import re

    from omegaconf import OmegaConf

    match = re.search(r"Could not override '([^']+)'", str(exc))
    if not match:
        return None
    bad_key = match.group(1)
    base = OmegaConf.to_container(compose(config_dir, config_name, []), resolve=False)
    suggestions = closest_keys(bad_key, flat_keys(base))
    hint = f"; did you mean {' or '.join(suggestions)}?" if suggestions else ""
    return f"unknown key '{bad_key}' in the installed verl config{hint}"


def grammar_message(exc: BaseException, overrides: list[str]) -> str | None:
    """Hydra's override-grammar error names no override: the first one Hydra cannot parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, OverrideParseException

    if not isinstance(exc, OverrideParseException):
        return None
    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except HydraException as err:  # the parser's own type for a grammar error
            why = str(err).split(" See https://", 1)[0].strip()
            return (
                f"override {override!r} is not in Hydra's override grammar ({why}); a value "
                "holding $ ( ) or spaces goes in quotes inside the argument: "
                "key='value' (https://hydra.cc/docs/advanced/override_grammar/basic/)"
            )
    return None


def compose_error(exc: BaseException, config_dir: Path, config_name: str,
                  overrides: list[str]) -> str:  # fmt: skip
    """The one line a failed ``compose`` is: an unknown key with the closest ones, an override
    Hydra cannot parse, or the error itself."""
    from verl_gsm8k.preflight.lines import one_line

    return (
        unknown_key_message(exc, config_dir, config_name)
        or grammar_message(exc, overrides)
        or one_line(exc)
    )

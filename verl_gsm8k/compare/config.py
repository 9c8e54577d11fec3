"""Where a compared run's config comes from, as flat dotted verl keys.

* A run directory: its launch records, ``RUN_DIR/launches/launch-<UTC>.yaml``
  (``verl_gsm8k/common/launch_record.py``); the latest is the config the run now has, and its
  ``knob_keys`` name the recipe knob that set each key. A directory without a record has no
  config to compare (one line says so).
* A verl console log: the config dict verl pprints at its top, one line of the dump per console
  line behind a Ray prefix (``(TaskRunner pid=...)``, ``(main_task pid=...)``) and ANSI codes,
  other processes' lines interleaved. Read with ``ast.literal_eval``, never ``eval``.
* A metrics .jsonl file carries no config.

Standard library only, plus verl_gsm8k.common.launch_record's reader (PyYAML).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.parse import RAY_PREFIX, strip_ansi
from verl_gsm8k.common.command_line import split_line
from verl_gsm8k.common.launch_record import RecordError, read_records
from verl_gsm8k.common.run_dir import LAUNCHES_DIR, launch_record_path

# Console lines read while looking for the dump: verl prints it before anything else it logs.
MAX_SCAN_LINES = 20_000
MAX_DUMP_LINES = 5_000
_PREFIX = re.compile(rf"^\s*(?P<who>{RAY_PREFIX})?\s?")
# Another process's prefix glued to the end of a dump line (its output interleaved mid-line).
_TRAILING_PREFIX = re.compile(rf"{RAY_PREFIX}\s*$")
# Variables of a recorded verl command that name the launch itself, never a setting.
PER_LAUNCH = {"GSM8K_LAUNCH_ID", "GSM8K_LAUNCH_RUN_DIR", "VERL_FILE_LOGGER_PATH"}


class ConfigError(Exception):
    """A config source that exists but cannot be read: one line naming the file."""


@dataclass
class RunConfig:
    """A run's config as dotted keys (None when the run has none), and where it came from."""

    flat: dict[str, Any] | None
    source: str  # "launch record PATH", "config dump in PATH", or why there is none
    knob_keys: dict[str, str] = field(default_factory=dict)  # verl key -> recipe knob
    user_keys: set[str] = field(default_factory=set)  # keys given as key=value by the user
    launch: dict[str, Any] = field(default_factory=dict)  # recipe, config_name, versions, host

    def get(self, key: str) -> Any:
        return None if self.flat is None else self.flat.get(key)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and empty mappings are values of their own."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def config_dump(path: Path) -> dict[str, Any] | None:
    """The config dict pprinted at the top of a verl console log; None when there is none.

    The dump starts at the first line whose text (after the Ray prefix) opens a dict literal;
    only the lines of that same process (the same prefix) continue it.
    """
    owner: str | None = None
    parts: list[str] = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle):
            line = strip_ansi(raw.decode("utf-8", errors="replace").replace("\x00", ""))
            line = line.rstrip("\r\n")
            prefix = _PREFIX.match(line)
            who = (prefix.group("who") or "") if prefix else ""
            text = line[prefix.end() :] if prefix else line
            if owner is None:
                if number >= MAX_SCAN_LINES:
                    return None
                if not text.startswith(("{'", '{"')):
                    continue
                owner = who
            elif who != owner:
                continue
            parts.append(_TRAILING_PREFIX.sub("", text).rstrip())
            if len(parts) > MAX_DUMP_LINES:
                return None
            if parts[-1].endswith("}"):
                try:
                    value = ast.literal_eval("\n".join(parts))
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    continue  # a "}" that closes an inner dict: read on
                return value if isinstance(value, dict) else None
    return None


def _override_key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def _launch_facts(record: dict[str, Any]) -> dict[str, Any]:
    """What a launch record says beside the config: recipe, config file, versions, hardware."""
    host = record.get("host") or {}
    gpus = host.get("gpus") or []
    facts: dict[str, Any] = {
        "recipe": record.get("recipe"),
        "trainer": record.get("trainer"),
        "config_name": record.get("config_name"),
        "host.device": host.get("device"),
        "host.gpus": ", ".join(str(g.get("name")) for g in gpus if isinstance(g, dict)) or None,
    }
    for name, version in (record.get("versions") or {}).items():
        facts[f"versions.{name}"] = version
    facts.update(command_facts(str(record.get("verl_command") or "")))
    return facts


def command_facts(command: str) -> dict[str, str]:
    """What a recorded verl command (``verl_command``: common/command_line.py) says beside its
    overrides, which the config diff holds: each variable the launcher set for verl, and verl's
    entry point with its config. Nothing from a line that does not parse."""
    try:
        env, words = split_line(command)
    except ValueError:
        return {}
    facts = {
        f"verl command: {name}": value for name, value in env.items() if name not in PER_LAUNCH
    }
    if "-m" in words[:-1]:
        at = words.index("-m")
        config = words[words.index("--config-name") + 1] if "--config-name" in words[:-1] else ""
        facts["verl command: entry point"] = " ".join(
            word for word in (words[at + 1], config) if word
        )
    return facts


def read_config(path: Path, fmt: str) -> RunConfig:
    """The config of a compared input (a run directory or a metrics file of format ``fmt``).

    Raises ConfigError when a launch record exists but cannot be read.
    """
    if path.is_dir():
        try:
            records = read_records(path)
        except RecordError as err:
            raise ConfigError(str(err)) from None
        if not records:
            return RunConfig(None, f"no launch record in {path / LAUNCHES_DIR}")
        latest = records[-1]
        stamp = latest.get("stamp", "?")
        of = f" (the latest of {len(records)})" if len(records) > 1 else ""
        return RunConfig(
            flatten(latest["config"]),
            f"launch record {launch_record_path(path, stamp).name}{of}",
            {str(k): str(v) for k, v in (latest.get("knob_keys") or {}).items()},
            {_override_key(str(o)) for o in latest.get("user_overrides") or []},
            _launch_facts(latest),
        )
    if fmt != "console":
        return RunConfig(None, f"{path.name} is a metrics file: it carries no config")
    try:
        dump = config_dump(path)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror or err})") from None
    if dump is None:
        return RunConfig(None, f"no config dump found at the top of {path}")
    return RunConfig(flatten(dump), f"config dump at the top of {path.name}")

"""A compared run's config (a run directory's latest launch record, a console log's pprinted
dict read with ``ast.literal_eval``) and the diff of the runs' configs (common/config_diff.py),
grouped as the GSM8K PPO tutorial groups them, each key with the recipe knob that set it."""

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_gsm8k.analysis.parse import RAY_PREFIX, strip_ansi
from verl_gsm8k.common.command_line import split_line
from verl_gsm8k.common.config_diff import differing, leaves
from verl_gsm8k.common.launch_record import RecordError, read_records
from verl_gsm8k.common.run_dir import LAUNCHES_DIR, launch_record_path

MAX_SCAN_LINES, MAX_DUMP_LINES = 20_000, 5_000  # verl prints its config before anything else
_PREFIX = re.compile(rf"^\s*(?P<who>{RAY_PREFIX})?\s?")
_TRAILING_PREFIX = re.compile(rf"{RAY_PREFIX}\s*$")  # another process's, glued mid-line
PER_LAUNCH = {"GSM8K_LAUNCH_ID", "GSM8K_LAUNCH_RUN_DIR", "VERL_FILE_LOGGER_PATH"}
GROUPS = ("launch", "data", "actor", "rollout", "reference", "critic", "algorithm", "reward",
          "trainer", "other", "named after the run")  # fmt: skip
NAMED = GROUPS[-1]
_PREFIX_GROUPS = (
    ("data.", "data"), ("actor_rollout_ref.rollout.", "rollout"),
    ("actor_rollout_ref.ref.", "reference"), ("actor_rollout_ref.", "actor"),
    ("critic.", "critic"), ("algorithm.", "algorithm"), ("reward_model.", "reward"),
    ("reward.", "reward"), ("custom_reward_function.", "reward"), ("trainer.", "trainer"),
)  # fmt: skip
# verl runs a critic when critic.enable says so, else when the estimator is GAE (need_critic)
CRITIC_IN_USE = "critic in use (critic.enable, else algorithm.adv_estimator == gae)"


class ConfigError(Exception):
    """One line naming the file or run."""


@dataclass
class RunConfig:
    flat: dict[str, Any] | None
    source: str
    knob_keys: dict[str, str] = field(default_factory=dict)  # verl key -> recipe knob
    user_keys: set[str] = field(default_factory=set)  # keys the user gave as key=value
    launch: dict[str, Any] = field(default_factory=dict)  # recipe, versions, host, command

    def get(self, key: str) -> Any:
        return None if self.flat is None else self.flat.get(key)


def config_dump(path: Path) -> dict[str, Any] | None:
    """The config dict pprinted at the top of a console log, by its process's lines only."""
    owner, parts = None, []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle):
            line = strip_ansi(raw.decode("utf-8", "replace").replace("\x00", "")).rstrip("\r\n")
            prefix = _PREFIX.match(line)
            who, text = prefix.group("who") or "", line[prefix.end() :]
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


def command_facts(command: str) -> dict[str, str]:
    """A recorded verl command's variables and entry point (the config holds its overrides)."""
    try:
        env, words = split_line(command)
    except ValueError:
        return {}
    facts = {f"verl command: {k}": v for k, v in env.items() if k not in PER_LAUNCH}
    if "-m" in words[:-1]:
        entry = [words[words.index("-m") + 1]]
        if "--config-name" in words[:-1]:
            entry.append(words[words.index("--config-name") + 1])
        facts["verl command: entry point"] = " ".join(entry)
    return facts


def _launch_facts(record: dict[str, Any]) -> dict[str, Any]:
    host = record.get("host") or {}
    gpus = [str(g.get("name")) for g in host.get("gpus") or [] if isinstance(g, dict)]
    facts = {key: record.get(key) for key in ("recipe", "trainer", "config_name")}
    facts.update({"host.device": host.get("device"), "host.gpus": ", ".join(gpus) or None})
    facts.update({f"versions.{k}": v for k, v in (record.get("versions") or {}).items()})
    return facts | command_facts(str(record.get("verl_command") or ""))


def read_config(path: Path, fmt: str) -> RunConfig:
    if path.is_dir():
        try:
            records = read_records(path)
        except RecordError as err:
            raise ConfigError(str(err)) from None
        if not records:
            return RunConfig(None, f"no launch record in {path / LAUNCHES_DIR}")
        last = records[-1]
        source = launch_record_path(path, last.get("stamp", "?")).name
        if len(records) > 1:
            source += f" (the latest of {len(records)})"
        user = {str(o).partition("=")[0].lstrip("+~") for o in last.get("user_overrides") or []}
        knobs = {str(k): str(v) for k, v in (last.get("knob_keys") or {}).items()}
        return RunConfig(leaves(last["config"]), f"launch record {source}", knobs, user,
                         _launch_facts(last))  # fmt: skip
    if fmt != "console":
        return RunConfig(None, f"{path.name} is a metrics file: it carries no config")
    try:
        dump = config_dump(path)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror or err})") from None
    if dump is None:
        return RunConfig(None, f"no config dump found at the top of {path}")
    return RunConfig(leaves(dump), f"config dump at the top of {path.name}")


def group_of(key: str) -> str:
    return next((group for prefix, group in _PREFIX_GROUPS if key.startswith(prefix)), "other")


def critic_in_use(config: RunConfig) -> bool | None:
    if config.get("critic.enable") is not None:
        return bool(config.get("critic.enable"))
    estimator = config.get("algorithm.adv_estimator")
    return None if estimator is None else str(estimator) == "gae"


def _named_after_run(values: list[Any], names: list[str]) -> bool:
    """Each run's value is its name or a path with it as a directory, the same without it."""
    shapes = set()
    for value, name in zip(values, names, strict=True):
        parts = value.split("/") if isinstance(value, str) else []
        if not name or name not in parts:
            return False
        shapes.add(tuple("\0" if part == name else part for part in parts))
    return len(shapes) == 1


@dataclass
class DiffRow:
    key: str
    group: str
    values: dict[str, Any]
    missing_in: list[str]
    knobs: list[str] = field(default_factory=list)
    user_override: bool = False


@dataclass
class ConfigDiff:
    compared: list[str]
    not_compared: dict[str, str]
    rows: list[DiffRow]

    def by_group(self) -> dict[str, list[DiffRow]]:
        groups = {name: [row for row in self.rows if row.group == name] for name in GROUPS}
        return {name: rows for name, rows in groups.items() if rows}


def config_diff(configs: dict[str, RunConfig]) -> ConfigDiff:
    have = {label: c for label, c in configs.items() if c.flat is not None}
    missing = {label: c.source for label, c in configs.items() if c.flat is None}
    if len(have) < 2:
        return ConfigDiff(list(have), missing, [])
    tables = {label: {**c.launch, **(c.flat or {}), CRITIC_IN_USE: critic_in_use(c)}
              for label, c in have.items()}  # fmt: skip
    names = [str(c.get("trainer.experiment_name") or "") for c in have.values()]
    rows = []
    for key in differing(list(tables.values())):
        values = {label: table[key] for label, table in tables.items() if key in table}
        group = "critic" if key == CRITIC_IN_USE else group_of(key)
        if any(key in c.launch for c in have.values()):
            group = "launch"
        elif len(values) == len(have) and _named_after_run(list(values.values()), names):
            group = NAMED
        knobs = sorted({c.knob_keys[key] for c in have.values() if key in c.knob_keys})
        rows.append(DiffRow(key, group, values, [x for x in have if x not in values], knobs,
                            any(key in c.user_keys for c in have.values())))  # fmt: skip
    rows.sort(key=lambda row: (GROUPS.index(row.group), row.key))
    return ConfigDiff(list(have), missing, rows)

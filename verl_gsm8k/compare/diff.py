"""The config diff of compared runs: only the keys whose values differ, by their verl names,
grouped as the GSM8K PPO tutorial groups them, each with the recipe knob that set it.

Standard library only. A key set in one run and not in the other (another verl version, an
extra override) differs too: the run without it shows it as missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from verl_gsm8k.compare.config import RunConfig

# Display order. "launch" is what the launch record says beside the config (recipe, versions).
GROUPS = (
    "launch",
    "data",
    "actor",
    "rollout",
    "reference",
    "critic",
    "algorithm",
    "reward",
    "trainer",
    "other",
    "named after the run",
)
# Keys that differ only by each run's own name (trainer.experiment_name, the run dir under it):
# a group of their own, last, so that the groups above hold only differences of setting.
NAMED = GROUPS[-1]
_PREFIX_GROUPS = (
    ("data.", "data"),
    ("actor_rollout_ref.rollout.", "rollout"),
    ("actor_rollout_ref.ref.", "reference"),
    ("actor_rollout_ref.", "actor"),  # the actor, its model and the hybrid engine
    ("critic.", "critic"),
    ("algorithm.", "algorithm"),
    ("reward_model.", "reward"),
    ("reward.", "reward"),
    ("custom_reward_function.", "reward"),
    ("trainer.", "trainer"),
)
# verl runs a critic when critic.enable says so, else when the advantage estimator is GAE
# (verl/trainer/ppo/utils.py need_critic): a row of its own, since GRPO's config may differ
# from PPO's in no critic.* key at all.
CRITIC_IN_USE = "critic in use (critic.enable, else algorithm.adv_estimator == gae)"


def group_of(key: str) -> str:
    for prefix, group in _PREFIX_GROUPS:
        if key.startswith(prefix):
            return group
    return "other"


def critic_in_use(config: RunConfig) -> bool | None:
    """Whether verl runs a critic with this config; None when the config does not say."""
    if config.flat is None:
        return None
    enable = config.get("critic.enable")
    if enable is not None:
        return bool(enable)
    estimator = config.get("algorithm.adv_estimator")
    return None if estimator is None else str(estimator) == "gae"


def _named_after_run(present: dict[str, tuple[str, Any]], names: dict[str, str]) -> bool:
    """Every run's value is its own experiment name, or a path with that name as a directory,
    and they are the same once the name is taken out (``runs/a/rollouts``, ``runs/b/rollouts``);
    a file that merely contains the name (``data/a.parquet``) is a setting."""
    shapes = set()
    for label, (_, value) in present.items():
        name = names.get(label)
        parts = value.split("/") if isinstance(value, str) else []
        if not name or name not in parts:
            return False
        shapes.add(tuple("\0" if part == name else part for part in parts))
    return len(shapes) == 1


def _canonical(value: Any) -> str:
    """Equal settings compare equal: 1 and 1.0 alike, True apart from 1, dict order ignored."""

    def norm(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, dict):
            return {str(k): norm(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [norm(x) for x in v]
        return str(v)

    return json.dumps(norm(value), sort_keys=True)


@dataclass
class DiffRow:
    """One differing key: its value in each run that sets it, and who set it."""

    key: str
    group: str
    values: dict[str, Any]  # run label -> value, for the runs whose config has the key
    missing_in: list[str]  # runs with a config that lacks the key
    knobs: list[str] = field(default_factory=list)  # recipe knobs that set it, in any run
    user_override: bool = False  # given as key=value on a launch's command line


@dataclass
class ConfigDiff:
    """The diff over the runs that have a config; the others are named with the reason."""

    compared: list[str]
    not_compared: dict[str, str]  # run label -> why it has no config
    rows: list[DiffRow]

    def by_group(self) -> dict[str, list[DiffRow]]:
        groups: dict[str, list[DiffRow]] = {}
        for name in GROUPS:
            rows = [row for row in self.rows if row.group == name]
            if rows:
                groups[name] = rows
        return groups


def config_diff(configs: dict[str, RunConfig]) -> ConfigDiff:
    """Keys whose values are not the same in every run with a config (at least two needed)."""
    have = {label: c for label, c in configs.items() if c.flat is not None}
    missing = {label: c.source for label, c in configs.items() if c.flat is None}
    if len(have) < 2:
        return ConfigDiff(list(have), missing, [])
    tables: dict[str, dict[str, tuple[str, Any]]] = {}
    for label, config in have.items():
        entries = {key: ("", value) for key, value in (config.flat or {}).items()}
        entries.update({key: ("launch", value) for key, value in config.launch.items()})
        entries[CRITIC_IN_USE] = ("critic", critic_in_use(config))
        tables[label] = entries
    keys = sorted({key for table in tables.values() for key in table})
    names = {label: str(c.get("trainer.experiment_name") or "") for label, c in have.items()}
    rows: list[DiffRow] = []
    for key in keys:
        present = {label: table[key] for label, table in tables.items() if key in table}
        if len(present) == len(tables) and len({_canonical(v) for _, v in present.values()}) == 1:
            continue
        group = next(g for g, _ in present.values()) or group_of(key)
        if len(present) == len(tables) and _named_after_run(present, names):
            group = NAMED
        knobs = sorted(
            {have[label].knob_keys[key] for label in have if key in have[label].knob_keys}
        )
        rows.append(
            DiffRow(
                key,
                group,
                {label: value for label, (_, value) in present.items()},
                [label for label in tables if label not in present],
                knobs,
                any(key in have[label].user_keys for label in have),
            )
        )
    order = {name: i for i, name in enumerate(GROUPS)}
    rows.sort(key=lambda row: (order[row.group], row.key))
    return ConfigDiff(list(have), missing, rows)

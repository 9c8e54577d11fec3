"""Which responses of a step are traced: whole prompt groups (GRPO's advantages are per group),
ordered by a hash of the step and the uid."""

import hashlib
from collections.abc import Sequence

from verl_gsm8k.guard.rules import prompt_of


def _order(step: int, uid: str) -> str:
    return hashlib.sha256(f"{step}/{uid}".encode()).hexdigest()


def choose(keys: Sequence[str], step: int, samples: int) -> list[str]:
    """Whole groups in hash order until >= ``samples`` responses, each in session order."""
    if samples <= 0:
        return []
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(prompt_of(key), []).append(key)
    chosen: list[str] = []
    for uid in sorted(groups, key=lambda u: _order(step, u)):
        if len(chosen) >= samples:
            break
        chosen.extend(sorted(groups[uid], key=_session_index))
    return chosen


def session_of(key: str) -> int:
    return _session_index(key)[0]


def _session_index(key: str) -> tuple[int, int, str]:
    parts = key.rsplit("_", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return int(parts[1]), int(parts[2]), key
    return 0, 0, key

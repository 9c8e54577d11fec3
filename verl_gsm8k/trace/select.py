"""Which responses of a step are traced: whole prompt groups, in a deterministic order.

verl keys every response ``{uid}_{session}_{index}``: ``uid`` is the prompt, ``session`` one of
its ``rollout.n`` samples. The groups are ordered by a hash of the step and the uid (the same run
traces the same prompts again on a re-run, a different set every step), and whole groups are
taken until at least ``samples`` responses are chosen: GRPO's advantages only make sense within a
group, so a traced prompt brings all of its responses.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from verl_gsm8k.guard.rules import prompt_of


def _order(step: int, uid: str) -> str:
    return hashlib.sha256(f"{step}/{uid}".encode()).hexdigest()


def choose(keys: Sequence[str], step: int, samples: int) -> list[str]:
    """The keys to trace at ``step``: whole groups, hash order, until >= ``samples`` responses
    (none when ``samples`` <= 0). Within a group, keys keep their session order."""
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
    """The session of a response key ``{uid}_{session}_{index}`` (0 for any other key)."""
    return _session_index(key)[0]


def _session_index(key: str) -> tuple[int, int, str]:
    parts = key.rsplit("_", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return int(parts[1]), int(parts[2]), key
    return 0, 0, key

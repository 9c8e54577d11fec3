"""Both pages of a run directory at once, for the report (``verl_gsm8k/report/cli.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from verl_gsm8k.replay.load import Trace
from verl_gsm8k.replay.replay_page import write_replay
from verl_gsm8k.replay.rollouts_page import write_rollouts


@dataclass
class Pages:
    replay: Path | None = None
    rollouts: Path | None = None
    issues: list[str] = field(default_factory=list)  # one line per problem, pages still written


def write_pages(run_dir: Path, trace: Trace, out_dir: Path) -> Pages:
    """The replay (when the run has a trace) and the rollout browser (when it dumped any)."""
    pages = Pages(issues=list(trace.issues))
    name = run_dir.name
    if trace.steps:
        pages.replay = write_replay(trace, out_dir, name)
    pages.rollouts, issues = write_rollouts(run_dir, trace, out_dir, name)
    pages.issues += issues
    return pages

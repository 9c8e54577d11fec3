"""A tool launch's per-step metrics verl does not log (tool calls, errors, accuracy with and
without a call), from the reward's keys (rewards/gsm8k.py)."""

from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

from verl_gsm8k.guard.vocab import keys_of

(CALLED,), (CALLS,), (ERRORS,) = (keys_of(n) for n in ("tool_called", "tool_calls", "tool_errors"))
(ACC_CALLED,), (ACC_NOT_CALLED,) = keys_of("tool_acc_called"), keys_of("tool_acc_not_called")


def tool_metrics(extras: Sequence[Any]) -> dict[str, float]:
    """Shares over the step's responses (``extras``: each one's reward keys); {} without any."""
    rows = [e for e in extras if isinstance(e, Mapping) and "tool_calls" in e]
    if not rows:
        return {}
    called = [float(r["tool_calls"]) > 0 for r in rows]
    out = {
        CALLED: fmean(called),
        CALLS: fmean(float(r["tool_calls"]) for r in rows),
        ERRORS: fmean(float(r.get("tool_errors", 0.0)) > 0 for r in rows),
    }
    for key, want in ((ACC_CALLED, True), (ACC_NOT_CALLED, False)):
        accs = [float(r.get("acc", 0.0)) for r, c in zip(rows, called, strict=True) if c == want]
        if accs:
            out[key] = fmean(accs)
    return out

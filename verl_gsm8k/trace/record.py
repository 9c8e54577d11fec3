"""The lines of ``trace/<step>.jsonl`` (a ``step`` line, then a ``sample`` line per traced
response; docs/replay.md) and their writer. ``per_token`` lists align with ``response.ids``; a
quantity the run does not compute is named in ``absent``, never zeros. Floats keep 7
significant digits; NaN and infinities become null."""

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PER_TOKEN = (  # in the order of the loop
    "rollout_log_prob",  # vLLM's log-prob of the sampled token (rollout.calculate_log_probs)
    "old_log_prob",  # the actor's, recomputed before the update (the ratio's denominator)
    "entropy",  # the actor's entropy at that position
    "ref_log_prob",  # the reference model's
    "kl",  # the KL estimator at the token (old vs reference), before the coefficient
    "value",  # the critic's value of the state before the token
    "score",  # the reward function's score, on the last response token
    "reward",  # the score minus coefficient x KL when the KL is in the reward, else the score
    "advantage",  # GAE (PPO) or the group-normalised score (GRPO), as the update used it
    "return",  # advantage + value before whitening (what the critic regresses to)
)


def clean(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return float(f"{value:.7g}") if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if hasattr(value, "item") or hasattr(value, "tolist"):  # numpy / torch
        return clean(value.item() if hasattr(value, "item") else value.tolist())
    return str(value)


def sample_line(*, step: int, key: str, uid: str, session: int, prompt_ids: Sequence[int],
                response_ids: Sequence[int], response_mask: Sequence[int],
                per_token: Mapping[str, Sequence[float]], absent: Mapping[str, str],
                decode: Callable[[int], str], ground_truth: Any = None, data_source: Any = None,
                reward_extra: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    for name, values in per_token.items():
        if name not in PER_TOKEN:
            raise ValueError(f"unknown per-token quantity {name!r}")
        if len(values) != len(response_ids):
            raise ValueError(
                f"{name}: {len(values)} values for {len(response_ids)} response tokens"
            )
    scores = per_token.get("score")
    return clean({
        "kind": "sample", "step": step, "key": key, "uid": uid, "session": session,
        "data_source": data_source, "ground_truth": ground_truth,
        "score": sum(scores) if scores is not None else None,
        "reward_extra": dict(reward_extra or {}),
        "prompt": {"ids": list(prompt_ids), "tokens": [decode(i) for i in prompt_ids]},
        "response": {"ids": list(response_ids), "tokens": [decode(i) for i in response_ids],
                     "mask": list(response_mask)},
        "per_token": {name: list(per_token[name]) for name in PER_TOKEN if name in per_token},
        "absent": dict(absent),
    })  # fmt: skip


def step_line(step: int, run: Mapping[str, Any], metrics: Mapping[str, Any], traced: int,
              of: int) -> dict[str, Any]:  # fmt: skip
    """The ``step`` line: the run's settings, the counts traced, every number logged."""
    numbers = {k: v for k, v in metrics.items() if _is_number(v)}
    return clean({"kind": "step", "step": step, "run": dict(run), "traced": traced, "of": of,
                  "metrics": numbers})  # fmt: skip


def _is_number(value: Any) -> bool:
    if isinstance(value, (int, float)):
        return not isinstance(value, bool)
    return hasattr(value, "item") and getattr(value, "ndim", 1) == 0  # a numpy / torch scalar


class TraceWriter:
    """Writes ``<dir>/<step>.jsonl`` atomically in the background; a failure never stops
    training."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gsm8k-trace")
        self._pending: list[Future[None]] = []
        self.failures = 0

    def submit(self, step: int, lines: list[dict[str, Any]]) -> None:
        self._reap(wait=False)
        self._pending.append(self._executor.submit(self._write, step, lines))

    def _write(self, step: int, lines: list[dict[str, Any]]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{step}.jsonl.tmp"
        tmp.write_text("".join(json.dumps(line, allow_nan=False) + "\n" for line in lines))
        os.replace(tmp, self.directory / f"{step}.jsonl")

    def _reap(self, wait: bool) -> None:
        still = []
        for future in self._pending:
            if not wait and not future.done():
                still.append(future)
            elif (err := future.exception()) is not None:
                self.failures += 1
                if self.failures == 1:
                    logger.warning("trace: writing to %s failed (%s); training goes on",
                                   self.directory, err)  # fmt: skip
        self._pending = still

    def close(self) -> None:
        self._reap(wait=True)
        self._executor.shutdown(wait=True)

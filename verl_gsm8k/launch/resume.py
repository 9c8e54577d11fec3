"""No silent resume of another run: a relaunch into a run directory that holds a checkpoint must be
the same experiment as the launch that wrote it.

verl resumes whatever checkpoint sits in ``trainer.default_local_dir`` (``resume_mode: auto``),
so after a change of ``MODEL_PATH``, of the algorithm or of a learning rate, a relaunch under the
same ``EXPERIMENT_NAME`` would continue the old weights without a word. The keys below are
compared with the previous launch's record; a difference stops the launch with one line. Resuming
the same config stays automatic. ``RESUME=force`` resumes anyway, ``RESUME=disable`` starts over
(verl's ``trainer.resume_mode=disable``), a new ``EXPERIMENT_NAME`` starts a new run directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_gsm8k.launch.record import lookup

# trainer -> (verl key, what it is): what makes a checkpoint another experiment's.
GUARDED: dict[str, tuple[tuple[str, str], ...]] = {
    "ppo": (
        ("actor_rollout_ref.model.path", "model"),
        ("critic.model.path", "critic model"),
        ("algorithm.adv_estimator", "algorithm"),
        ("actor_rollout_ref.actor.optim.lr", "actor learning rate"),
        ("critic.optim.lr", "critic learning rate"),
    ),
    "sft": (("model.path", "model"), ("optim.lr", "learning rate")),
}
MODES = ("auto", "force", "disable")


def latest_checkpoint(run_dir: Path) -> int | None:
    """The step verl would resume from (latest_checkpointed_iteration.txt), or None."""
    marker = Path(run_dir) / "latest_checkpointed_iteration.txt"
    try:
        step = int(marker.read_text().strip())
    except (OSError, ValueError):
        return None
    return step if (Path(run_dir) / f"global_step_{step}").is_dir() else None


def differences(previous: dict[str, Any], new: dict[str, Any], trainer: str) -> list[str]:
    """'what: old -> new' for each guarded key whose resolved values differ."""
    out = []
    for key, what in GUARDED.get(trainer, ()):
        old, now = lookup(previous["config"], key), lookup(new["config"], key)
        if old is None or now is None:
            continue
        if _same(old, now):
            continue
        out.append(f"{what} ({key}) {old} -> {now}")
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def refusal(
    run_dir: Path, previous: dict[str, Any] | None, new: dict[str, Any], mode: str, trainer: str
) -> str | None:
    """The one line that stops a relaunch, or None when it may go on."""
    if mode != "auto" or previous is None:
        return None
    step = latest_checkpoint(run_dir)
    if step is None:
        return None
    diffs = differences(previous, new, trainer)
    if not diffs:
        return None
    return (
        f"launch: {run_dir} holds the checkpoint of step {step} of another experiment "
        f"({'; '.join(diffs)}), which verl would resume silently: set a new EXPERIMENT_NAME for "
        "a new run, or RESUME=force to continue that checkpoint with the new settings"
    )

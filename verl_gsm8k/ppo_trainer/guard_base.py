"""The guard both of verl's PPO trainers run with, whatever their loop: what a run saves is whole,
the run's own and healthy, a polite kill saves first, and the best checkpoint is kept.

``GuardBase`` is a mixin: ``guarded.py`` puts it on verl's v1 sync trainer (``PPOTrainerSync``),
``legacy.py`` on the legacy ``RayPPOTrainer`` (the LoRA and ReMax recipes). Each binding calls
``_begin`` once it knows the step the run resumes from, ``_after_update`` after each step's
actor update (before verl's save of the step), ``_stop_if_requested`` where a stop request
should end the run, and ``_prepare_logger`` before the launch logs anything. What it adds:

- ``_save_checkpoint`` (verl: v1 ``trainer_base.py`` ~948-1029, legacy ``ray_trainer.py``
  ~983-1050) is written again with verl's calls in verl's order (actor, critic, the dataloader's
  ``data.pt``, the tracker, v1's checkpoint callback) and four differences:
  the tracker and ``data.pt`` are written atomically (verl opens the tracker with ``open("w")``,
  then writes: a kill between the two leaves an empty tracker every relaunch dies on);
  the step directory gets the launch's stamp (``launch_stamp.txt``: the same-config check compares a
  relaunch with the launch that wrote the checkpoint);
  MAX_CKPT_TO_KEEP prunes whole step directories of the run (``guard/prune.py``), never the
  checkpoint the tracker names nor the kept best, where verl's workers prune only what their own
  process saved (``max_ckpt_to_keep`` is not passed to them);
  no checkpoint is written for a step the watchdog judged sick.
- ``_after_update`` checks the step's metrics and responses with the watchdog
  (``guard/rules.py``) and reads the launcher's stop request (SIGTERM, ``stop_requested``). A
  trip (WATCHDOG=stop) or a stop request ends the run after this step (``_end_after``; the
  binding ends verl's loop). verl still logs the step's metrics, and a stop request saves it first.
- a time save (SAVE_EVERY_MIN, ``gsm8k_guard.save_every_min``): a healthy step that ends that
  long or longer after this launch's last save (or its start) is saved, SAVE_FREQ or not: what a
  SIGKILL, which no handler sees, can lose (launch/save_every.py picks the interval).
- a deadline (a Slurm job's end, ``guard/deadline.py``): steps, saves and validations measure
  themselves; after a step that one more step and its save would not follow before the job
  ends, the step is saved and the run ends, as on a stop request.
- ``_prepare_logger``: the file logger first (verl's ``Tracking`` keeps its backends in its own
  order, wandb first, ``verl/utils/tracking.py`` ~86-186, so a wandb call that fails, its service
  process ended by a SIGTERM to every process of the job, would cost the step its line in the
  metrics file), and wandb wrapped so that such a failure ends only wandb and a later launch
  sends it the steps it missed (``wandb_gap.py``).
- ``_validate`` (after the save) keeps the checkpoint of the best validation score (KEEP_BEST):
  ``best_checkpoint.json`` names a step directory that pruning then keeps; when the best step was
  not a save step, it is saved then (the weights are the ones just validated).

Settings: the ``gsm8k_guard`` block of configs/gsm8k_base.yaml (knobs WATCHDOG, KEEP_BEST,
BEST_METRIC, SAVE_EVERY_MIN in the launcher, verl_gsm8k/launch/).
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.utils import Role

from verl_gsm8k.common.launch_env import launch_stamp
from verl_gsm8k.common.pause import pause_point
from verl_gsm8k.common.run_dir import (
    TRACKER,
    append_trip,
    clear_sick,
    clear_tracker,
    drop_best,
    is_sick,
    logged_rows,
    mark_sick,
    read_best,
    read_stop_request,
    saved_steps,
    step_dir,
    step_name,
    write_best,
    write_stamp,
    write_tracker,
)
from verl_gsm8k.guard import say
from verl_gsm8k.guard.deadline import Timings, must_stop, read_deadline, record_stop, stamp_time
from verl_gsm8k.guard.prune import prune
from verl_gsm8k.guard.rules import Thresholds, Trip, Watchdog
from verl_gsm8k.ppo_trainer.wandb_gap import AckedWandb, send_missing

logger = logging.getLogger(__name__)
SCORE_KEY = "critic/score/mean"  # verl's name for the mean sequence score (compute_data_metrics)

# What the watchdog is shown of a step: its metrics, each response's tokens (the masked ones
# only), each response's score and the prompt each answers.
Observed = tuple[dict[str, float], list[list[int]], list[float], list[str]]


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def guard_settings(config: DictConfig) -> dict[str, Any]:
    block = OmegaConf.to_container(config.get("gsm8k_guard") or {}, resolve=True)
    assert isinstance(block, dict)
    thresholds = Thresholds.from_mapping(block.get("watchdog") or {})  # mode included
    return {
        "mode": thresholds.mode,
        "thresholds": thresholds,
        "keep_best": bool(block.get("keep_best", True)),
        "best_metric": str(block.get("best_metric") or "val-core/openai/gsm8k/acc/mean@1"),
        "save_every_s": 60.0 * float(block.get("save_every_min") or 0),
    }


def logged_history(run_dir: Path, before: int) -> list[dict[str, float]]:
    """The training metrics of steps 1..before-1 as the run's metrics files logged them (a step
    logged by several launches: the last launch's), for a resumed watchdog's recent levels."""
    rows = logged_rows(run_dir)
    return [rows[step] for step in sorted(rows) if 0 < step < before and SCORE_KEY in rows[step]]


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics float() takes (see ``_number``), as floats."""
    return {key: float(value) for key, value in metrics.items() if _number(value)}


class GuardBase:
    """The run's protections on one of verl's PPO trainers (see the module docstring). The
    trainer class it is mixed into provides ``config``, ``global_steps``, ``actor_rollout_wg``,
    ``critic_wg``, ``use_critic``, ``train_dataloader`` and ``_validate``."""

    config: DictConfig
    global_steps: int
    use_critic: bool

    def _init_guard(self, config: DictConfig) -> None:
        settings = guard_settings(config)
        self.guard_mode: str = settings["mode"]
        self.keep_best: bool = settings["keep_best"]
        self.best_metric: str = settings["best_metric"]
        self.save_every_s: float = settings["save_every_s"]
        self.last_save = time.time()  # the loop's start (reset there), then each save's end
        self.run_dir = Path(config.trainer.default_local_dir)
        self.stamp = launch_stamp()
        self.response_limit = int(config.data.get("max_response_length") or 0) or None
        self.watchdog = Watchdog(settings["thresholds"], response_limit=self.response_limit)
        self.sick_step: int | None = None  # the step the watchdog stopped (no checkpoint of it)
        self.saved_step: int | None = None  # the step this launch saved last
        self.stop_at: int | None = None  # the step after which the run ends (trip or stop)
        self.job_end = read_deadline(self.run_dir)  # a Slurm job's end (guard/deadline.py)
        self.timings = Timings.read(self.run_dir)  # the slowest step, save, validation measured
        self.started_up = False  # this launch's first step has ended
        self.resumed_step = 0  # the step the loop starts after (set by _begin)
        self.logger_ready = False  # verl's Tracking reordered and wandb wrapped (once)
        best = self.best_metric if self.keep_best else "off"
        say(f"watchdog {self.guard_mode}, keep best {best}, checkpoints {self.run_dir}")

    # ---- the loop ------------------------------------------------------------------------
    def _begin(self, resumed_step: int) -> None:
        """The loop is about to train step ``resumed_step + 1`` (0: a fresh run)."""
        self.resumed_step = resumed_step
        if resumed_step > 0:
            self.saved_step = resumed_step  # the resumed checkpoint exists: never saved again
        self.last_save = time.time()  # the workers' start-up is not time a SIGKILL could lose
        history = logged_history(self.run_dir, resumed_step + 1)
        self.watchdog = Watchdog(self.watchdog.thresholds, history, self.response_limit)

    def _after_update(self, step: int, started: float, observe: Callable[[], Observed]) -> None:
        """Step ``step`` (begun at ``started``) has updated the actor, verl's save of it comes
        next: judge it, then stop, save for a deadline or save for time, as due."""
        self._measured("step_s", started)
        if self.guard_mode != "off":
            self._judge(step, *observe())
        stopping = self.sick_step is not None or self._stop_if_requested(step)
        if not stopping and must_stop(time.time(), self.job_end, self.timings):
            self._stop_for_deadline(step)
        elif not stopping:
            self._save_if_due(step)

    def _save_if_due(self, step: int) -> None:
        """A time save (SAVE_EVERY_MIN): ``step`` saved when the last save is that long ago."""
        since = time.time() - self.last_save
        if self.save_every_s and since >= self.save_every_s:
            say(f"time save: {since / 60:.1f} min since the last save (SAVE_EVERY_MIN): saving "
                f"step {step}")  # fmt: skip
            self._save_checkpoint()

    def _stop_if_requested(self, step: int) -> bool:
        """A stop request (SIGTERM) seen after ``step`` was trained (0 or the resumed step: none
        by this launch): save that step unless it is saved or was not trained here, and end
        the run after it. True when a stop is under way."""
        if self.stop_at is not None:
            return True
        deadline = read_stop_request(self.run_dir, time.time())
        if deadline is None:
            return False
        if step == 0 or self.saved_step == step:
            last = f"step {step} is saved" if step else "no step trained yet"
            say(f"stop requested (SIGTERM): {last}, nothing new to save: stopping before step "
                f"{step + 1}")  # fmt: skip
        elif time.time() < deadline:
            say(f"stop requested (SIGTERM): saving step {step}, then stopping")
            self._save_checkpoint(step)
        else:
            say(f"stop requested and its grace is over: step {step} not saved")
        self._end_after(step)
        return True

    def _end_after(self, step: int) -> None:
        """The run ends after ``step``; a binding also ends verl's loop there."""
        self.stop_at = step

    def _measured(self, name: str, started: float) -> None:
        """Keep the slowest ``name`` (guard/deadline.py) and, at this launch's first step, the
        start-up (the launch's stamp to now)."""
        now = time.time()
        self.timings.slowest(name, now - started)
        launched = stamp_time(self.stamp)
        if name == "step_s" and not self.started_up and launched is not None:
            self.timings.slowest("start_s", now - launched)
            self.started_up = True
        self.timings.write(self.run_dir)

    def _stop_for_deadline(self, step: int) -> None:
        assert self.job_end is not None
        needed = self.timings.next_step_and_save() or 0.0
        left = self.job_end - time.time()
        say(f"the job ends in {left:.0f} s: one more step and its save take about {needed:.0f} s "
            f"(measured): saving step {step}, then stopping")  # fmt: skip
        self._save_checkpoint()
        record_stop(self.run_dir, step, self.stamp, self.job_end, needed)
        self._end_after(step)

    def _prepare_logger(self, backends: dict[str, Any]) -> None:
        """Once, before this launch logs anything, on verl's ``Tracking.logger``: the file logger
        first; wandb wrapped, and sent the steps an earlier launch's stop kept from it."""
        if self.logger_ready:
            return
        self.logger_ready = True
        file_first(backends)
        if "wandb" in backends:
            backends["wandb"] = AckedWandb(backends["wandb"], self.run_dir)
            send_missing(backends["wandb"], self.run_dir, self.resumed_step)

    # ---- the watchdog --------------------------------------------------------------------
    def _judge(
        self,
        step: int,
        metrics: dict[str, float],
        responses: Sequence[Sequence[int]],
        scores: Sequence[float],
        prompt_ids: Sequence[str],
    ) -> None:
        seen = dict(metrics)
        seen[SCORE_KEY] = sum(scores) / len(scores) if scores else float("nan")
        trips = self.watchdog.check(step, seen, responses, prompt_ids)
        stopping = [t for t in trips if t.stops] if self.guard_mode == "stop" else []
        if not stopping:
            for trip in trips:  # mode warn, or a warning of its own (one skipped update)
                self._record(trip, step, self._last_healthy(step), "warn")
            self.watchdog.accept(seen)
            return
        sick_from = min(trip.sick_from(step) for trip in stopping)
        marked = sick_from if sick_from < step and sick_from in saved_steps(self.run_dir) else None
        last = self._last_healthy(sick_from)
        for trip in trips:
            record = self._record(trip, step, last, "stop" if trip.stops else "warn", marked)
            if marked is not None and trip.stops:
                mark_sick(self.run_dir, marked, record)
        if marked is not None:
            self._unpoint(marked, last)
        self.sick_step = step
        self._end_after(step)

    def _record(
        self, trip: Trip, step: int, last: int | None, action: str, marked: int | None = None
    ) -> dict[str, Any]:
        record = trip.record(step, last, self.stamp, action, marked)
        say(f"({action}) {record['message']}")
        append_trip(self.run_dir, record)
        return record

    def _last_healthy(self, before: int) -> int | None:
        """The newest saved checkpoint before ``before`` that no trip marked sick."""
        run = self.run_dir
        steps = [s for s in saved_steps(run) if s < before and not is_sick(run, s)]
        return steps[-1] if steps else None

    def _unpoint(self, sick: int, healthy: int | None) -> None:
        """The sick checkpoint is never what a relaunch resumes nor the kept best: the tracker
        names the last healthy one (none: removed, a relaunch starts over), and a best that is
        the sick step is dropped."""
        if healthy is not None:
            write_tracker(self.run_dir, healthy)
            say(f"{TRACKER} now names {step_name(healthy)}: the same command resumes from it")
        else:
            clear_tracker(self.run_dir)
            say(f"no healthy checkpoint before {step_name(sick)}: {TRACKER} removed")
        best = read_best(self.run_dir)
        if best is not None and best["step"] >= sick:
            drop_best(self.run_dir)
            say(f"the kept best was step {best['step']}, judged sick: no best checkpoint kept")

    # ---- saving --------------------------------------------------------------------------
    def _save_checkpoint(self, step: int | None = None) -> None:
        """Save the trainer's state as ``step`` (verl calls it without: ``global_steps``; the
        legacy loop has counted the next step already when a stop request is read before its
        batch)."""
        step = self.global_steps if step is None else step
        if self.sick_step == step:
            say(f"step {step} is not saved: the watchdog stopped it")
            return
        if self.saved_step == step:
            return  # saved already this step (a stop request or the kept best)
        trainer = self.config.trainer
        folder = step_dir(self.run_dir, step)
        started = time.time()
        logger.info("Saving checkpoint to %s", folder)
        clear_sick(self.run_dir, step)  # a resumed run trains this step again: new weights
        groups = [("actor", self.actor_rollout_wg)]  # type: ignore[attr-defined]
        if self.use_critic:
            groups.append((str(Role.Critic), self.critic_wg))  # type: ignore[attr-defined]
        for role, group in groups:
            remote = None if trainer.default_hdfs_dir is None else os.path.join(
                trainer.default_hdfs_dir, step_name(step), role)  # fmt: skip
            group.save_checkpoint(str(folder / role), remote, step, max_ckpt_to_keep=None)
            pause_point(f"save:{step}:after_{role}")  # tests: a kill lands mid-save
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / ".data.pt.tmp"
        torch.save(self.train_dataloader.state_dict(), partial)  # type: ignore[attr-defined]
        os.replace(partial, folder / "data.pt")
        if self.stamp:
            write_stamp(self.run_dir, step, self.stamp)
        write_tracker(self.run_dir, step)  # verl: open("w") then write
        self.saved_step = step
        callback = getattr(self, "checkpoint_callback", None)  # v1's; the legacy trainer has none
        if callback is not None:
            callback.on_save(trainer=self, global_step=step, checkpoint_dir=str(folder),
                             async_save=False)  # fmt: skip
        keep = trainer.get("max_actor_ckpt_to_keep") or 0
        for line in prune(self.run_dir, int(keep), say_kept=False):  # the launcher says them
            say(line)
        self._measured("save_s", started)
        self.last_save = time.time()

    # ---- the best checkpoint -------------------------------------------------------------
    def _validate(self, *args: Any, **kwargs: Any) -> dict:
        started = time.time()
        metrics = super()._validate(*args, **kwargs)  # type: ignore[misc]
        self._measured("val_s", started)
        step = self.global_steps
        value = metrics.get(self.best_metric) if isinstance(metrics, dict) else None
        if not self.keep_best or step < 1 or step == self.sick_step or not finite(value):
            return metrics
        best = read_best(self.run_dir)
        if best is not None and best.get("metric") != self.best_metric:
            say(f"the kept best (step {best['step']}) is by {best.get('metric')}, not "
                f"{self.best_metric}: this run's own best replaces it")  # fmt: skip
            best = None
        if best is not None and best["step"] != step and best["value"] >= float(value):
            return metrics
        if self.saved_step != step:
            say(f"step {step} is the best so far ({self.best_metric} = {value:.4g}): saving it")
            self._save_checkpoint()
        write_best(self.run_dir, step, self.best_metric, float(value), self.stamp)
        say(f"best checkpoint: step {step} ({self.best_metric} = {value:.4g})")
        return metrics


def file_first(backends: dict[str, Any]) -> None:
    """Reorder verl's ``Tracking.logger`` in place: the file logger first, the others as they
    were (see the module docstring)."""
    if "file" in backends:
        ordered = {"file": backends.pop("file"), **backends}
        backends.clear()
        backends.update(ordered)


def _number(value: Any) -> bool:
    """A metric value float() takes: a real number (numpy's too) or a one-element array/tensor."""
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Real):
        return True
    size = value.numel() if isinstance(value, torch.Tensor) else getattr(value, "size", None)
    return size == 1 and hasattr(value, "item")

"""The guard of both of verl's PPO trainers: whole, healthy checkpoints, stops, time saves, the
kept best. A binding calls _begin, _after_update, _stop_if_requested, _prepare_logger and
_end_after."""

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
    saved_steps,
    stamp_time,
    step_dir,
    step_name,
    write_best,
    write_stamp,
    write_tracker,
)
from verl_gsm8k.guard import say, stop
from verl_gsm8k.guard.prune import prune
from verl_gsm8k.guard.rules import SCORE as SCORE_KEY
from verl_gsm8k.guard.rules import Trip, Watchdog, trained_steps
from verl_gsm8k.guard.thresholds import Thresholds

logger = logging.getLogger(__name__)

# a step for the watchdog: its metrics, each response's tokens, score and prompt
Observed = tuple[dict[str, float], list[list[int]], list[float], list[str]]


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def logged_history(run_dir: Path, before: int) -> list[dict[str, float]]:
    """Steps 1..before-1's training metrics as logged (the last launch's wins)."""
    rows = logged_rows(run_dir)
    return [rows[step] for step in trained_steps(rows) if 0 < step < before]


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics that are numbers (numpy's, one-element arrays and tensors) as floats."""

    def number(v: Any) -> bool:
        size = v.numel() if isinstance(v, torch.Tensor) else getattr(v, "size", None)
        real = isinstance(v, numbers.Real) and not isinstance(v, bool)
        return real or size == 1 and hasattr(v, "item")

    return {key: float(value) for key, value in metrics.items() if number(value)}


class GuardBase:
    """Mixed into one of verl's PPO trainers, which gives the attributes below."""

    config: DictConfig
    global_steps: int
    use_critic: bool
    actor_rollout_wg: Any
    critic_wg: Any
    train_dataloader: Any

    def _init_guard(self, config: DictConfig) -> None:
        block = OmegaConf.to_container(config.get("gsm8k_guard") or {}, resolve=True)
        assert isinstance(block, dict)
        thresholds = Thresholds.from_mapping(block.get("watchdog") or {})  # mode included
        self.guard_mode = thresholds.mode
        self.keep_best = bool(block.get("keep_best", True))
        self.best_metric = str(block.get("best_metric") or "val-core/openai/gsm8k/acc/mean@1")
        self.save_every_s = 60.0 * float(block.get("save_every_min") or 0)
        self.last_save = time.time()  # the loop's start (reset there), then each save's end
        self.run_dir = Path(config.trainer.default_local_dir)
        self.stamp = launch_stamp()
        self.launched = stamp_time(self.stamp)  # the first step measures the start-up
        self.response_limit = int(config.data.get("max_response_length") or 0) or None
        self.watchdog = Watchdog(thresholds, response_limit=self.response_limit)
        self.sick_step: int | None = None  # the step the watchdog stopped (never saved)
        self.saved_step: int | None = None  # the step this launch saved last
        self.stop_at: int | None = None  # the step after which the run ends
        self.job_end = float(os.environ.get(stop.ENV_JOB_END) or 0) or None
        self.timings = stop.Timings.read(self.run_dir)
        self.logger_ready = False
        best = self.best_metric if self.keep_best else "off"
        say(f"watchdog {self.guard_mode}, keep best {best}, checkpoints {self.run_dir}")

    # ---- the loop
    def _begin(self, resumed_step: int) -> None:
        """The loop is about to train step ``resumed_step + 1`` (0: a fresh run)."""
        if resumed_step > 0:
            self.saved_step = resumed_step  # the resumed checkpoint exists: never saved again
        self.last_save = time.time()  # the workers' start-up is not time a SIGKILL could lose
        history = logged_history(self.run_dir, resumed_step + 1)
        self.watchdog = Watchdog(self.watchdog.thresholds, history, self.response_limit)

    def _after_update(self, step: int, started: float, observe: Callable[[], Observed]) -> None:
        """After the actor update, before verl's save: the watchdog, a stop, or a time save."""
        self._measured("step_s", started)
        if self.guard_mode != "off":
            self._judge(step, *observe())
        if self.sick_step is not None:
            return
        if self.job_end and stop.must_stop(time.time(), self.job_end, self.timings):
            stop.request(self.run_dir, self.job_end - 5, stop.JOB_END)  # verl ended by then
        if not self._stop_if_requested(step) and self.save_every_s:
            since = time.time() - self.last_save
            if since >= self.save_every_s:
                say(f"time save: {since / 60:.1f} min since the last save (SAVE_EVERY_MIN): "
                    f"saving step {step}")  # fmt: skip
                self._save_checkpoint()

    def _stop_if_requested(self, step: int) -> bool:
        """On a stop request, save ``step`` unless saved or past its deadline and end after it.
        True when a stop is under way."""
        if self.stop_at is not None:
            return True
        found = stop.read_request(self.run_dir)
        if found is None:
            return False
        deadline, why = found
        now = time.time()
        head = "stop requested (SIGTERM)"
        if why != stop.SIGTERM and self.job_end:
            head = (f"the job ends in {self.job_end - now:.0f} s: one more step and its save "
                    f"take about {self.timings.next_step() or 0:.0f} s (measured)")  # fmt: skip
        if step == 0 or self.saved_step == step:
            last = f"step {step} is saved" if step else "no step trained yet"
            say(f"{head}: {last}, nothing new to save: stopping before step {step + 1}")
        elif now < deadline:
            say(f"{head}: saving step {step}, then stopping")
            self._save_checkpoint(step)
        else:
            say(f"{head} and its grace is over: step {step} not saved")
        self._end_after(step)
        return True

    def _end_after(self, step: int) -> None:
        """The run ends after ``step``; a binding also ends verl's loop there."""
        self.stop_at = step

    def _measured(self, name: str, started: float) -> None:
        """Keep the slowest ``name`` and, at this launch's first step, its start-up."""
        now = time.time()
        self.timings.slowest(name, now - started)
        if name == "step_s" and self.launched:
            self.timings.slowest("start_s", now - self.launched)
            self.launched = None
        self.timings.write(self.run_dir)

    def _prepare_logger(self, backends: dict[str, Any]) -> None:
        """Once: the file logger before wandb (a wandb failure must not lose the line)."""
        if self.logger_ready:
            return
        self.logger_ready = True
        ordered = sorted(backends.items(), key=lambda item: item[0] != "file")
        backends.clear()
        backends.update(ordered)
        if "wandb" in backends:
            backends["wandb"] = _Wandb(backends["wandb"])

    # ---- the watchdog
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
        """Point the tracker at the last healthy step; drop a best at or after ``sick``."""
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

    # ---- saving
    def _save_checkpoint(self, step: int | None = None) -> None:
        """Save as ``step`` (default global_steps) in verl's order (v1 trainer_base.py ~948-1029,
        legacy ray_trainer.py ~983-1050), with the tracker and data.pt atomic, the launch's stamp,
        pruning over the whole run, no save of a sick step."""
        step = self.global_steps if step is None else step
        if self.sick_step == step:
            say(f"step {step} is not saved: the watchdog stopped it")
            return
        if self.saved_step == step:
            return  # saved already this step (a stop request or the kept best)
        folder, started = step_dir(self.run_dir, step), time.time()
        logger.info("Saving checkpoint to %s", folder)
        clear_sick(self.run_dir, step)  # a resumed run trains this step again: new weights
        self._save_role("actor", self.actor_rollout_wg, folder, step)
        if self.use_critic:
            self._save_role(str(Role.Critic), self.critic_wg, folder, step)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.train_dataloader.state_dict(), folder / ".data.pt.tmp")
        os.replace(folder / ".data.pt.tmp", folder / "data.pt")
        if self.stamp:
            write_stamp(self.run_dir, step, self.stamp)
        write_tracker(self.run_dir, step)
        self.saved_step = step
        callback = getattr(self, "checkpoint_callback", None)  # v1's; the legacy trainer has none
        if callback is not None:
            callback.on_save(trainer=self, global_step=step, checkpoint_dir=str(folder),
                             async_save=False)  # fmt: skip
        keep = int(self.config.trainer.get("max_actor_ckpt_to_keep") or 0)
        for line in prune(self.run_dir, keep, say_kept=False):  # the launcher says those kept
            say(line)
        self._measured("save_s", started)
        self.last_save = time.time()

    def _save_role(self, role: str, group: Any, folder: Path, step: int) -> None:
        hdfs = self.config.trainer.default_hdfs_dir
        remote = None if hdfs is None else os.path.join(hdfs, step_name(step), role)
        group.save_checkpoint(str(folder / role), remote, step, max_ckpt_to_keep=None)

    # ---- the best checkpoint
    def _validate(self, *args: Any, **kwargs: Any) -> dict:
        """verl's validation, then KEEP_BEST: a new best is saved and recorded."""
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


class _Wandb:
    """verl's wandb, off for the launch once its service is gone (a stop's SIGTERM)."""

    def __init__(self, wandb: Any) -> None:
        self.wandb = wandb

    def log(self, data: dict[str, Any], step: int) -> None:
        self._call("log", f"step {step} is in the metrics file, not in wandb", data=data, step=step)

    def finish(self, exit_code: int = 0) -> None:
        self._call("finish", "its last steps may be missing from wandb", exit_code=exit_code)

    def _call(self, name: str, lost: str, **kwargs: Any) -> None:
        try:
            if self.wandb is not None:
                getattr(self.wandb, name)(**kwargs)
        except ConnectionError as error:  # the service's socket: reset, refused, broken
            self.wandb = None
            say(f"wandb: its service process ended ({type(error).__name__}: {error}): {lost}; "
                "wandb is off for the rest of this launch")  # fmt: skip

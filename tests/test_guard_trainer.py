"""The guarded trainers' own bookkeeping (verl_gsm8k/ppo_trainer/guard_base.py, guarded.py,
legacy.py) on the real classes, with verl's validation and loop stood in for: the kept best, the
time save, the deadline, the stop request, the resume. Their saves, kills and watchdog stops run
for real in tests/test_train_cpu.py and tests/test_slurm_nodes_cpu.py (v1) and
tests/test_train_cpu_variants.py (legacy)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from verl_gsm8k.common.run_dir import read_best, write_best
from verl_gsm8k.guard.deadline import Timings

METRIC = "val-core/openai/gsm8k/acc/mean@1"


def trainer_at(step: int, run_dir: Path, legacy: bool = False):
    from verl_gsm8k.ppo_trainer.guarded import GuardedTrainer
    from verl_gsm8k.ppo_trainer.legacy import GuardedLegacyTrainer

    cls = GuardedLegacyTrainer if legacy else GuardedTrainer
    trainer = cls.__new__(cls)  # no verl workers: the guard's bookkeeping alone
    trainer.run_dir, trainer.keep_best, trainer.best_metric = run_dir, True, METRIC
    trainer.global_steps, trainer.sick_step, trainer.saved_step = step, None, step
    trainer.stamp = "20261126T000000Z"
    trainer.timings, trainer.started_up = Timings(), False  # _validate measures itself (deadline)
    trainer.save_every_s, trainer.last_save = 0.0, time.time()  # no time saves
    trainer.resumed_step, trainer.logger_ready = step, False
    return trainer


def test_a_time_save_comes_after_the_first_step_past_the_interval(tmp_path, monkeypatch):
    """SAVE_EVERY_MIN: a step that ends that long after the last save is saved, SAVE_FREQ or not;
    one that ends sooner is not (the real run: tests/test_train_cpu.py's kill test)."""
    from verl_gsm8k.ppo_trainer.guarded import GuardedTrainer

    saved: list[int] = []
    monkeypatch.setattr(
        GuardedTrainer, "_save_checkpoint", lambda self: saved.append(self.global_steps)
    )
    trainer = trainer_at(5, tmp_path)
    trainer.save_every_s, trainer.last_save = 600.0, time.time() - 599.0
    trainer._save_if_due(5)
    trainer.last_save -= 2.0  # now 601 s ago
    trainer._save_if_due(5)
    trainer.save_every_s = 0.0  # SAVE_EVERY_MIN=0: never
    trainer._save_if_due(5)
    assert saved == [5]


def test_a_best_by_another_metric_is_replaced_not_compared(tmp_path, monkeypatch):
    """BEST_METRIC changed between launches (docs/reliability.md, "What survives what"): the old
    best's value is of another metric, so this run's first validation is its best, whatever the
    two numbers."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    monkeypatch.setattr(PPOTrainerSync, "_validate", lambda self, *a, **k: {METRIC: 0.4})
    write_best(tmp_path, 3, "val-aux/openai/gsm8k/reward/mean@1", 0.9, "20261125T000000Z")
    trainer_at(6, tmp_path)._validate()
    best = read_best(tmp_path)
    assert (best["step"], best["metric"], best["value"]) == (6, METRIC, 0.4)
    # the same metric: compared, a lower value keeps the best
    monkeypatch.setattr(PPOTrainerSync, "_validate", lambda self, *a, **k: {METRIC: 0.3})
    trainer_at(7, tmp_path)._validate()
    assert read_best(tmp_path)["step"] == 6


@pytest.mark.parametrize("value", [float("nan"), None])
def test_a_validation_without_a_finite_value_keeps_no_best(tmp_path, monkeypatch, value):
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    monkeypatch.setattr(PPOTrainerSync, "_validate", lambda self, *a, **k: {METRIC: value})
    trainer_at(4, tmp_path)._validate()
    assert read_best(tmp_path) is None


def test_a_resumed_watchdog_reads_the_logged_history_of_every_launch(tmp_path):
    """ppo_trainer/guard_base.py's logged_history: the steps before the resumed one, from every
    metrics file of the run (one per launch, as the launcher names them), a step logged twice
    taken from the later launch, validation-only lines (no score) and later steps left out."""
    import json

    from verl_gsm8k.ppo_trainer.guard_base import SCORE_KEY, logged_history

    metrics = tmp_path / "metrics"
    metrics.mkdir()

    def launch(stamp: str, rows: list[tuple[int, dict]]) -> None:
        lines = [json.dumps({"step": step, "data": data}) for step, data in rows]
        (metrics / f"metrics-{stamp}.jsonl").write_text("\n".join(lines) + "\n")

    launch("20261126T000000Z", [(0, {"val-core/x": 0.1}), (1, {SCORE_KEY: 0.1}),
                                (2, {SCORE_KEY: 0.2}), (3, {SCORE_KEY: 0.3})])  # fmt: skip
    launch("20261126T010000Z", [(3, {SCORE_KEY: 0.33}), (4, {SCORE_KEY: 0.4}),
                                (5, {SCORE_KEY: 0.5})])  # fmt: skip
    (metrics / "metrics-20261126T020000Z.jsonl").write_text('{"step": 5, "da')  # cut by a kill
    history = logged_history(tmp_path, before=5)
    assert [row[SCORE_KEY] for row in history] == [0.1, 0.2, 0.33, 0.4]


@pytest.fixture
def saved(monkeypatch) -> list[int]:
    """The steps the trainers save, their save recorded instead of run (no verl workers)."""
    from verl_gsm8k.ppo_trainer.guard_base import GuardBase

    steps: list[int] = []

    def save(self, step: int | None = None) -> None:
        steps.append(self.global_steps if step is None else step)

    monkeypatch.setattr(GuardBase, "_save_checkpoint", save)
    return steps


def test_a_step_that_would_not_end_before_the_job_does_is_saved_and_the_last(
    tmp_path, monkeypatch, saved
):
    """The deadline (guard/deadline.py) in the real class's step: verl's step stood in, the save
    recorded. With time for one more step and its save the loop goes on; without, this step is
    saved, the stop recorded for the launcher (exit 5) and verl's loop ends after it. The real
    stop-request path that shares the save and the end runs in tests/test_slurm_nodes_cpu.py."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from verl_gsm8k.guard.deadline import MARGIN_S, read_stop

    monkeypatch.setattr(PPOTrainerSync, "step", lambda self, metrics, timing_raw: "batch")
    trainer = trainer_at(3, tmp_path)
    trainer.guard_mode, trainer.stop_at, trainer.total_training_steps = "off", None, 100
    trainer.timings = Timings(step_s=10.0, save_s=2.0, start_s=60.0)
    needed = 10.0 + 2 * 2.0  # this step's save, the next step, its save

    trainer.job_end = time.time() + needed + MARGIN_S + 30
    assert trainer.step({}, {}) == "batch"
    assert (saved, trainer.stop_at, trainer.total_training_steps) == ([], None, 100)
    assert read_stop(tmp_path) is None

    trainer.global_steps = 4
    trainer.job_end = time.time() + needed + MARGIN_S - 5
    trainer.step({}, {})
    assert (saved, trainer.stop_at, trainer.total_training_steps) == ([4], 4, 4)
    stop = read_stop(tmp_path)
    assert stop is not None and (stop["step"], stop["launch"]) == (4, trainer.stamp)


def test_a_stop_requested_before_the_first_step_or_during_validation_trains_no_step_more(
    tmp_path, saved
):
    """A SIGTERM during start-up (or the step-0 validation) ends fit before its first step, with
    nothing saved (nothing trained by this launch); one during a validation after step N saves N
    when it is not saved yet, and no step more is trained. verl's loop stands in by its condition
    (global_steps <= total_training_steps, trainer_base.py ~467)."""
    from types import SimpleNamespace

    from verl_gsm8k.common.run_dir import STOP_FILE

    def launch(resumed: int):
        trainer = trainer_at(resumed, tmp_path)
        trainer.saved_step = resumed if resumed else None  # fit(): the resumed checkpoint
        trainer.guard_mode, trainer.stop_at, trainer.total_training_steps = "off", None, 100
        trainer.logger = SimpleNamespace(logger={})
        return trainer

    # no request: on_train_begin and a validation change nothing
    trainer = launch(4)
    trainer.on_validate_end()  # the step-0 validation
    trainer.global_steps += 1  # fit: "we start from step 1"
    trainer.on_train_begin()
    assert (trainer.stop_at, trainer.total_training_steps, saved) == (None, 100, [])

    (tmp_path / STOP_FILE).write_text(f"{time.time() + 600:.0f}\n")
    for resumed in (0, 4):  # a fresh run, a resumed one: the request came during start-up
        trainer = launch(resumed)
        trainer.global_steps += 1
        trainer.on_train_begin()
        assert trainer.global_steps > trainer.total_training_steps == resumed  # no step runs
        assert (trainer.stop_at, saved) == (resumed, [])

    # during the validation after step 7, not saved (SAVE_FREQ not met): saved, then the end
    trainer = launch(4)
    trainer.global_steps = 7
    trainer.on_validate_end()
    assert (trainer.stop_at, trainer.total_training_steps, saved) == (7, 7, [7])
    trainer.on_validate_end()  # once: the stop under way is not said or saved again
    assert saved == [7]


def test_the_legacy_loop_takes_no_batch_once_the_run_is_to_end(tmp_path, saved):
    """verl's legacy trainer has no hooks: its dataloader, wrapped (ppo_trainer/legacy.py), ends
    the loop. No request: every batch. A stop request during start-up or a validation (read before
    the next batch): the last step saved if this launch trained it unsaved, no batch more. A run
    that is to end after a step (a trip, a stop request, a deadline: stop_at): no batch more.
    verl's loop stands in: it adds one to global_steps after each step (ray_trainer.py ~1790)."""
    from verl_gsm8k.common.run_dir import STOP_FILE
    from verl_gsm8k.ppo_trainer.legacy import _StoppingLoader

    def loop(trainer) -> list[str]:
        taken = []
        for batch in _StoppingLoader(["a", "b", "c"], trainer):
            taken.append(batch)
            trainer.global_steps += 1
        return taken

    def launch(resumed: int):
        trainer = trainer_at(resumed, tmp_path, legacy=True)
        trainer.saved_step = resumed if resumed else None  # _load_checkpoint: the resumed one
        trainer.guard_mode, trainer.stop_at = "off", None
        trainer.global_steps = resumed + 1  # fit: "we start from step 1"
        return trainer

    trainer = launch(4)
    assert loop(trainer) == ["a", "b", "c"] and trainer.global_steps == 8
    trainer._end_after(5)  # the watchdog's trip, or a stop request after the update
    assert loop(trainer) == [] and saved == []

    (tmp_path / STOP_FILE).write_text(f"{time.time() + 600:.0f}\n")
    for resumed in (0, 4):  # a stop requested during start-up: nothing trained, nothing saved
        trainer = launch(resumed)
        assert loop(trainer) == [] and trainer.stop_at == resumed and saved == []
    trainer = launch(4)
    trainer.global_steps = 8  # step 7 trained (not a save step), then its validation
    assert loop(trainer) == [] and (trainer.stop_at, saved) == (7, [7])


def test_the_legacy_trainer_begins_its_guard_at_the_step_it_resumes(tmp_path, monkeypatch):
    """verl's legacy trainer loads its checkpoint in ``_load_checkpoint`` (ray_trainer.py ~1192),
    which sets global_steps; the guarded one then begins its guard there (ppo_trainer/legacy.py):
    the resumed step is never saved again, its watchdog is given the steps logged before the next
    one, and the time since the last save starts now. verl's load stands in (global_steps = 4)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from verl_gsm8k.guard.rules import Thresholds, Watchdog
    from verl_gsm8k.ppo_trainer import guard_base

    asked: list[tuple[Path, int]] = []

    def history(run_dir: Path, before: int) -> list:
        asked.append((run_dir, before))
        return []

    def verls_load(self) -> None:
        self.global_steps = 4

    monkeypatch.setattr(guard_base, "logged_history", history)
    monkeypatch.setattr(RayPPOTrainer, "_load_checkpoint", verls_load)
    trainer = trainer_at(0, tmp_path, legacy=True)
    trainer.saved_step, trainer.last_save, trainer.response_limit = None, 0.0, 32
    trainer.watchdog = Watchdog(Thresholds(), [], 32)
    trainer._load_checkpoint()
    assert (trainer.resumed_step, trainer.saved_step, asked) == (4, 4, [(tmp_path, 5)])
    assert time.time() - trainer.last_save < 60


def test_the_legacy_trainer_orders_verls_loggers_before_its_first_log(tmp_path, monkeypatch):
    """verl's legacy fit builds its Tracking inside (ray_trainer.py ~1417): for the length of
    fit, Tracking is replaced so that its first log puts the file logger first and wraps wandb
    (ppo_trainer/legacy.py), and verl's class is back afterwards. verl's fit stands in: it builds
    a Tracking of two recording backends, wandb first as verl orders them, and logs a step."""
    from types import SimpleNamespace

    import verl.utils.tracking as tracking
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from verl_gsm8k.ppo_trainer.wandb_gap import AckedWandb

    calls: list[str] = []

    class Backend:
        def __init__(self, name: str) -> None:
            self.name = name

        def log(self, data: dict, step: int) -> None:
            calls.append(self.name)

    def fit(self):
        from verl.utils.tracking import Tracking  # as verl's fit imports it

        logger = Tracking.__new__(Tracking)  # its backends without their set-up
        logger.logger = {"wandb": Backend("wandb"), "file": Backend("file")}
        logger.log(data={"critic/score/mean": 0.5}, step=1)
        return logger

    verls = tracking.Tracking
    monkeypatch.setattr(RayPPOTrainer, "fit", fit)
    trainer = trainer_at(0, tmp_path, legacy=True)
    trainer.tracer = SimpleNamespace(close=lambda: None)
    logger = trainer.fit()
    assert calls == ["file", "wandb"]
    assert isinstance(logger.logger["wandb"], AckedWandb)
    assert tracking.Tracking is verls

"""The guarded trainers' bookkeeping (ppo_trainer/) on the real classes, verl's validation, loop
and saves stood in for (real ones: tests/test_train_cpu.py)."""

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from verl_gsm8k.common.run_dir import STOP_FILE, read_best, write_best
from verl_gsm8k.guard.stop import JOB_END, MARGIN_S, Timings, read_request

METRIC = "val-core/openai/gsm8k/acc/mean@1"


def trainer_at(step: int, run_dir: Path, legacy: bool = False, resumed: bool = True):
    from verl_gsm8k.ppo_trainer.legacy import GuardedLegacyTrainer
    from verl_gsm8k.ppo_trainer.traced import TracingTrainer

    cls = GuardedLegacyTrainer if legacy else TracingTrainer
    trainer = cls.__new__(cls)
    trainer.__dict__.update(
        run_dir=run_dir, keep_best=True, best_metric=METRIC, global_steps=step, sick_step=None,
        saved_step=step if resumed and step else None, stamp="20261126T000000Z", launched=None,
        timings=Timings(), save_every_s=0.0, last_save=time.time(),
        logger_ready=False, guard_mode="off", stop_at=None, job_end=None,
        total_training_steps=100, logger=SimpleNamespace(logger={}),
    )  # fmt: skip
    return trainer


@pytest.fixture
def saved(monkeypatch) -> list[int]:
    from verl_gsm8k.ppo_trainer.guard_base import GuardBase

    steps: list[int] = []
    monkeypatch.setattr(GuardBase, "_save_checkpoint", lambda self, step=None: steps.append(
        self.global_steps if step is None else step))  # fmt: skip
    return steps


def test_the_best_is_kept_by_its_own_metric_and_only_finite(tmp_path, monkeypatch, saved):
    """A best of another metric is replaced; a new best not saved yet is saved."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    def validation(value):
        monkeypatch.setattr(PPOTrainerSync, "_validate", lambda self, *a, **k: {METRIC: value})

    for value in (float("nan"), None):
        validation(value)
        trainer_at(4, tmp_path)._validate()
        assert read_best(tmp_path) is None
    write_best(tmp_path, 3, "val-aux/openai/gsm8k/reward/mean@1", 0.9, "20261125T000000Z")
    validation(0.4)
    trainer_at(6, tmp_path, resumed=False)._validate()
    best = read_best(tmp_path)
    assert (best["step"], best["metric"], best["value"], saved) == (6, METRIC, 0.4, [6])
    validation(0.3)
    trainer_at(7, tmp_path)._validate()
    assert read_best(tmp_path)["step"] == 6


def test_a_time_save_comes_after_the_first_step_past_the_interval(tmp_path, saved):
    trainer = trainer_at(5, tmp_path, resumed=False)
    for every_s, ago in ((600.0, 599.0), (600.0, 601.0), (0.0, 601.0)):
        trainer.save_every_s, trainer.last_save = every_s, time.time() - ago
        trainer._after_update(5, time.time(), lambda: pytest.fail("watchdog off"))
    assert saved == [5]
    assert Timings.read(tmp_path).step_s is not None  # the step measured itself


def test_a_step_that_would_not_end_before_the_job_does_is_saved_and_the_last(tmp_path, monkeypatch,
                                                                             saved):  # fmt: skip
    """GSM8K_JOB_END without time for a step and a save: stop requested, step saved, loop ended."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    monkeypatch.setattr(PPOTrainerSync, "step", lambda self, metrics, timing_raw: "batch")
    trainer = trainer_at(3, tmp_path, resumed=False)
    trainer.timings = Timings(step_s=10.0, save_s=2.0, start_s=60.0)
    needed = 10.0 + 2 * 2.0  # this step's save, the next step, its save
    trainer.job_end = time.time() + needed + MARGIN_S + 30
    assert trainer.step({}, {}) == "batch"
    assert (saved, trainer.stop_at, trainer.total_training_steps) == ([], None, 100)
    assert read_request(tmp_path) is None
    trainer.global_steps, trainer.job_end = 4, time.time() + needed + MARGIN_S - 5
    trainer.step({}, {})
    assert (saved, trainer.stop_at, trainer.total_training_steps) == ([4], 4, 4)
    assert read_request(tmp_path) == (pytest.approx(trainer.job_end - 5, abs=1), JOB_END)


def test_a_stop_requested_before_the_first_step_or_during_validation_trains_no_step_more(
    tmp_path, saved
):
    trainer = trainer_at(4, tmp_path)
    trainer.on_validate_end()  # the step-0 validation, no request
    trainer.global_steps += 1  # fit: "we start from step 1"
    trainer.on_train_begin()
    assert (trainer.stop_at, trainer.total_training_steps, saved) == (None, 100, [])
    (tmp_path / STOP_FILE).write_text(f"{time.time() + 600:.0f}\n")
    for resumed in (0, 4):  # a fresh run, a resumed one
        trainer = trainer_at(resumed, tmp_path)
        trainer.global_steps += 1
        trainer.on_train_begin()
        assert trainer.global_steps > trainer.total_training_steps == resumed
        assert (trainer.stop_at, saved) == (resumed, [])
    trainer = trainer_at(7, tmp_path, resumed=False)  # step 7 not a save step
    trainer.on_validate_end()
    trainer.on_validate_end()  # once: the stop under way is not said or saved again
    assert (trainer.stop_at, trainer.total_training_steps, saved) == (7, 7, [7])


def test_the_legacy_loop_takes_no_batch_once_the_run_is_to_end(tmp_path, saved):
    from verl_gsm8k.ppo_trainer.legacy import _StoppingLoader

    def loop(trainer) -> list[str]:
        taken = []
        for batch in _StoppingLoader(["a", "b", "c"], trainer):
            taken.append(batch)
            trainer.global_steps += 1
        return taken

    def launch(resumed: int, at: int | None = None):
        trainer = trainer_at(resumed, tmp_path, legacy=True)
        trainer.global_steps = at or resumed + 1  # fit: "we start from step 1"
        return trainer

    trainer = launch(4)
    assert loop(trainer) == ["a", "b", "c"] and trainer.global_steps == 8
    trainer._end_after(5)
    assert loop(trainer) == [] and saved == []
    (tmp_path / STOP_FILE).write_text(f"{time.time() + 600:.0f}\n")
    for resumed in (0, 4):
        trainer = launch(resumed)
        assert loop(trainer) == [] and trainer.stop_at == resumed and saved == []
    trainer = launch(4, at=8)  # step 7 trained (not a save step), then its validation
    assert loop(trainer) == [] and (trainer.stop_at, saved) == (7, [7])


def test_the_legacy_trainer_begins_its_guard_at_the_step_it_resumes(tmp_path, monkeypatch):
    """The resumed step is not saved again; the watchdog gets the training steps logged before."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from verl_gsm8k.guard.rules import SCORE
    from verl_gsm8k.ppo_trainer import guard_base

    metrics = tmp_path / "metrics"
    metrics.mkdir()
    for stamp, rows in (("20261126T000000Z", [(0, {"val-core/x": 0.1}), (1, 0.1), (2, 0.2),
                                              (3, 0.3)]),
                        ("20261126T010000Z", [(3, 0.33), (4, 0.4), (5, 0.5)])):  # fmt: skip
        lines = [{"step": s, "data": d if isinstance(d, dict) else {SCORE: d}} for s, d in rows]
        text = "".join(json.dumps(line) + "\n" for line in lines)
        (metrics / f"metrics-{stamp}.jsonl").write_text(text)
    (metrics / "metrics-20261126T020000Z.jsonl").write_text('{"step": 5, "da')  # cut by a kill
    monkeypatch.setattr(RayPPOTrainer, "_load_checkpoint", lambda self: setattr(
        self, "global_steps", 4))  # fmt: skip
    given: list[list[dict]] = []
    monkeypatch.setattr(guard_base, "Watchdog", lambda _, history, __: given.append(history))
    trainer = trainer_at(0, tmp_path, legacy=True)
    trainer.last_save, trainer.response_limit = 0.0, 32
    trainer.watchdog = SimpleNamespace(thresholds=None)
    trainer._load_checkpoint()
    assert trainer.saved_step == 4 and time.time() - trainer.last_save < 60
    assert [[row[SCORE] for row in history] for history in given] == [[0.1, 0.2, 0.33, 0.4]]


def test_the_file_logger_comes_first_and_a_dead_wandb_ends_only_wandb(tmp_path, monkeypatch):
    """A dead wandb: no more wandb calls, the file logger keeps the step; verl's class restored."""
    import verl.utils.tracking as tracking
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    calls: list[str] = []

    class Backend:
        def __init__(self, name: str) -> None:
            self.name = name

        def log(self, data: dict, step: int) -> None:
            calls.append(f"{self.name} {step}")
            if self.name == "wandb" and step == 2:
                raise ConnectionResetError(104, "Connection reset by peer")

        def finish(self, exit_code: int = 0) -> None:
            calls.append(f"{self.name} finish")

    def fit(self):
        from verl.utils.tracking import Tracking  # as verl's fit imports it

        logger = Tracking.__new__(Tracking)  # its backends without their set-up
        logger.logger = {"wandb": Backend("wandb"), "file": Backend("file")}
        for step in (1, 2, 3):
            logger.log(data={"critic/score/mean": 0.5}, step=step)
        logger.finish()

    verls = tracking.Tracking
    monkeypatch.setattr(RayPPOTrainer, "fit", fit)
    trainer = trainer_at(0, tmp_path, legacy=True)
    trainer.tracer = SimpleNamespace(close=lambda: None)
    trainer.fit()
    assert calls == ["file 1", "wandb 1", "file 2", "wandb 2", "file 3", "file finish"]
    assert tracking.Tracking is verls

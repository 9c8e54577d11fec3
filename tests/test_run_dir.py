"""A run directory's layout lives in common/run_dir.py alone, and its readers and writers."""

import io
import json
import math
import tokenize
from pathlib import Path

import pytest
from helpers import ROOT

from verl_gsm8k.common import run_dir as rd

HOME = "verl_gsm8k/common/run_dir.py"
NEEDLES = ("latest_checkpointed_iteration", "global_step_")
FOLDERS = ("verl_gsm8k", "data_prep", "rewards", "scripts", "recipes", "slurm")


def scan(root: Path) -> list[str]:
    """``file:line: text`` of each needle outside HOME: in Python's strings and docstrings (not
    its comments), anywhere in a shell script."""
    found = []
    for path in sorted({p for f in FOLDERS for p in (root / f).rglob("*")}):
        name = path.relative_to(root).as_posix()
        if name == HOME or path.suffix not in (".py", ".sh", ".sbatch") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        lines = list(enumerate(text.splitlines(), 1))
        if path.suffix == ".py":
            tokens = tokenize.generate_tokens(io.StringIO(text).readline)
            lines = [(t.start[0] + i, line) for t in tokens if t.type != tokenize.COMMENT
                     for i, line in enumerate(t.string.splitlines())]  # fmt: skip
        found += [f"{name}:{n}: {ln.strip()}" for n, ln in lines if any(x in ln for x in NEEDLES)]
    return found


def test_no_code_outside_run_dir_spells_the_layout(tmp_path: Path):
    assert scan(ROOT) == [], f"use {HOME}'s names (TRACKER, step_dir, ...)"
    (tmp_path / "verl_gsm8k" / "common").mkdir(parents=True)
    (tmp_path / "verl_gsm8k" / "common" / "run_dir.py").write_text('TRACKER = "global_step_"\n')
    (tmp_path / "verl_gsm8k" / "a.py").write_text(
        '"""Reads global_step_N."""\n'
        "# a comment may say latest_checkpointed_iteration.txt\n"
        'x = 1  # or global_step_N\nname = f"global_step_{x}"\n'
    )
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "a.sh").write_text("# reads latest_checkpointed_iteration.txt\ntrue\n")
    (tmp_path / "recipes" / "b.sh").write_text('cat "$RUN_DIR/global_step_$step"\n')
    assert scan(tmp_path) == [
        "recipes/a.sh:1: # reads latest_checkpointed_iteration.txt",
        'recipes/b.sh:1: cat "$RUN_DIR/global_step_$step"',
        'verl_gsm8k/a.py:1: """Reads global_step_N."""',
        'verl_gsm8k/a.py:4: f"global_step_{x}"',
    ]


def test_every_name_is_one_name_and_drawn_in_the_docstring():
    names = {key: value for key, value in vars(rd).items()
             if key.isupper() and isinstance(value, str) and not key.startswith("_")}  # fmt: skip
    names.pop("STEP_N"), names.pop("STEP_GLOB")  # built from STEP_PREFIX
    assert len(set(names.values())) == len(names), names
    tree = (rd.__doc__ or "").replace("<stamp>", "{stamp}")
    assert not [value for value in names.values() if value not in tree]
    assert (rd.EXIT_WATCHDOG, rd.EXIT_PREEMPTED) == (4, 5)  # the launcher exits with them


def test_step_directories_by_name_and_number(tmp_path: Path):
    assert rd.step_dir(tmp_path, 20) == tmp_path / rd.step_name(20) == tmp_path / "global_step_20"
    assert rd.step_of(rd.step_dir(tmp_path, 7)) == 7 and rd.step_of(Path("global_step_0")) == 0
    for other in ("global_step_", "global_step_x", "global_step_3.tmp", "step_3", "actor"):
        assert rd.step_of(tmp_path / other) is None, other
    assert rd.step_of(rd.removing_dir(tmp_path, 3)) is None
    assert rd.saved_steps(tmp_path / "missing") == []
    for step in (100, 2, 10):
        rd.step_dir(tmp_path, step).mkdir()
    (tmp_path / "global_step_7").write_text("a file, not a checkpoint")
    (tmp_path / "global_step_x").mkdir()
    rd.removing_dir(tmp_path, 4).mkdir()
    assert rd.saved_steps(tmp_path) == [2, 10, 100]  # by number, not by name
    assert rd.removing_leftovers(tmp_path) == [rd.removing_dir(tmp_path, 4)]
    assert sorted(p.name for p in tmp_path.glob(rd.STEP_GLOB)) == [
        "global_step_10", "global_step_100", "global_step_2", "global_step_7", "global_step_x"
    ]  # fmt: skip


def test_the_tracker_is_written_whole_and_read_as_verl_reads_it(tmp_path: Path, monkeypatch):
    assert rd.tracked_step(tmp_path) is None and rd.tracked_step(tmp_path / "missing") is None
    rd.write_tracker(tmp_path, 40)
    assert rd.tracker_path(tmp_path).read_text() == "40"  # verl: int(open(tracker).read())
    assert rd.tracked_step(tmp_path) == 40
    rd.write_tracker(tmp_path, 60)
    assert rd.tracked_step(tmp_path) == 60
    assert [p.name for p in tmp_path.iterdir()] == [rd.TRACKER]  # no temporary file left
    for text in ("", "  7\n", "seven", "-3", "²"):
        rd.tracker_path(tmp_path).write_text(text)
        assert rd.tracked_step(tmp_path) == (7 if text.strip() == "7" else None), text
    rd.write_tracker(tmp_path, 20)
    monkeypatch.setattr("os.replace", lambda *_: 1 / 0)  # a failed write leaves the old one
    with pytest.raises(ZeroDivisionError):
        rd.write_tracker(tmp_path, 40)
    assert rd.tracked_step(tmp_path) == 20 and [p.name for p in tmp_path.iterdir()] == [rd.TRACKER]
    monkeypatch.undo()
    rd.clear_tracker(tmp_path)
    rd.clear_tracker(tmp_path)
    assert not rd.tracker_path(tmp_path).exists()


def test_a_checkpoints_stamp_and_sick_mark_the_kept_best_and_the_watchdog_log(tmp_path: Path):
    assert rd.read_stamp(tmp_path, 5) is None and not rd.is_sick(tmp_path, 5)
    rd.step_dir(tmp_path, 5).mkdir()
    rd.write_stamp(tmp_path, 5, "20261125T101500Z")
    assert rd.stamp_path(tmp_path, 5).read_text() == "20261125T101500Z\n"
    assert rd.read_stamp(tmp_path, 5) == "20261125T101500Z"
    rd.stamp_path(tmp_path, 5).write_text("\n")
    assert rd.read_stamp(tmp_path, 5) is None
    rd.mark_sick(tmp_path, 5, {"step": 6, "rule": "non_finite"})
    sick = json.loads(rd.sick_path(tmp_path, 5).read_text())
    assert rd.is_sick(tmp_path, 5) and sick["step"] == 6
    rd.clear_sick(tmp_path, 5)
    rd.clear_sick(tmp_path, 5)
    assert not rd.is_sick(tmp_path, 5)
    assert rd.read_best(tmp_path) is None
    rd.write_best(tmp_path, 40, "val-core/openai/gsm8k/acc/mean@1", 0.57, "20261125T101500Z")
    assert rd.read_best(tmp_path) == {
        "format": rd.BEST_FORMAT, "step": 40, "metric": "val-core/openai/gsm8k/acc/mean@1",
        "value": 0.57, "launch": "20261125T101500Z",
    }  # fmt: skip
    for text, why in (("{", "not readable JSON"), ('{"step": true, "value": 1}', "no integer")):
        rd.best_path(tmp_path).write_text(text)
        with pytest.raises(rd.BestError, match=why):
            rd.read_best(tmp_path)
    rd.drop_best(tmp_path)
    rd.drop_best(tmp_path)
    assert rd.read_best(tmp_path) is None and rd.read_trips(tmp_path) == []
    rd.append_trip(tmp_path, {"step": 3, "value": float("nan")})
    with open(rd.watchdog_path(tmp_path), "a") as handle:
        handle.write('{"step": 4, "val\n')  # an unreadable line
    rd.append_trip(tmp_path, {"step": 5, "value": 1.0})
    trips = rd.read_trips(tmp_path)
    assert [t["step"] for t in trips] == [3, 5] and math.isnan(trips[0]["value"])


def launched(run: Path, stamp: str) -> None:
    for path in (rd.launch_record_path(run, stamp), rd.metrics_path(run, stamp)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


def test_the_launch_files(tmp_path: Path):
    stamps = ["20261125T101500Z", "20261124T090000Z"]
    for stamp in stamps:
        launched(tmp_path, stamp)
    assert [p.name for p in rd.launch_record_paths(tmp_path)] == [
        "launch-20261124T090000Z.yaml", "launch-20261125T101500Z.yaml"
    ]  # fmt: skip
    assert [rd.metrics_stamp(p) for p in rd.metrics_paths(tmp_path)] == sorted(stamps)
    assert rd.launch_record_paths(tmp_path / "x") == [] == rd.metrics_paths(tmp_path / "x")
    assert rd.metrics_stamp("/runs/a/metrics/metrics-20261125T101500Z.jsonl") == stamps[0]
    assert rd.metrics_stamp("/r/metrics/metrics.jsonl") is None is rd.metrics_stamp("")
    assert rd.STAMP.match(stamps[0]) and not rd.STAMP.match("2026-11-25")
    assert rd.console_log_path(tmp_path, stamps[0]) == tmp_path / f"logs/console-{stamps[0]}.log"
    assert rd.superseded_dir(tmp_path, stamps[0]).name == f"superseded-{stamps[0]}"
    paths = [rd.stop_path, rd.timings_path, rd.lock_path, rd.session_path, rd.best_path,
             rd.watchdog_path, rd.tracker_path]  # fmt: skip
    made = [path(tmp_path) for path in paths]
    assert all(p.parent == tmp_path for p in made) and len(set(made)) == len(made)
    assert [p.name for p in made[:4]] == [rd.STOP_FILE, rd.TIMINGS_FILE, rd.LOCK_FILE,
                                          rd.SESSION_FILE]  # fmt: skip


def test_a_stamp_an_earlier_launch_used_is_never_given_again(tmp_path: Path):
    now = rd.new_stamp()
    launched(tmp_path, now)
    stamp = rd.unused_stamp(tmp_path)
    assert stamp != now and stamp > now


def test_logged_rows_merge_a_steps_lines_and_take_each_metric_from_the_last_launch(tmp_path):
    launches = {
        "20261128T000000Z": [(1, {"loss": 1.0}), (2, {"loss": 2.0}), (3, {"loss": 3.0}),
                             (3, {"val/acc": 0.3})],
        "20261128T010000Z": [(2, {"loss": 2.5}), (3, {"loss": 3.5})],
        "20261128T020000Z": [(3, {"val/acc": 0.4})],  # resumed from step 3: its validation
    }  # fmt: skip
    for stamp, rows in launches.items():
        path = rd.metrics_path(tmp_path, stamp)
        path.parent.mkdir(exist_ok=True)
        lines = [json.dumps({"step": step, "data": data}) for step, data in rows]
        path.write_text("\n".join(lines) + '\n{"step": 4, "da')  # a line cut by a kill
    first = rd.metrics_path(tmp_path, "20261128T000000Z")
    with first.open("a") as handle:  # what a shared folder may hold: no traceback, one line each
        handle.write(
            '\n{"step": ' + "9" * 400 + ', "data": {}}\n[1]\n{"step": true, "data": {}}'
            '\n{"step": 5, "data": {"loss": 5.0}}\n'
        )
    issues: list[str] = []
    assert rd.logged_rows(tmp_path, issues) == {
        1: {"loss": 1.0}, 2: {"loss": 2.5}, 3: {"loss": 3.5, "val/acc": 0.4}, 5: {"loss": 5.0},
    }  # fmt: skip
    assert [i.split(": ", 1)[0].rsplit("/", 1)[1] for i in issues] == [
        f"{first.name}:5", f"{first.name}:6", f"{first.name}:7", f"{first.name}:8",
        "metrics-20261128T010000Z.jsonl:3", "metrics-20261128T020000Z.jsonl:2",
    ]  # fmt: skip
    assert "invalid JSON" in issues[0] and "not a {" in issues[1] and "truncated last" in issues[4]
    empty = rd.metrics_path(tmp_path, "20261128T030000Z")
    empty.write_text("\n")
    rd.logged_rows(tmp_path, issues)
    assert issues[-1] == f"{empty}: empty file"


def test_dump_files_are_the_steps_of_a_folder_in_order(tmp_path: Path):
    assert rd.dump_files(tmp_path, rd.VALIDATION_DIR) == {}
    folder = tmp_path / rd.VALIDATION_DIR
    folder.mkdir()
    for name in ("10", "2", "notes", "3.tmp", "9" * 13, "\u0663"):  # \u0663: an Arabic 3
        (folder / f"{name}.jsonl").write_text("{}")
    (folder / "5.jsonl").mkdir()
    assert rd.dump_files(tmp_path, rd.VALIDATION_DIR) == {
        2: folder / "2.jsonl",
        10: folder / "10.jsonl",
    }

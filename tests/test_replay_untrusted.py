"""A run directory from someone else, copied from the learning runs (tests/learn_runs.py):
markup planted in every field creates no element in Chromium, a field of the wrong type is one
line, a trace belongs to its launch, the KL coefficient charged."""

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from browser import dom as chromium_dom

from verl_gsm8k.replay.load import load_trace
from verl_gsm8k.replay.pages import charged_kl_coef, write_pages

pytestmark = pytest.mark.slow  # the learning runs: made once per session, shared
STEP = 20  # a traced step of the fixture runs that has rollouts and a validation
PARTS = ("launches", "metrics", "trace", "rollouts", "validation")


def mark(field: str) -> str:
    """Markup that would become an element if set as HTML: ``<b id="pwned-FIELD">``."""
    return f"<b id=pwned-{field}>x</b><img src=x id=pwned-img-{field}>\"'&"


@pytest.fixture
def copy_run(request: pytest.FixtureRequest):
    """copy_run(dest, name): a copy of a learning run's trace, dumps and metrics."""

    def copy(tmp_path: Path, name: str = "learn_grpo") -> Path:
        source = request.getfixturevalue(name.replace("learn_", "learned_")).run_dir
        return _copy(source, tmp_path / name)

    return copy


def _copy(source: Path, run: Path) -> Path:
    for part in PARTS:
        if (source / part).is_dir():
            shutil.copytree(source / part, run / part)
    return run


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_lines(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids += [f"{tag}#{v}" for k, v in attrs if k == "id" and (v or "").startswith("pwned")]


def no_element_from_markup(dom: str) -> None:
    """No element of the DOM Chromium built carries a planted id; the planted text is there."""
    parser = _Ids()
    parser.feed(dom)
    assert parser.ids == [], parser.ids
    assert "&lt;b id=pwned" in dom  # the planted text did reach the page, as text


def _rewrite(path: Path, change) -> None:
    """Edit the payload of a page's data file (``window.X[key]={...};``) in place."""
    prefix, body = re.match(r"(.*?\]=)(.*);\n$", path.read_text(), re.S).groups()  # type: ignore[union-attr]
    payload = json.loads(body)
    change(payload)
    path.write_text(f"{prefix}{json.dumps(payload)};\n")


def test_markup_in_every_field_of_a_real_trace_creates_no_element(tmp_path: Path, copy_run):
    """Markup in every text field, then in every number field of the pages' data files."""
    run = copy_run(tmp_path)
    path = run / "trace" / f"{STEP}.jsonl"
    head, *samples = read_lines(path)
    for key in ("adv_estimator", "project", "model"):
        head["run"][key] = mark(f"run-{key}")
    head["run"]["kl"].update(estimator=mark("estimator"), controller=mark("controller"))
    for index, sample in enumerate(samples):
        sample.update(uid=mark("uid"), key=mark(f"key{index}"), data_source=mark("source"),
                      ground_truth=mark("gt"))  # fmt: skip
        sample["reward_extra"] = {k: mark(f"extra-{k}") for k in sample["reward_extra"]}
        sample["absent"] = {k: mark(f"absent-{k}") for k in sample["absent"]}
        sample["prompt"]["tokens"][0] = mark("prompt")
        sample["response"]["tokens"] = [mark(f"token{i}") for i in sample["response"]["tokens"]]
    write_lines(path, [head, *samples])
    for folder, step in (("rollouts", STEP), ("validation", 0), ("validation", STEP)):
        rows = read_lines(run / folder / f"{step}.jsonl")
        for row in rows:
            row.update(input=f"user\n{mark('question')}\nassistant\n", output=mark("response"),
                       gts=mark("gts"))  # fmt: skip
        write_lines(run / folder / f"{step}.jsonl", rows)
    trace = load_trace(run)
    assert STEP in trace.steps and trace.issues == []  # text fields may hold any text
    out = tmp_path / "out"
    pages = write_pages(run, trace, out)
    assert pages.replay and pages.rollouts

    def replay_step(payload: dict[str, Any]) -> None:
        payload["run"].update(rollout_n=mark("rollout_n"), gamma=mark("gamma"))
        payload["kl_coef"] = mark("kl_coef")
        payload["metrics"] = {mark("metric"): mark("metric-value"), "actor/pg_loss": mark("pg")}
        for sample in payload["samples"]:
            sample["ids"] = [mark("id")] * len(sample["ids"])
            sample["score"] = mark("score")
            sample["pt"]["advantage"] = [mark("adv")] * len(sample["tokens"])

    _rewrite(out / "replay" / f"step-{STEP}.js", replay_step)
    marked = {"n": mark("n"), "clip": 1, "s": mark("s")}
    _rewrite(out / "rollouts" / f"train-{STEP}.js",
             lambda payload: [row.update(marked) for row in payload["rows"]])  # fmt: skip
    _rewrite(out / "rollouts" / "index.js", lambda index: index.update(limit=mark("limit")))
    replay = chromium_dom(f"{pages.replay.as_uri()}#step={STEP}&sample=1&token=0", tmp_path)
    no_element_from_markup(replay)
    assert 'id="group-table"' in replay and "token 0" in replay.split('id="panel"', 1)[1]
    rollouts = chromium_dom(f"{pages.rollouts.as_uri()}#kind=train&step={STEP}", tmp_path)
    no_element_from_markup(rollouts)
    assert "cut at &lt;b id=pwned-limit" in rollouts
    no_element_from_markup(chromium_dom(f"{pages.rollouts.as_uri()}#kind=compare", tmp_path))


@pytest.mark.parametrize(("line", "where", "value", "field", "kind"), [
    (0, ("run", "rollout_n"), "8", "run.rollout_n", "int"),
    (0, ("run", "max_response_length"), [24], "run.max_response_length", "int"),
    (0, ("run", "kl", "coef"), "0.001", "run.kl.coef", "num"),
    (0, ("run", "kl"), "kl", "run.kl", "mapping"),
    (0, ("traced",), True, "traced", "int"),
    (0, ("metrics", "actor/pg_loss"), "<b>", "metrics.actor/pg_loss", "num"),
    (0, ("batch", "response_lengths", "k"), "24", "batch.response_lengths.k", "int"),
    (1, ("score",), "1.0", "score", "num"),
    (1, ("uid",), {"a": 1}, "uid", "str"),
    (1, ("response", "ids", 0), "<b>", "response.ids[0]", "int"),
    (1, ("response", "tokens", 2), None, "response.tokens[2]", "str"),
    (1, ("per_token", "advantage", 3), "0.5", "per_token.advantage[3]", "num"),
    (1, ("reward_extra", "acc"), [1], "reward_extra.acc", "scalar"),
    (1, ("absent", "value"), 0, "absent.value", "str"),
])  # fmt: skip
def test_a_field_of_the_wrong_type_is_one_line_naming_file_and_field(
    tmp_path: Path, copy_run, line, where, value, field, kind
):
    run = copy_run(tmp_path)
    path = run / "trace" / f"{STEP}.jsonl"
    lines = read_lines(path)
    target = lines[line]
    for part in where[:-1]:
        target = target[part]
    target[where[-1]] = value
    write_lines(path, lines)
    trace = load_trace(run)
    assert STEP not in trace.steps and len(trace.steps) == 19  # the rest is still read
    got = value.__class__.__name__ if value is not None else "null"
    assert trace.issues == [
        f"trace/{STEP}.jsonl: line {line + 1}: field {field} is a {got}, not a {kind}; step skipped"
    ]


def _relaunch(run: Path, stamp: str, steps: range) -> None:
    """A later launch into the same directory that wrote ``steps`` (its own metrics file)."""
    old = next((run / "metrics").glob("metrics-*.jsonl"))
    shutil.copy(old, run / "metrics" / f"metrics-{stamp}.jsonl")
    for step in steps:
        path = run / "trace" / f"{step}.jsonl"
        head, *samples = read_lines(path)
        head["run"]["metrics_file"] = f"metrics-{stamp}.jsonl"
        head["metrics"]["new-launch"] = 1.0
        write_lines(path, [head, *samples])


def test_a_trace_belongs_to_the_launch_that_wrote_it(tmp_path: Path, copy_run):
    # RESUME=disable: a new run of 5 steps into the old directory; steps 6-20 are the old run's
    fresh = copy_run(tmp_path / "fresh")
    _relaunch(fresh, "20991231T000000Z", range(1, 6))
    trace = load_trace(fresh)
    assert sorted(trace.steps) == [1, 2, 3, 4, 5]
    assert all("new-launch" in ts.head["metrics"] for ts in trace.steps.values())
    (issue,) = trace.issues
    assert issue.startswith("trace/: steps 6-20 (15 files) were written by an earlier launch")
    assert "replaced from step 1 by a later one (metrics-20991231T000000Z.jsonl)" in issue
    # a resumed run: the later launch went on from step 11, the earlier steps are still its run
    resumed = copy_run(tmp_path / "resumed")
    _relaunch(resumed, "20991231T000000Z", range(11, 21))
    trace = load_trace(resumed)
    assert sorted(trace.steps) == list(range(1, 21)) and trace.issues == []


def test_the_replay_shows_the_kl_coefficient_charged_at_that_step(tmp_path: Path, copy_run):
    run = copy_run(tmp_path, "learn_ppo")  # KL in the reward
    path = run / "trace" / f"{STEP}.jsonl"
    head, *samples = read_lines(path)
    assert head["run"]["kl"]["coef"] == 0.001
    head["run"]["kl"]["controller"] = "adaptive"  # as algorithm.kl_ctrl.type=adaptive records it
    head["metrics"]["actor/reward_kl_penalty_coeff"] = 0.0123
    write_lines(path, [head, *samples])
    trace = load_trace(run)
    assert charged_kl_coef(trace.steps[STEP].head) == 0.0123
    assert (
        charged_kl_coef(trace.steps[1].head)
        == trace.steps[1].head["metrics"]["actor/reward_kl_penalty_coeff"]
    )
    pages = write_pages(run, trace, tmp_path / "out")
    assert pages.replay
    dom = chromium_dom(f"{pages.replay.as_uri()}#step={STEP}&sample=0", tmp_path)
    kl = dom.split('id="kl-body"', 1)[1].split("</p>", 1)[0]
    assert "coefficient 0.0123 at this step (adaptive controller, initial 0.001)" in kl, kl

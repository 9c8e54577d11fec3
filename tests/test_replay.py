"""The replay page, the rollout browser and the trace's checks, on run directories written in the
trace's own format (real runs: tests/test_learn_cpu.py)."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
from browser import dom
from report_runs import SEGMENT, STAMP, build_run, write_jsonl

from verl_gsm8k.replay.checks import trace_checks
from verl_gsm8k.replay.load import load_trace
from verl_gsm8k.report import cli as report
from verl_gsm8k.trace.record import sample_line, step_line

TOKENS = ["2", " +", " ", "3", " =", " ", "5", "\n", "####", " ", "5", "<|im_end|>"]
WRONG = ["2", " +", " ", "3", " =", " ", "5", "<|im_end|>"]
TOOL_MASK = [1, 1, 0, 0, 0] + [1] * (len(TOKENS) - 5)  # a tool's reply: response mask 0
ROW = {"input": "user\nBetty has 2 apples and finds 3 more. How many?\nassistant\n", "gts": "5"}


def trace_sample(step: int, uid: str, session: int, tokens: list[str], score: float,
                 grpo: bool, adv: float, value: float | None = 0.5,
                 gap: float = 0.0, mask: list[int] | None = None) -> dict[str, Any]:  # fmt: skip
    n = len(tokens)
    per_token: dict[str, list[float]] = {
        "rollout_log_prob": [-0.1 - gap] * n, "old_log_prob": [-0.1] * n,
        "ref_log_prob": [-0.12] * n, "kl": [0.02] * n,
        "score": [0.0] * (n - 1) + [score], "reward": [0.0] * (n - 1) + [score],
        "advantage": [adv] * n, "return": [score] * n,
    }  # fmt: skip
    absent = {"value": "no critic (algorithm.adv_estimator=grpo)"} if grpo or value is None else {}
    if not absent:
        per_token["value"] = [value + 0.05 * i for i in range(n)]
    return sample_line(
        step=step, key=f"{uid}_{session}_0", uid=uid, session=session, prompt_ids=[1, 2],
        response_ids=list(range(10, 10 + n)), response_mask=mask or [1] * n, per_token=per_token,
        absent=absent, decode=lambda i: tokens[i - 10] if i >= 10 else "Q", ground_truth="5",
        data_source="openai/gsm8k",
        reward_extra={"acc": score, "format": float("####" in tokens), "hedged": 0.0},
    )  # fmt: skip


def write_run(root: Path, *, grpo: bool = False, steps: int = 6, **kw: Any) -> Path:
    """Metrics, a trace of ``steps`` 4-response steps, rollout and validation dumps."""
    run = root / "run"
    write_jsonl(run / SEGMENT, build_run()[: steps + 1])
    estimator = kw.get("estimator") or ("grpo" if grpo else "gae")
    settings = {"experiment": "run", "adv_estimator": estimator, "gamma": 1.0,
                "lam": 1.0, "norm_adv_by_std_in_grpo": True, "rollout_n": 4,
                "kl": {"in": "loss" if grpo else "reward", "estimator": "low_var_kl" if grpo
                       else "kl", "coef": 0.001},
                "max_response_length": 12, "metrics_file": f"metrics-{STAMP}.jsonl"}  # fmt: skip
    zero = kw.get("zero_spread")  # "all_min" / "all_max": every group without a spread
    for step in range(1, steps + 1):
        scores = [1.0, 0.0, 1.0, 1.0]
        samples = [
            trace_sample(step, f"p{step}", i, TOKENS if s else WRONG, s, grpo,
                         adv=0.6 if s else -1.7, value=kw.get("value", 0.5),
                         gap=kw.get("gap", 0.0), mask=kw.get("mask") if s else None)
            for i, s in enumerate(scores)
        ]  # fmt: skip
        if kw.get("flat"):
            for s in samples:
                s["per_token"]["value"] = [0.5] * len(s["response"]["ids"])
        head = step_line(step, settings, {"actor/pg_clipfrac": 0.01, "critic/vf_loss": 0.1}, 4, 16)
        same = 4 if zero else 1
        head["batch"] = {
            "groups": {"count": 4, "size": 4, "zero_spread": same,
                       "all_max": same if zero == "all_max" else 0,
                       "all_min": same if zero == "all_min" else 0,
                       "score_min": 0.0, "score_max": 1.0},
            "response_lengths": {s["key"]: len(s["response"]["ids"]) for s in samples},
        }  # fmt: skip
        write_jsonl(run / "trace" / f"{step}.jsonl", [head, *samples])
        rows = [{**ROW, "output": "".join(s["response"]["tokens"][:-1]), "score": s["score"],
                 "step": step, "uid": s["key"]} for s in samples]  # fmt: skip
        write_jsonl(run / "rollouts" / f"{step}.jsonl", rows)
    for step, output in ((0, "2 + 3 = 5"), (steps, "2 + 3 = 5\n#### 5")):
        acc = float("####" in output)
        row = {**ROW, "output": output, "score": acc, "step": step, "acc": acc, "hedged": 0.0}
        write_jsonl(run / "validation" / f"{step}.jsonl", [row])
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, kw in (("ppo", {}), ("grpo", {"grpo": True}),
                     ("remax", {"grpo": True, "estimator": "remax"})):  # fmt: skip
        run = write_run(tmp_path_factory.mktemp(name), **kw)
        out[name] = report.generate(run, run / "report").out_dir
    return out


def test_replay_page_shows_the_loop_for_a_grpo_group(runs: dict[str, Path], tmp_path: Path):
    summary = json.loads((runs["grpo"] / "summary.json").read_text())
    assert summary["pages"] == {"replay": "replay.html", "rollouts": "rollouts.html",
                                "questions": "questions/questions.html", "issues": []}  # fmt: skip
    page = runs["grpo"] / "replay.html"
    shown = dom(f"{page.as_uri()}#step=3&sample=1&token=6", tmp_path)
    tokens = re.findall(r'<span class="tok[^"]*" tabindex="0" data-i="(\d+)" data-adv="([^"]*)" '
                        r'style="background:\s*([^";]+)', shown)  # fmt: skip
    assert [int(i) for i, _, _ in tokens] == list(range(len(WRONG)))  # sample 1: the wrong one
    assert {adv for _, adv, _ in tokens} == {"-1.7"}  # the deepest red of the step's scale:
    assert tokens[0][2].replace(" ", "") == "rgb(215,48,39)"
    panel = shown.split('id="panel"', 1)[1]
    assert "token 6" in panel and 'data-num="advantage">-1.7<' in panel
    assert "absent in this run: no critic" in shown  # GRPO: no value, said so
    assert 'id="group-mean">0.75<' in shown and 'id="group-std">0.5<' in shown
    group = shown.split('id="group-table"')[1]
    assert len(re.findall(r"<tr[^>]*><td>\d+</td><td><code>", group)) == 4
    assert "No <code>####</code> line" in shown  # the wrong response's reward, explained
    assert "actor/pg_clipfrac" in shown.split('id="update-table"')[1]
    default = dom(page.as_uri(), tmp_path)  # no fragment: an informative sample
    assert 'selected="">#0 score 1' in default and "step 6" in default


def test_the_replay_says_how_gae_and_remax_compute_the_advantage(runs, tmp_path):
    """ReMax's baseline is a greedy response's score (compute_remax_outcome_advantage)."""
    assert "whitened over the whole batch" in dom(runs["ppo"] / "replay.html", tmp_path)
    how = dom(runs["remax"] / "replay.html", tmp_path).split('id="adv-body"', 1)[1]
    how = how.split("</p>", 1)[0]
    assert "score of one greedy response to the same prompt" in how and "group" not in how, how


def test_rollout_browser_filters_and_compares_first_and_last_validation(runs, tmp_path):
    page = (runs["ppo"] / "rollouts.html").as_uri()
    shown = dom(f"{page}#kind=train&step=2&filter=nomarker", tmp_path)
    assert shown.count('<tr class="row">') == 1 and "no ####" in shown and "1 of 4" in shown
    clipped = dom(f"{page}#kind=train&step=2&filter=clipped", tmp_path)
    assert "3 of 4 responses" in clipped and clipped.count("cut at 12 tokens") == 3
    compare = dom(f"{page}#kind=compare", tmp_path)
    assert "1 changed between step 0 and step 6" in compare
    assert compare.count('<tr class="row">') == 1


def test_bad_trace_inputs_are_one_line_each_and_the_report_still_renders(tmp_path, capsys):
    run = write_run(tmp_path, steps=4)
    trace = run / "trace"
    (trace / "2.jsonl").write_text((trace / "2.jsonl").read_text()[:300])  # cut short
    foreign = json.loads((trace / "3.jsonl").read_text().splitlines()[0])
    foreign["run"]["metrics_file"] = "metrics-20990101T000000Z.jsonl"
    lines = (trace / "3.jsonl").read_text().splitlines()
    (trace / "3.jsonl").write_text("\n".join([json.dumps(foreign), *lines[1:]]) + "\n")
    loaded = load_trace(run)
    assert sorted(loaded.steps) == [1, 4]
    assert loaded.issues == [
        "trace/2.jsonl: line 1 is not JSON (a file cut short?); step skipped",
        "trace/3.jsonl: a trace of another run (its metrics file "
        "metrics-20990101T000000Z.jsonl is not one of this run's); step skipped",
    ]
    assert report.main([str(run), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [x for x in err if "trace/" in x] == [f"verl_gsm8k.report: warning: {issue}"
                                                 for issue in loaded.issues]  # fmt: skip
    assert (tmp_path / "out" / "replay.html").is_file()
    for path in trace.iterdir():
        path.unlink()
    assert report.main([str(run), "--out", str(tmp_path / "bare"), "--quiet"]) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "trace" in x]
    assert "no per-token trace" in line and "no replay page" in line
    assert not (tmp_path / "bare" / "replay.html").exists()
    page = (tmp_path / "bare" / "report.html").read_text()
    assert 'id="rollouts-link"' in page and 'id="replay-link"' not in page


@pytest.mark.parametrize(("kw", "check", "severity"), [
    ({"flat": True}, "critic_flat", "warning"),
    ({"grpo": True, "zero_spread": "all_min"}, "grpo_zero_spread", "warning"),
    ({"grpo": True, "zero_spread": "all_max"}, "grpo_zero_spread", "note"),
    ({"gap": 0.3}, "trace_prob_gap", "warning"),
])  # fmt: skip
def test_trace_checks_fire_on_their_pathology(tmp_path: Path, kw, check, severity):
    findings = trace_checks(load_trace(write_run(tmp_path, **kw)))
    assert [(f.check, f.severity, f.start_step, f.end_step) for f in findings] == [
        (check, severity, 1, 6)]  # fmt: skip


def test_a_tool_replys_tokens_make_no_probability_gap(tmp_path: Path):  # vLLM sampled none
    run = write_run(tmp_path, gap=0.3, mask=TOOL_MASK)
    for path in (run / "trace").iterdir():
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        for s in (x for x in lines if x.get("kind") == "sample"):
            pt, mask = s["per_token"], s["response"]["mask"]
            pairs = zip(pt["rollout_log_prob"], pt["old_log_prob"], mask, strict=True)
            pt["rollout_log_prob"] = [o if m else r for r, o, m in pairs]
        write_jsonl(path, lines)
    assert trace_checks(load_trace(run)) == []


def test_trace_checks_stay_quiet_on_a_healthy_trace(runs: dict[str, Path]):
    for name in ("ppo", "grpo"):
        health = json.loads((runs[name] / "summary.json").read_text())["health"]
        assert not {"critic_flat", "grpo_zero_spread", "trace_prob_gap"} & {
            f["check"] for f in health}, name  # fmt: skip


def test_the_tokens_that_carried_no_loss_are_marked(tmp_path: Path):
    run = write_run(tmp_path / "tool", grpo=True, steps=1, mask=TOOL_MASK)
    page = report.generate(run, run / "report").out_dir / "replay.html"
    shown = dom(f"{page.as_uri()}#step=1&sample=0&token=3", tmp_path)
    marked = re.findall(r'<span class="tok([^"]*)" tabindex="0" data-i="(\d+)"', shown)
    assert [int(i) for kind, i in marked if "noloss" in kind] == [2, 3, 4]
    assert "<b>no loss</b> (response mask 0" in shown.split('id="panel"', 1)[1]

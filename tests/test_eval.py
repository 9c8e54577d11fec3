"""scripts/eval.sh over an OpenAI stub (also vllm serve's stand-in) right on 2 of 3; the
transformers backend and a real vllm serve (slow)."""

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import ROOT, capture, refusing_port, require_path
from openai_stub import StubServer

from data_prep.gsm8k import PROMPT_STYLES, build_prompt
from verl_gsm8k.common.launch_record import write_record
from verl_gsm8k.common.procs import alive
from verl_gsm8k.common.run_dir import write_best
from verl_gsm8k.evaluate import cli as ev
from verl_gsm8k.evaluate import scoring
from verl_gsm8k.evaluate.render import render_markdown, render_steps
from verl_gsm8k.evaluate.server import served
from verl_gsm8k.evaluate.settings import EvalError, ModelSpec
from verl_gsm8k.evaluate.sweep import earlier_rows, kept_best

EVAL_PYTHON = Path(os.environ.get("EVAL_PYTHON", ROOT / ".venv-eval" / "bin" / "python"))
TEST_ROWS = [  # plain integer answers; five train rows for the 4-shot mode
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "3+4=<<3+4=7>>7\n#### 7"),
    ("A box holds 6 pens. How many pens are in 5 boxes?", "6*5=<<6*5=30>>30\n#### 30"),
    ("Mia had 20 dollars and spent 8. How many dollars are left?", "20-8=<<20-8=12>>12\n#### 12"),
]
TRAIN_ROWS = [(f"Train question {i}: what is {i} plus {i}?", f"{i}+{i}={2 * i}\n#### {2 * i}")
              for i in range(1, 6)]  # fmt: skip
STUB_ANSWERS = {  # right for the first two questions, wrong for the third
    TEST_ROWS[0][0]: "He has 3 + 4 = 7 apples.\n#### 7",
    TEST_ROWS[1][0]: "Five boxes hold 6 * 5 = 30 pens.\n#### 30",
    TEST_ROWS[2][0]: "She has 20 - 8 = 11 dollars left.\n#### 11",
}


@pytest.fixture(scope="session")
def eval_env() -> Path:
    return require_path(EVAL_PYTHON, f"no EvalScope environment at {EVAL_PYTHON} (make setup)")


@pytest.fixture
def small_gsm8k(tmp_path) -> Path:
    (tmp_path / "gsm8k").mkdir()
    for name, rows in (("test", TEST_ROWS), ("train", TRAIN_ROWS)):
        lines = [json.dumps({"question": q, "answer": a}) for q, a in rows]
        (tmp_path / "gsm8k" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "gsm8k"


@pytest.fixture
def model(tmp_path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return tmp_path / "model"


def fake_vllm(folder: Path, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    (script := folder / "fake-vllm").write_text(f"#!/usr/bin/env bash\n{body}\n")
    script.chmod(0o755)
    return script


def hanging_vllm(folder: Path, child: Path) -> Path:
    """A fake vllm that starts a child (its pid in ``child``) and never answers."""
    return fake_vllm(folder, f'sleep 300 & echo $! > "{child}.tmp"; mv "{child}.tmp" "{child}"; '
                     "echo loading; wait")  # fmt: skip


def stub_vllm(tmp_path: Path, before: str = "") -> tuple[Path, dict[str, str]]:
    (tmp_path / "answers.json").write_text(json.dumps(STUB_ANSWERS))
    env = {"OPENAI_STUB_ANSWERS": str(tmp_path / "answers.json"),
           "OPENAI_STUB_PID_FILE": str(tmp_path / "server.pid")}  # fmt: skip
    stub = Path(__file__).resolve().parent / "openai_stub.py"
    return fake_vllm(tmp_path, f'{before}\nexec "{sys.executable}" "{stub}" "$@"'), env


def run_eval(*args, env: dict | None = None, popen: bool = False, code: int | None = 0, **kwargs):
    cmd = ["bash", str(ROOT / "scripts" / "eval.sh"), *map(str, args)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})}
    if popen:
        return subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, **kwargs)
    return capture(cmd, code, 900, env=env)


def rows_of(out: Path) -> tuple[dict, dict]:
    summary = json.loads((out / "comparison.json").read_text())
    return summary, {(r["model"], r["mode"]): r for r in summary["results"]}


@pytest.mark.parametrize(
    ("args", "said"),
    [("{base} --data {tmp}/nowhere", "--data"), ("{base} --modes training,x", "mode 'x'"),
     ("{base} --api-url http://127.0.0.1:9/v1", "--api-url and --api-model go together"),
     ("{base} --samples-per-question 2 --temperature 0", "--temperature must be > 0"),
     ("{base} --samples-per-question 2 --top-k 0", "--top-k must be -1"),
     ("{base} --model ppo={tmp}/modle", "--model {tmp}/modle: model not found"),
     ("{base} --model Qwen/No-Such-Model-Here", "--model Qwen/No-Such-Model-Here: cannot get"),
     ("--run {tmp}", "no launch record"), ("--run {tmp} {base}", "not with --model"),
     ("--run {tmp}/nowhere", "not a directory"),
     ("{base} --api-url 127.0.0.1:8/v1 --api-model m", "127.0.0.1:8/v1: not an http(s) URL"),
     ("{base} --api-url {refused} --api-model m", "{refused}: connection refused"),
     ("{base} --api-url {html} --api-model m", "{html}: GET {html}/models did not answer JSON"),
     ("{base} --api-url {json} --api-model m", "{json}: GET {json}/models answered JSON that is "
      "not an OpenAI model list"), ("{base} --api-url {other} --api-model m", "{other}: the "
      "server does not serve 'm' (it lists: other)")],
)  # fmt: skip
def test_a_refusal_is_one_line_exit_2_and_writes_nothing(args, said, model, small_gsm8k, tmp_path,
                                                         capsys, monkeypatch):  # fmt: skip
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with (refusing_port() as port, StubServer({}, body=b"<html>") as html,
          StubServer({}, body=b"{}") as js, StubServer({}, "other") as other):  # fmt: skip
        base = f"--model {model} --backend transformers --data {small_gsm8k}"
        names = {"tmp": tmp_path, "refused": f"http://127.0.0.1:{port}/v1", "html": html.url,
                 "json": js.url, "other": other.url, "base": base}  # fmt: skip
        started = time.monotonic()
        assert ev.main([*args.format(**names).split(), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("eval.sh: "), err
    assert said.format(**names) in err and time.monotonic() - started < 30, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "checkpoint_eval").exists()


def test_the_entry_point_names_a_missing_environment(tmp_path):
    proc = run_eval("--help", env={"EVAL_PYTHON": str(tmp_path / "no-python")}, code=2)
    assert "setup.sh --eval" in proc.stderr


def test_served_and_api_models_score_exactly_and_a_crashed_server_is_one_row(
    eval_env, model, small_gsm8k, tmp_path
):
    """ppo: the stub as vllm serve; broken: a server dying at start; the stub at --api-url."""
    crash = 'if [[ "$*" == *broken* ]]; then echo "ValueError: fake CUDA out of memory"; exit 3; fi'
    fake, env = stub_vllm(tmp_path, crash)
    out = tmp_path / "eval"
    with StubServer(STUB_ANSWERS, model="stub-model") as stub:
        proc = run_eval("--backend", "vllm", "--vllm-bin", fake, "--model", f"ppo={model}",
                        "--model", f"broken={model}", "--api-url", stub.url, "--api-model",
                        "stub-model", "--data", small_gsm8k, "--max-tokens", 64,
                        "--batch-size", 2, "--out", out, env=env, code=1)  # fmt: skip
    summary, rows = rows_of(out)
    for (name, _), row in rows.items():
        if name == "broken":  # its rows say why, with its log's last lines
            assert "exited with code 3" in row["error"] and "fake CUDA out of" in row["error"]
            continue
        assert (row["n"], row["correct"], row["error"]) == (3, 2, None), row
        assert row["accuracy"] == pytest.approx(2 / 3, abs=1e-4)
        assert (row["backend"], row["delta_vs_baseline"]) == (
            ("vllm", None) if name == "ppo" else ("api", 0.0))  # fmt: skip
        assert all((out / row[key]).is_file() for key in ("report", "predictions", "samples"))
    training = rows["stub-model", "training"]
    assert [training[f"our_reward_{k}"] for k in ("accuracy", "format_rate", "delta_vs_baseline")] \
        == [pytest.approx(2 / 3), 1.0, 0.0]  # fmt: skip
    assert rows["ppo", "evalscope"]["our_reward_accuracy"] is None
    assert "| broken | training | failed |" in (out / "comparison.md").read_text()
    assert "server ready" in proc.stdout and "server stopped" in proc.stdout
    assert not alive(int((tmp_path / "server.pid").read_text()))
    assert "stub serving ppo" in (out / "logs" / "vllm-ppo.log").read_text()
    # greedy, repetition_penalty 1.0 (not generation_config's); our prompt, EvalScope's 4-shot one
    asked = {(r["temperature"], r["max_tokens"], r["repetition_penalty"]) for r in stub.requests}
    assert len(stub.requests) == 6 and asked == {(0, 64, 1.0)}
    prompts = {r["messages"][-1]["content"] for r in stub.requests}
    training_prompts = {build_prompt(q, "hash") for q, _ in TEST_ROWS}
    assert summary["modes"]["training"]["prompt_template"] == PROMPT_STYLES["hash"]
    assert training_prompts <= prompts and len(prompts - training_prompts) == 3
    assert all("\\boxed{}" in p and TRAIN_ROWS[3][0] in p and TRAIN_ROWS[4][0] not in p
               for p in prompts - training_prompts)  # fmt: skip
    samples = (out / training["samples"]).read_text()
    assert "#### 11" in samples and "our reward acc 0" in samples


def test_sampled_evaluation_reports_mean_and_pass_at_k(eval_env, small_gsm8k, tmp_path):
    out = tmp_path / "eval"
    with StubServer(STUB_ANSWERS, model="stub-model") as stub:
        run_eval("--api-url", stub.url, "--api-model", "stub-model", "--data", small_gsm8k,
                 "--modes", "training", "--samples-per-question", 3, "--temperature", 0.7,
                 "--out", out)  # fmt: skip
    asked = {(r["temperature"], r["top_p"], r["top_k"], r["max_tokens"]) for r in stub.requests}
    assert len(stub.requests) == 9 and asked == {(0.7, 1.0, -1, 1024)}
    row = rows_of(out)[1]["stub-model", "training"]
    assert (row["n"], row["generation"]["samples_per_question"]) == (3, 3)
    for key in ("accuracy", "pass_at_k", "our_reward_accuracy", "our_reward_pass_at_k"):
        assert row[key] == pytest.approx(2 / 3, abs=1e-4), key
    markdown = (out / "comparison.md").read_text()
    assert "sampled (3 answers per question, temperature 0.7" in markdown and "pass@k" in markdown
    assert "max_tokens 1024 (from the default (no --run, no --max-tokens))" in markdown
    assert "Comparable to this run's validation" not in markdown
    # a cell: the share of the K answers our reward credits
    page = json.loads((out / "questions" / "summary.json").read_text())
    assert page["columns"] == ["stub-model"] and page["sampled"] is True
    assert sorted(row["shares"][0] for row in page["rows"]) == [0.0, 1.0, 1.0]


def test_a_signal_stops_the_evaluation_and_its_server(eval_env, model, small_gsm8k, tmp_path):
    fake, env = stub_vllm(tmp_path)
    args = ["--backend", "vllm", "--model", model, "--data", small_gsm8k, "--modes", "training"]
    # a suite started in the background (`make test &`) inherits SIGINT ignored: restore it
    asking = run_eval(*args, "--vllm-bin", fake, "--out", tmp_path / "int", popen=True,
                      env={**env, "OPENAI_STUB_DELAY": "10"}, stderr=subprocess.PIPE,
                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    log, deadline = tmp_path / "int" / "logs" / "vllm-model.log", time.monotonic() + 120
    while "stub: answering" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and asking.poll() is None, "no request reached it"
        time.sleep(0.2)
    asking.send_signal(signal.SIGINT)
    assert asking.wait(timeout=120) == 130
    assert "interrupted; servers stopped" in asking.stderr.read()
    assert not alive(int((tmp_path / "server.pid").read_text()))
    assert not (tmp_path / "int" / "comparison.json").exists()
    child = tmp_path / "child.pid"
    hang = hanging_vllm(tmp_path / "hang", child)
    waiting = run_eval(*args, "--vllm-bin", hang, "--out", tmp_path / "term", popen=True,
                       stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 60
    while not child.exists():
        assert time.monotonic() < deadline, "the fake server never started"
        time.sleep(0.2)
    waiting.send_signal(signal.SIGTERM)  # eval.sh exec'd the driver: this is its pid
    assert waiting.wait(timeout=60) == 128 + signal.SIGTERM
    assert "interrupted" in waiting.stderr.read() and not alive(int(child.read_text()))


def test_a_server_that_never_answers_times_out_and_its_group_is_gone(tmp_path):
    child = tmp_path / "child.pid"
    settings = ev.Settings(["training"], "vllm", "d", tmp_path, 8, "x", server_timeout=3,
                           vllm_bin=str(hanging_vllm(tmp_path, child)))  # fmt: skip
    started = time.monotonic()
    with pytest.raises(EvalError, match=r"did not answer .* within 3 s(.|\n)*\nloading"):
        served(ModelSpec("m", "m", path=str(tmp_path)), settings).__enter__()
    assert not alive(int(child.read_text())) and time.monotonic() - started < 60


@pytest.mark.slow
def test_the_transformers_backend_evaluates_and_a_failing_model_is_one_line(
    eval_env, tiny_model_dir, shared_gsm8k_dir, tmp_path
):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")  # a directory, but no model_type
    out = tmp_path / "eval"
    proc = run_eval("--model", f"base={tiny_model_dir}", "--model", tmp_path / "broken", "--data",
                    shared_gsm8k_dir, "--limit", 3, "--max-tokens", 8, "--backend",
                    "transformers", "--out", out, code=1)  # fmt: skip
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    summary, rows = rows_of(out)
    pin = re.search(r'"evalscope==([^"]+)"', (ROOT / "pyproject.toml").read_text())[1]
    assert (summary["evalscope_version"], summary["data"]["n_test"], summary["limit"]) == (
        pin, 1319, 3)  # fmt: skip
    assert summary["modes"]["evalscope"]["few_shot"] == 4
    said = [x.split(" failed: ")[1] for x in proc.stderr.splitlines() if "broken /" in x]
    assert said == [rows["broken", m]["error"] for m in ("training", "evalscope")], proc.stderr
    for mode in ("training", "evalscope"):
        row, log = rows["base", mode], out / "logs" / f"evalscope-broken-{mode}.log"
        assert (row["error"], row["n"], row["errored"], row["backend"]) == (
            None, 3, 0, "transformers")  # fmt: skip
        assert row["generation"]["max_tokens"] == 8 and 0 <= row["accuracy"] <= 1
        assert rows["broken", mode]["error"].startswith("ValueError: Unrecognized model")
        assert rows["broken", mode]["error"].endswith(f"(full log: {log})")
        assert "Traceback (most recent call last)" in log.read_text()
    train = rows["base", "training"]
    assert train["our_reward_n"] == 3 and 0 <= train["our_reward_accuracy"] <= 1
    records = map(json.loads, (out / train["predictions"]).read_text().splitlines())
    record = next(r for r in records if r["index"] == 0)
    question = json.loads((shared_gsm8k_dir / "test.jsonl").read_text().splitlines()[0])
    assert scoring.said(record, "user") == build_prompt(question["question"], "hash")
    assert re.search(r"\| base \(baseline\) \| training \| [0-9.]+ \| 3 \|",
                     (out / "comparison.md").read_text())  # fmt: skip
    assert "## test #0" in (out / "samples" / "base-training.md").read_text()


@pytest.mark.slow
def test_real_vllm_evaluates_and_its_engine_ends_with_a_sigkilled_evaluation(
    eval_env, tiny_model_dir, small_gsm8k, tmp_path
):
    """A SIGKILL reaches no handler: vllm serve and its engine end by parent-death signal."""
    killed = run_eval("--model", f"tiny={tiny_model_dir}", "--backend", "vllm", "--data",
                      small_gsm8k, "--max-tokens", 16, "--vllm-args",
                      "--dtype float32 --max-model-len 1024 --enforce-eager", "--out",
                      tmp_path / "eval", popen=True, stderr=subprocess.DEVNULL,
                      env={"VLLM_CPU_KVCACHE_SPACE": "1",
                           "VLLM_CPU_OMP_THREADS_BIND": "nobind"})  # fmt: skip
    family: list[psutil.Process] = []
    try:
        said = ""
        for line in killed.stdout:  # the training mode done, the server up for evalscope mode's
            said += line
            if "evaluating tiny in evalscope mode (vllm)" in line:
                break
        assert "tiny / training: accuracy" in said and "(n=3)" in said, said
        log = (tmp_path / "eval" / "logs" / "vllm-tiny.log").read_text()
        assert "Application startup complete" in log or "Uvicorn running" in log, log[-2000:]
        servers = [c for c in psutil.Process(killed.pid).children() if "serve" in c.cmdline()]
        family = servers + [d for c in servers for d in c.children(recursive=True)]
        assert any("EngineCore" in p.name() + " ".join(p.cmdline()) for p in family), family
        killed.kill()  # eval.sh exec'd the driver: this is its pid
        killed.wait(timeout=60)
        assert not psutil.wait_procs(family, timeout=60)[1], "outlived a SIGKILLed evaluation"
    finally:
        killed.kill()
        for orphan in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                orphan.kill()


def prediction(index: int, question: str, text: str | list) -> dict:
    """One line of EvalScope 1.14.1's predictions/<model>/gsm8k_main.jsonl; its messages' answer
    is PREDICTION's, whatever ``text`` (model_output) says."""
    return {"index": index,
            "model_output": {"choices": [{"message": {"role": "assistant", "content": text}}]},
            "messages": [{"role": "user", "content": build_prompt(question, "hash")},
                         {"role": "assistant", "content": "6*5=30\n#### 30"}]}  # fmt: skip


PREDICTION = prediction(1, TEST_ROWS[1][0], "6*5=30\n#### 30")


def predictions(tmp_path: Path, answers: list[tuple[int, str]], rows: list[dict]) -> Path:
    lines = [json.dumps(prediction(i, rows[i]["question"], text)) for i, text in answers]
    (tmp_path / "pred.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "pred.jsonl"


def test_answers_are_read_matched_and_rescored_with_unbiased_pass_at_k(tmp_path, capsys):
    parts = prediction(1, TEST_ROWS[1][0], [{"type": "text", "text": "x"}])
    assert [scoring.said(r, "assistant") for r in (PREDICTION, parts)] == ["6*5=30\n#### 30", "x"]
    assert scoring.said({**PREDICTION, "model_output": None}, "assistant") == "6*5=30\n#### 30"
    rows = [{"question": q, "answer": a} for q, a in TEST_ROWS]
    assert scoring.match_row(PREDICTION, rows) is rows[1]
    assert scoring.match_row({**PREDICTION, "index": 0}, rows) is rows[1]  # text over index
    answers = [(i, STUB_ANSWERS[q]) for i, (q, _) in enumerate(TEST_ROWS)]
    fields, per_index = scoring.rescore(predictions(tmp_path, answers, rows), rows)
    assert fields == {"our_reward_accuracy": pytest.approx(2 / 3), "our_reward_format_rate": 1.0,
                      "our_reward_n": 3}  # fmt: skip
    assert [per_index[i]["acc"] for i in range(3)] == [1.0, 1.0, 0.0]
    # the same text twice stays two questions; one with fewer than k answers is left out, named
    twice = [rows[0], dict(rows[0]), rows[1]]
    right, wrong = STUB_ANSWERS[TEST_ROWS[0][0]], "#### 987654"
    sampled = [(0, right), (0, wrong), (0, wrong), (1, wrong), (1, wrong), (1, wrong), (2, right)]
    fields, _ = scoring.rescore(predictions(tmp_path, sampled, twice), twice, k=2)
    # row 0: n=3, c=1: 1 - C(2,2)/C(3,2) = 2/3; row 1: 0; row 2: 1 answer < k
    assert fields["our_reward_pass_at_k"] == pytest.approx((2 / 3 + 0.0) / 2)
    assert (fields["our_reward_n"], fields["our_reward_short_questions"]) == (3, [2])
    assert "fewer than 2 scored answers" in capsys.readouterr().err
    assert scoring.pass_at_k([1.0, 0.0, 0.0, 0.0], 2) == pytest.approx(1 - 3 / 6)


def test_labels_the_baseline_and_deltas_in_the_same_mode():
    specs = ev.parse_model_specs(["Qwen/Qwen2.5-0.5B-Instruct", "ppo=/runs/a/merged", "/x/merged"])
    assert [s.label for s in specs] == ["Qwen2.5-0.5B-Instruct", "ppo", "merged"]
    assert ev.parse_model_specs(["/a/m", "/b/m", "/c/m"])[2].label == "m-3"
    assert [ev.pick_baseline(specs, w) for w in (None, "ppo", "/x/merged", "/x/../x/merged")] \
        == ["Qwen2.5-0.5B-Instruct", "ppo", "merged", "merged"]  # fmt: skip
    with pytest.raises(ev.UsageError):
        ev.pick_baseline(specs, "nope")
    results = [{"model": m, "mode": mode, "accuracy": a, "our_reward_accuracy": o}
               for m, mode, a, o in [("base", "training", 0.4, 0.38), ("base", "evalscope", 0.45,
                                     None), ("ppo", "training", 0.55, 0.56),
                                     ("ppo", "evalscope", 0.5, None)]]  # fmt: skip
    results.append({"model": "bad", "mode": "training", "accuracy": None, "error": "boom"})
    scoring.add_deltas(results, "base")
    assert [r["delta_vs_baseline"] for r in results] == [None, None, pytest.approx(0.15),
                                                         pytest.approx(0.05), None]  # fmt: skip
    assert results[2]["our_reward_delta_vs_baseline"] == pytest.approx(0.18)
    assert [r["our_reward_delta_vs_baseline"] for r in results[3:]] == [None, None]


def settings_of(*argv: str) -> ev.Settings:
    return ev.parse_settings(ev.build_parser().parse_args(
        ["--backend", "transformers", "--dtype", "float32", "--data", "d", *argv]))[0]  # fmt: skip


def test_a_run_is_evaluated_at_its_own_response_limit_and_the_page_says_so(tmp_path):
    for run, lengths in ((tmp_path / "run", (128, 256)), (tmp_path / "bad", ("long",))):
        for i, length in enumerate(lengths):
            config = {"data": {"max_response_length": length, "val_files": ["/x/test.parquet"]}}
            write_record(run, {"format": 1, "stamp": f"2026010{i + 1}T000000Z", "config": config})
    settings = settings_of("--run", str(tmp_path / "run"))
    record = tmp_path / "run" / "launches" / "launch-20260102T000000Z.yaml"
    assert (settings.max_tokens, settings.max_tokens_from) == (
        256, f"data.max_response_length of the run's launch record {record}")  # fmt: skip
    assert settings.comparable_to().startswith("Comparable to this run's validation")
    override = settings_of("--run", str(tmp_path / "run"), "--max-tokens", "64")
    plain = settings_of("--model", str(tmp_path))
    assert (override.max_tokens, override.max_tokens_from) == (64, "--max-tokens")
    assert (plain.max_tokens, plain.max_tokens_from) == (1024, ev.cfg.MAX_TOKENS_DEFAULT)
    for other in (override, plain):
        assert "only if that equals the run's data.max_response_length" in other.comparable_to()
    with pytest.raises(ev.UsageError, match="01T000000Z.yaml: data.max_response_length is 'l"):
        settings_of("--run", str(tmp_path / "bad"))
    assert settings_of("--run", str(tmp_path / "bad"), "--max-tokens", "32").max_tokens == 32
    row = {"model": "m", "mode": "training", "accuracy": 0.5, "n": 4, "backend": "api",
           "pass_at_k": 0.75, "our_reward_pass_at_k": 0.75}  # fmt: skip
    markdown = render_markdown({
        "evalscope_version": "1.14.1", "data": {"source": "d", "n_test": 4}, "baseline": "m",
        "generation": {**settings.generation(), "samples_per_question": 4, "temperature": 1.0},
        "modes": {}, "results": [row]})  # fmt: skip
    assert f"max_tokens 256 (from {settings.max_tokens_from})" in markdown
    assert "with replacement" in markdown and "1 - (1 - c/N)^N" in markdown
    assert "Do not compare pass@k with best@N" in markdown


def test_a_rerun_sweep_keeps_its_rows_refuses_other_settings_and_marks_the_best(tmp_path, capsys):
    base = settings_of("--model", "m", "--samples-per-question", "4")
    out, row = tmp_path / "sweep", {"step": 0, "mode": "training", "accuracy": 0.5, "error": None}
    out.mkdir()
    written = {"sweep": {"settings": base.key()}, "results": [row]}
    (out / "comparison.json").write_text(json.dumps(written))
    assert earlier_rows(out, base.key()) == [row]
    changes = {"top_p": 0.8, "top_k": 20, "temperature": 0.7, "max_tokens": 256, "repeats": 8,
               "limit": 5, "backend": "vllm", "dtype": "bfloat16", "data": "e"}  # fmt: skip
    for field, value in changes.items():
        with pytest.raises(ev.UsageError) as err:
            earlier_rows(out, dataclasses.replace(base, **{field: value}).key())
        name = {"repeats": "samples_per_question"}.get(field, field)
        assert "\n" not in str(err.value) and "would mix" in str(err.value)
        assert f"{name} " in str(err.value) and f"{value!r} now" in str(err.value), field
    greedy = dataclasses.replace(base, repeats=1, temperature=0.0)
    assert greedy.key() == dataclasses.replace(greedy, top_p=0.5, top_k=5).key()
    written["sweep"]["settings"].pop("top_k")
    (out / "comparison.json").write_text(json.dumps(written))
    with pytest.raises(ev.UsageError, match="top_k 'unrecorded' there, -1 now"):
        earlier_rows(out, base.key())
    rows = [{"step": s, "mode": "training", "accuracy": a, "our_reward_accuracy": a, "n": 100}
            for s, a in ((0, 0.4), (10, 0.57), (20, 0.55))]  # fmt: skip
    sweep = {"run_dir": str(tmp_path), "starting_model": "base", "best_checkpoint": None}
    assert kept_best(tmp_path) is None
    assert "best" not in render_steps({"sweep": sweep, "results": rows})
    write_best(tmp_path, 10, "val-core/openai/gsm8k/acc/mean@1", 0.57, "20260101T000000Z")
    markdown = render_steps({"sweep": {**sweep, "best_checkpoint": kept_best(tmp_path)},
                             "results": rows})  # fmt: skip
    assert [line for line in markdown.splitlines() if "best (" in line] == [
        "| 10 best (val acc 0.57) | training | 57.00 | 57.00 | 100 |"]  # fmt: skip
    assert f"`bash scripts/merge.sh {tmp_path} OUT --best` merges it" in markdown
    (tmp_path / "best_checkpoint.json").write_text("{")
    assert kept_best(tmp_path) is None
    (line,) = capsys.readouterr().err.splitlines()
    assert "best_checkpoint.json: not readable JSON" in line and "not marked" in line


def test_the_calculator_mode_serves_the_tool_and_scores_the_last_answer(
    eval_env, model, small_gsm8k, tmp_path
):
    call = {"id": "c1", "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "6*5"}'}}  # fmt: skip
    asks = {"role": "assistant", "content": "", "tool_calls": [call]}
    answers = {TEST_ROWS[0][0]: "#### 7", TEST_ROWS[1][0]: asks, TEST_ROWS[2][0]: "#### 11",
               "30": "#### 30"}  # fmt: skip
    fake, env = stub_vllm(tmp_path)
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    out = tmp_path / "eval"
    proc = run_eval("--backend", "vllm", "--vllm-bin", fake, "--model", f"ppo={model}",
                    "--data", small_gsm8k, "--modes", "training,calculator", "--out", out,
                    env=env)  # fmt: skip
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in proc.stdout
    _, rows = rows_of(out)
    tools = rows["ppo", "calculator"]
    assert (tools["n"], tools["tool_call_rate"], tools["accuracy_with_call"]) == (3, 1 / 3, 1.0)
    assert tools["accuracy"] == pytest.approx(2 / 3) and rows["ppo", "training"]["n"] == 3
    chats = [json.loads(line) for line in (out / tools["samples"]).read_text().splitlines()]
    roles = [m["role"] for m in chats[1]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    markdown = (out / "comparison.md").read_text()
    assert "| ppo (baseline) | calculator | 66.67 | 3 | 66.67 |" in markdown
    assert "- ppo / calculator: the tool called in 33.33% of the answers (100.00% right)" in (
        markdown)  # fmt: skip

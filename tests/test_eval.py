"""scripts/eval.sh: EvalScope runs on real components, and the driver's parsing.

* the transformers backend evaluates the tiny model on 3 real GSM8K test questions (both modes);
* the API path evaluates an OpenAI-compatible stub whose answers are known (2 of 3 right), so
  EvalScope's accuracy and our reward's re-score are checked against exact numbers;
* the vLLM backend's server handling (start, wait for /v1/models, always stop the process group,
  clear errors with the log tail) runs with the stub standing in for ``vllm serve``.

EvalScope runs in .venv-eval (built by ``bash scripts/setup.sh --eval``): those tests skip when it
is missing, and fail under CI=true.
"""

from __future__ import annotations

import contextlib
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
from helpers import refusing_port, require_path
from openai_stub import GarbageServer, StubServer

from data_prep.gsm8k import PROMPT_STYLES, build_prompt
from verl_gsm8k.evaluate import cli as ev
from verl_gsm8k.evaluate import scoring

ROOT = Path(__file__).resolve().parents[1]
EVAL_SH = ROOT / "scripts" / "eval.sh"
EVAL_PYTHON = Path(os.environ.get("EVAL_PYTHON", ROOT / ".venv-eval" / "bin" / "python"))
STUB = Path(__file__).resolve().parent / "openai_stub.py"


def pinned_evalscope() -> str:
    """The EvalScope release pinned in pyproject.toml's `eval` extra."""
    match = re.search(r'"evalscope==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert match, "no evalscope pin in pyproject.toml"
    return match.group(1)


@pytest.fixture(scope="session")
def eval_env() -> Path:
    message = f"no EvalScope environment at {EVAL_PYTHON} (bash scripts/setup.sh --eval)"
    return require_path(EVAL_PYTHON, message)


def run_eval(*args, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(EVAL_SH), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})},
    )


# Three test questions with plain integer answers, and four train rows for the 4-shot mode.
TEST_ROWS = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "3+4=<<3+4=7>>7\n#### 7"),
    ("A box holds 6 pens. How many pens are in 5 boxes?", "6*5=<<6*5=30>>30\n#### 30"),
    ("Mia had 20 dollars and spent 8. How many dollars are left?", "20-8=<<20-8=12>>12\n#### 12"),
]
TRAIN_ROWS = [
    (
        f"Train question {i}: what is {i} plus {i}?",
        f"{i}+{i}=<<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}",
    )
    for i in range(1, 6)
]
# What the stub answers: right for the first two questions, wrong for the third.
STUB_ANSWERS = {
    TEST_ROWS[0][0]: "He has 3 + 4 = 7 apples.\n#### 7",
    TEST_ROWS[1][0]: "Five boxes hold 6 * 5 = 30 pens.\n#### 30",
    TEST_ROWS[2][0]: "She has 20 - 8 = 11 dollars left.\n#### 11",
}


@pytest.fixture
def small_gsm8k(tmp_path) -> Path:
    data = tmp_path / "gsm8k"
    data.mkdir()
    for name, rows in (("test", TEST_ROWS), ("train", TRAIN_ROWS)):
        lines = [json.dumps({"question": q, "answer": a}) for q, a in rows]
        (data / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return data


def load_summary(out: Path) -> dict:
    summary = json.loads((out / "comparison.json").read_text())
    assert (out / "comparison.md").is_file()
    assert not list(out.glob(".comparison*.tmp"))
    return summary


def result(summary: dict, model: str, mode: str) -> dict:
    (row,) = [r for r in summary["results"] if r["model"] == model and r["mode"] == mode]
    return row


def check_row_files(out: Path, row: dict) -> None:
    for key in ("report", "predictions", "samples"):
        assert (out / row[key]).is_file(), (key, row[key])


# ---------------------------------------------------------------------------------------------
# Real EvalScope runs


@pytest.mark.slow
def test_transformers_backend_on_tiny_model(eval_env, tiny_model_dir, shared_gsm8k_dir, tmp_path):
    out = tmp_path / "eval"
    proc = run_eval(
        "--model", f"base={tiny_model_dir}", "--model", f"again={tiny_model_dir}",
        "--data", shared_gsm8k_dir, "--limit", 3, "--max-tokens", 8,
        "--backend", "transformers", "--out", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = load_summary(out)
    assert summary["evalscope_version"] == pinned_evalscope()
    assert summary["baseline"] == "base"
    assert summary["data"]["n_test"] == 1319 and summary["limit"] == 3
    assert summary["modes"]["training"]["few_shot"] == 0
    assert summary["modes"]["training"]["prompt_template"] == PROMPT_STYLES["hash"]
    assert summary["modes"]["evalscope"]["few_shot"] == 4
    assert len(summary["results"]) == 4
    for row in summary["results"]:
        assert row["error"] is None
        assert row["n"] == 3 and row["errored"] == 0
        assert 0.0 <= row["accuracy"] <= 1.0
        assert row["backend"] == "transformers"
        assert row["generation"]["max_tokens"] == 8
        assert row["evalscope_version"] == pinned_evalscope()
        check_row_files(out, row)
    for mode in ("training", "evalscope"):
        base, again = result(summary, "base", mode), result(summary, "again", mode)
        assert base["delta_vs_baseline"] is None
        assert again["delta_vs_baseline"] == 0.0  # greedy decoding of the same weights
        assert again["accuracy"] == base["accuracy"]
    train = result(summary, "base", "training")
    assert train["our_reward_n"] == 3 and 0.0 <= train["our_reward_accuracy"] <= 1.0
    assert result(summary, "again", "training")["our_reward_delta_vs_baseline"] == 0.0
    assert result(summary, "base", "evalscope")["our_reward_accuracy"] is None
    # the prompt EvalScope sent in training mode is exactly the training prompt
    record = json.loads((out / train["predictions"]).read_text().splitlines()[0])
    row = scoring.match_row(record, [{"question": r["question"]} for r in _jsonl(shared_gsm8k_dir)])
    assert scoring.user_prompt(record) == build_prompt(row["question"], "hash")
    table = (out / "comparison.md").read_text()
    assert re.search(r"\| base \(baseline\) \| training \| [0-9.]+ \| 3 \|", table)
    assert "| again | evalscope |" in table
    assert "## test #0" in (out / "samples" / "base-training.md").read_text()


def _jsonl(data_dir: Path, limit: int = 3) -> list[dict]:
    lines = (data_dir / "test.jsonl").read_text().splitlines()[:limit]
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_api_stub_exact_accuracy(eval_env, small_gsm8k, tmp_path):
    out = tmp_path / "eval"
    with StubServer(STUB_ANSWERS, model="stub-model") as server:
        proc = run_eval(
            "--api-url", server.url, "--api-model", "stub-model", "--data", small_gsm8k,
            "--max-tokens", 64, "--batch-size", 2, "--out", out,
        )  # fmt: skip
        requests = list(server.requests)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = load_summary(out)
    training = result(summary, "stub-model", "training")
    evalscope = result(summary, "stub-model", "evalscope")
    # EvalScope (Math-Verify) reads the last number: 7, 30 right; 11 != 12 wrong.
    assert training["n"] == 3 and training["correct"] == 2
    assert training["accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    # Our reward reads the number after "####": the same 2 of 3.
    assert training["our_reward_accuracy"] == pytest.approx(2 / 3)
    assert training["our_reward_format_rate"] == 1.0
    assert evalscope["n"] == 3 and evalscope["correct"] == 2
    assert evalscope["accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    assert training["backend"] == "api"
    check_row_files(out, training)

    # What was sent: greedy, our max_tokens; training mode = exactly the training prompt,
    # evalscope mode = 4-shot with EvalScope's boxed instruction.
    assert len(requests) == 6
    prompts = [r["messages"][-1]["content"] for r in requests]
    for request in requests:
        assert request["temperature"] == 0 and request["max_tokens"] == 64
        assert request["repetition_penalty"] == 1.0  # not the model's generation_config
    expected_training = {build_prompt(q, "hash") for q, _ in TEST_ROWS}
    assert expected_training <= set(prompts)
    few_shot = [p for p in prompts if p not in expected_training]
    assert len(few_shot) == 3
    for prompt in few_shot:
        assert "\\boxed{}" in prompt
        assert all(TRAIN_ROWS[i][0] in prompt for i in range(4))
        assert TRAIN_ROWS[4][0] not in prompt

    samples = (out / training["samples"]).read_text()
    assert "#### 11" in samples and "our reward acc 0" in samples


def test_sampled_evaluation_reports_mean_and_pass_at_k(eval_env, small_gsm8k, tmp_path):
    """k answers per question at a temperature: EvalScope repeats each question; accuracy is
    mean@k and pass@k sits beside it, by EvalScope and by our reward (the stub answers the same
    every time: 2 of 3 questions right, so both are 2/3)."""
    out = tmp_path / "eval"
    with StubServer(STUB_ANSWERS, model="stub-model") as server:
        proc = run_eval(
            "--api-url", server.url, "--api-model", "stub-model", "--data", small_gsm8k,
            "--modes", "training", "--samples-per-question", 3, "--temperature", 0.7,
            "--out", out,
        )  # fmt: skip
        requests = list(server.requests)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(requests) == 9 and {r["temperature"] for r in requests} == {0.7}
    # no --run, no --max-tokens: the default, and the page does not call it verl's validation
    assert {r["max_tokens"] for r in requests} == {1024}
    # top_p/top_k as verl's rollout reach the server: else it takes generation_config.json's
    assert {(r.get("top_p"), r.get("top_k")) for r in requests} == {(1.0, -1)}
    row = result(load_summary(out), "stub-model", "training")
    assert row["n"] == 3 and row["generation"]["samples_per_question"] == 3
    assert row["generation"]["top_p"] == 1.0 and row["generation"]["top_k"] == -1
    assert row["accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["pass_at_k"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["our_reward_accuracy"] == pytest.approx(2 / 3)
    assert row["our_reward_pass_at_k"] == pytest.approx(2 / 3)
    markdown = (out / "comparison.md").read_text()
    assert "sampled (3 answers per question, temperature 0.7" in markdown and "pass@k" in markdown
    assert "max_tokens 1024 (from the default (no --run, no --max-tokens))" in markdown
    assert "Comparable to this run's validation" not in markdown
    assert "bootstrap" in markdown and "pass@k with best@N)" not in markdown
    # the questions page beside the comparison (docs/questions.md): a cell is the share of the K
    # answers our reward credits; the stub answers each question the same way all 3 times
    page = json.loads((out / "questions" / "summary.json").read_text())
    assert page["columns"] == ["stub-model"] and page["sampled"] is True
    assert sorted(row["shares"][0] for row in page["rows"]) == [0.0, 1.0, 1.0]
    assert (out / "questions" / "questions.html").is_file()


def test_checkpoint_sweep_refuses_what_it_cannot_do(eval_env, tmp_path):
    run = tmp_path / "run"
    (run / "global_step_5" / "actor").mkdir(parents=True)
    proc = run_eval("--run", run)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "no launch record" in proc.stderr and not (run / "checkpoint_eval").exists()
    proc = run_eval("--run", run, "--model", tmp_path)
    assert proc.returncode == 2 and "not with --model" in proc.stderr
    proc = run_eval("--run", tmp_path / "nowhere")
    assert proc.returncode == 2 and "not a directory" in proc.stderr
    proc = run_eval("--model", tmp_path, "--samples-per-question", 2, "--temperature", 0)
    assert proc.returncode == 2 and "--temperature must be > 0" in proc.stderr
    proc = run_eval("--model", tmp_path, "--samples-per-question", 2, "--top-k", 0)
    assert proc.returncode == 2 and "--top-k must be" in proc.stderr


VLLM_CPU = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
VLLM_CPU_ARGS = "--dtype float32 --max-model-len 1024 --enforce-eager"


def _servers_of(model: Path) -> list[int]:
    """Live processes serving ``model`` (vllm serve and the engine processes it forks)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _alive(int(entry.name)):
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(model) in cmdline and "serve" in cmdline:
                found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_vllm_backend_for_real_then_a_sigint_mid_evaluation(
    eval_env, tiny_model_dir, small_gsm8k, tmp_path
):
    """The backend GPU users get by default, for real: `vllm serve` (vLLM's CPU build in .venv)
    with the tiny model, readiness, EvalScope over the OpenAI API, then the server's whole process
    group gone; and the same after a SIGINT while EvalScope is asking, and after a SIGKILL."""
    args = ["--model", f"tiny={tiny_model_dir}", "--backend", "vllm", "--data", small_gsm8k,
            "--modes", "training", "--max-tokens", "16", "--vllm-args", VLLM_CPU_ARGS]  # fmt: skip
    proc = run_eval(*args, "--out", tmp_path / "eval", env=VLLM_CPU, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = result(load_summary(tmp_path / "eval"), "tiny", "training")
    assert row["backend"] == "vllm" and row["n"] == 3 and row["error"] is None
    assert _servers_of(tiny_model_dir) == []
    log = (tmp_path / "eval" / "logs" / "vllm-tiny.log").read_text()
    assert "Application startup complete" in log or "Uvicorn running" in log, log[-2000:]

    # SIGINT as a terminal's Ctrl-C delivers it: a suite started in the background by a
    # non-interactive shell (`make test &`) inherits SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler; the child gets the default disposition back.
    interrupted = subprocess.Popen(
        ["bash", str(EVAL_SH), *map(str, args), "--out", str(tmp_path / "sigint")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **VLLM_CPU},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert interrupted.stdout is not None
        for line in interrupted.stdout:  # printed once the server answers /v1/models
            if "evaluating tiny in training mode (vllm)" in line:
                break
        assert _servers_of(tiny_model_dir), "the server should be up while EvalScope asks"
        interrupted.send_signal(signal.SIGINT)
        _, stderr = interrupted.communicate(timeout=120)
    finally:
        if interrupted.poll() is None:
            interrupted.kill()
    assert interrupted.returncode == 130, stderr[-2000:]
    assert "interrupted; servers stopped" in stderr
    time.sleep(1)
    assert _servers_of(tiny_model_dir) == [], "vllm serve outlived the interrupted evaluation"
    assert not (tmp_path / "sigint" / "comparison.json").exists()

    # SIGKILL (an out-of-memory killer, a scheduler past its grace) reaches no handler: vllm
    # serve gets its parent-death signal, SIGTERM, and stops its engine processes (renamed
    # VLLM::EngineCore and VLLM::Worker: not found by the model's path), none left orphaned.
    killed = subprocess.Popen(
        ["bash", str(EVAL_SH), *map(str, args), "--out", str(tmp_path / "sigkill")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **VLLM_CPU},
    )  # fmt: skip
    family: list[psutil.Process] = []
    try:
        assert killed.stdout is not None
        for line in killed.stdout:
            if "evaluating tiny in training mode (vllm)" in line:
                break
        servers = [c for c in psutil.Process(killed.pid).children() if "serve" in c.cmdline()]
        family = servers + [d for c in servers for d in c.children(recursive=True)]
        assert any("EngineCore" in p.name() + " ".join(p.cmdline()) for p in family), family
        killed.kill()  # eval.sh exec'd the driver: this is its pid
        killed.communicate(timeout=60)
        _, alive = psutil.wait_procs(family, timeout=60)
        assert not alive, f"outlived a SIGKILLed evaluation: {alive}"
    finally:
        if killed.poll() is None:
            killed.kill()
        for orphan in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                orphan.kill()


def _fake_vllm(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-vllm"
    script.write_text(f"#!/usr/bin/env bash\n{body}\n")
    script.chmod(0o755)
    return script


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.slow
def test_vllm_backend_serves_and_always_stops(eval_env, small_gsm8k, tmp_path):
    """The stub stands in for `vllm serve` (same command line)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps(STUB_ANSWERS))
    pid_file = tmp_path / "server.pid"
    fake = _fake_vllm(tmp_path, f'exec "{sys.executable}" "{STUB}" "$@"')
    out = tmp_path / "eval"
    proc = run_eval(
        "--backend", "vllm", "--vllm-bin", fake, "--model", f"ppo={model}", "--data", small_gsm8k,
        "--modes", "training", "--out", out,
        env={"OPENAI_STUB_ANSWERS": str(answers), "OPENAI_STUB_PID_FILE": str(pid_file)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = result(load_summary(out), "ppo", "training")
    assert row["backend"] == "vllm" and row["n"] == 3
    assert row["accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    assert row["our_reward_accuracy"] == pytest.approx(2 / 3)
    assert "server ready" in proc.stdout and "server stopped" in proc.stdout
    pid = int(pid_file.read_text())
    assert not _alive(pid)
    assert "stub serving ppo" in (out / "logs" / "vllm-ppo.log").read_text()


@pytest.mark.slow
def test_a_sigkilled_evaluation_takes_its_vllm_server_with_it(eval_env, small_gsm8k, tmp_path):
    """SIGKILL (an out-of-memory killer, a scheduler past its grace) reaches no handler: the
    server, in its own session, must still die with the evaluation, not hold the GPU and the
    port orphaned. The stub stands in for `vllm serve` and never answers, so the evaluation is
    held waiting for it when the kill lands."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    pid_file = tmp_path / "server.pid"
    # written whole, then renamed: the test never reads the file before its pid is in it
    pid = f'echo $$ > "{pid_file}.tmp" && mv "{pid_file}.tmp" "{pid_file}"'
    fake = _fake_vllm(tmp_path, f"{pid}; exec sleep 300")
    cmd = ["bash", str(EVAL_SH), "--backend", "vllm", "--vllm-bin", str(fake), "--model",
           str(model), "--data", str(small_gsm8k), "--modes", "training", "--out",
           str(tmp_path / "killed")]  # fmt: skip
    server = None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as run:
        try:
            deadline = time.monotonic() + 60
            while not pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert pid_file.exists(), "the fake server never started"
            server = int(pid_file.read_text())
            run.kill()  # eval.sh exec'd the driver: this is its pid
            run.communicate(timeout=60)
            deadline = time.monotonic() + 5
            while _alive(server) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _alive(server), "the server outlived a SIGKILLed evaluation"
        finally:
            if server is not None and _alive(server):
                os.kill(server, signal.SIGKILL)


def test_vllm_server_failures_are_reported_and_cleaned_up(eval_env, small_gsm8k, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")

    # 1. the server dies at start: its log tail is in the error
    crash = _fake_vllm(tmp_path, 'echo "ValueError: fake CUDA out of memory" >&2; exit 3')
    out = tmp_path / "crash"
    proc = run_eval(
        "--backend", "vllm", "--vllm-bin", crash, "--model", model, "--data", small_gsm8k,
        "--modes", "training", "--out", out,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "fake CUDA out of memory" in proc.stderr
    (row,) = load_summary(out)["results"]
    assert "exited with code 3" in row["error"] and "fake CUDA out of memory" in row["error"]
    assert "| model (baseline) | training | failed |" in (out / "comparison.md").read_text()

    # 2. the server never answers: timeout, and its whole process group is killed
    child_pid = tmp_path / "child.pid"
    hang = _fake_vllm(tmp_path, f'sleep 300 & echo $! > "{child_pid}"; echo loading; wait')
    out = tmp_path / "hang"
    proc = run_eval(
        "--backend", "vllm", "--vllm-bin", hang, "--model", model, "--data", small_gsm8k,
        "--modes", "training", "--server-timeout", 3, "--out", out,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "did not answer" in proc.stderr and "loading" in proc.stderr
    assert not _alive(int(child_pid.read_text()))

    # 3. eval.sh is stopped (SIGTERM) while waiting for the server: the server goes too
    child_pid.unlink()
    cmd = ["bash", str(EVAL_SH), "--backend", "vllm", "--vllm-bin", str(hang), "--model",
           str(model), "--data", str(small_gsm8k), "--modes", "training", "--out",
           str(tmp_path / "stopped")]  # fmt: skip
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as run:
        deadline = time.monotonic() + 60
        while not child_pid.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert child_pid.exists(), "the fake server never started"
        time.sleep(0.5)
        run.send_signal(signal.SIGTERM)  # eval.sh exec'd the driver: this is its pid
        _, stderr = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted" in stderr
    assert not _alive(int(child_pid.read_text()))


def test_evalscope_failure_is_one_line_and_a_log(eval_env, small_gsm8k, tmp_path):
    """EvalScope itself fails (a model transformers cannot load): one summary line naming the
    model, the mode and the exception's last line, with the log that holds the traceback."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # resolves (a directory), but has no model_type
    out = tmp_path / "eval"
    proc = run_eval(
        "--model", broken, "--backend", "transformers", "--data", small_gsm8k,
        "--modes", "training", "--limit", 1, "--out", out,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    log = out / "logs" / "evalscope-broken-training.log"
    assert line.startswith("eval.sh: broken / training failed: ValueError: Unrecognized model")
    assert line.endswith(f"(full log: {log})")
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "Unrecognized model" in text
    (row,) = load_summary(out)["results"]
    assert row["error"] == line.split(" failed: ", 1)[1]


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused run (exit 2, no traceback anywhere)."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, output[-3000:]
    return lines[0]


@pytest.mark.parametrize("case", ["closed-port", "not-a-url", "not-json", "not-openai", "model"])
def test_api_url_is_probed_before_anything(eval_env, small_gsm8k, tmp_path, case):
    """A wrong --api-url fails in seconds with one line naming the URL and the problem."""
    expected = {
        "closed-port": "connection refused",
        "not-a-url": "not an http(s) URL",
        "not-json": "did not answer JSON",
        "not-openai": "not an OpenAI model list",
        "model": "does not serve 'stub-model'",
    }[case]
    out = tmp_path / "eval"
    with contextlib.ExitStack() as stack:
        if case == "closed-port":  # bound, never listening: connections are refused
            url = f"http://127.0.0.1:{stack.enter_context(refusing_port())}/v1"
        elif case == "not-a-url":
            url = "127.0.0.1:8000/v1"
        elif case == "not-json":
            url = stack.enter_context(GarbageServer(b"<html>hello</html>")).url
        elif case == "not-openai":
            garbage = GarbageServer(b'{"status": "ok"}', content_type="application/json")
            url = stack.enter_context(garbage).url
        else:  # a real OpenAI-shaped server that serves another model
            url = stack.enter_context(StubServer(STUB_ANSWERS, model="other-model")).url
        started = time.monotonic()
        proc = run_eval(
            "--api-url", url, "--api-model", "stub-model", "--data", small_gsm8k, "--out", out,
            timeout=300,
        )  # fmt: skip
        seconds = time.monotonic() - started
    line = _one_line_error(proc)
    assert line.startswith(f"eval.sh: --api-url {url}: "), line
    assert expected in line, line
    assert seconds < 30, seconds
    assert not out.exists()


@pytest.mark.slow
def test_mistyped_model_writes_nothing(eval_env, small_gsm8k, tmp_path):
    """Every model resolves before --out is written, so the corrected re-run needs no --force."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps(STUB_ANSWERS))
    fake = _fake_vllm(tmp_path, f'exec "{sys.executable}" "{STUB}" "$@"')
    out = tmp_path / "eval"
    common = ["--backend", "vllm", "--vllm-bin", fake, "--data", small_gsm8k,
              "--modes", "training", "--out", out]  # fmt: skip
    env = {"OPENAI_STUB_ANSWERS": str(answers)}
    for typo in (tmp_path / "modle", "Qwen/No-Such-Model-Here"):  # a path, a hub id (offline)
        proc = run_eval("--model", f"base={model}", "--model", f"ppo={typo}", *common, env=env)
        line = _one_line_error(proc)
        assert line.startswith(f"eval.sh: --model {typo}: "), line
        assert not out.exists()
    proc = run_eval("--model", f"base={model}", "--model", f"ppo={model}", *common, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = load_summary(out)
    assert [r["model"] for r in summary["results"]] == ["base", "ppo"]
    assert result(summary, "ppo", "training")["accuracy"] == pytest.approx(2 / 3, abs=1e-4)


def test_bad_inputs_exit_2(eval_env, tmp_path):
    proc = run_eval("--model", tmp_path, "--data", tmp_path / "nowhere", "--out", tmp_path / "o")
    assert proc.returncode == 2 and "--data" in proc.stderr
    proc = run_eval("--model", tmp_path, "--modes", "training,fewshot")
    assert proc.returncode == 2 and "fewshot" in proc.stderr
    proc = run_eval("--api-url", "http://127.0.0.1:9/v1")
    assert proc.returncode == 2 and "--api-model" in proc.stderr


def test_missing_eval_env_is_a_clear_error(tmp_path):
    proc = run_eval("--help", env={"EVAL_PYTHON": str(tmp_path / "no-python")})
    assert proc.returncode == 2 and "setup.sh --eval" in proc.stderr


def test_help_explains_flags(eval_env):
    proc = run_eval("--help")
    assert proc.returncode == 0
    for flag in ("--model", "--baseline", "--modes", "--backend", "--api-url", "--api-model",
                 "--data", "--limit", "--max-tokens", "--batch-size", "--out", "--run",
                 "--samples-per-question", "--temperature", "--top-p", "--top-k"):  # fmt: skip
        assert flag in proc.stdout, flag
    text = EVAL_SH.read_text()
    assert "set -euo pipefail" in text and "EVAL_PYTHON=${EVAL_PYTHON:-" in text


# ---------------------------------------------------------------------------------------------
# The driver's parsing, without EvalScope (runs in the main environment)

PREDICTION = {  # the shape of one line of EvalScope 1.14.1's predictions/<model>/gsm8k_main.jsonl
    "index": 1,
    "model": "m",
    "model_output": {
        "model": "m",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "6*5=30\n#### 30",
                    "source": "generate",
                },
                "stop_reason": "stop",
            }
        ],
    },
    "messages": [
        {"role": "user", "content": build_prompt(TEST_ROWS[1][0], "hash")},
        {"role": "assistant", "content": "6*5=30\n#### 30"},
    ],
    "metadata": {"reasoning": "6*5=<<6*5=30>>30"},
}


def test_response_text_and_row_matching():
    assert scoring.response_text(PREDICTION) == "6*5=30\n#### 30"
    parts = json.loads(json.dumps(PREDICTION))
    parts["model_output"]["choices"][0]["message"]["content"] = [{"type": "text", "text": "x"}]
    assert scoring.response_text(parts) == "x"
    no_output = {**PREDICTION, "model_output": None}
    assert scoring.response_text(no_output) == "6*5=30\n#### 30"  # the conversation's last turn
    rows = [{"question": q, "answer": a} for q, a in TEST_ROWS]
    assert scoring.match_row(PREDICTION, rows) is rows[1]
    shifted = {**PREDICTION, "index": 0}  # a wrong index is corrected by the question text
    assert scoring.match_row(shifted, rows) is rows[1]


def test_rescore_with_our_reward(tmp_path):
    from data_prep.gsm8k import ground_truth

    rows = [{"question": q, "answer": a} for q, a in TEST_ROWS]
    records = []
    for index, (question, _) in enumerate(TEST_ROWS):
        record = json.loads(json.dumps(PREDICTION))
        record["index"] = index
        record["messages"][0]["content"] = build_prompt(question, "hash")
        record["model_output"]["choices"][0]["message"]["content"] = STUB_ANSWERS[question]
        records.append(record)
    path = tmp_path / "pred.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    scored = scoring.rescore(path, rows)
    assert scored["n"] == 3 and scored["unmatched"] == 0
    assert scored["accuracy"] == pytest.approx(2 / 3) and scored["format_rate"] == 1.0
    assert [scored["per_index"][i]["acc"] for i in range(3)] == [1.0, 1.0, 0.0]


def test_model_specs_baseline_and_deltas():
    specs = ev.parse_model_specs(["Qwen/Qwen2.5-0.5B-Instruct", "ppo=/runs/a/merged", "/x/merged"])
    assert [s.label for s in specs] == ["Qwen2.5-0.5B-Instruct", "ppo", "merged"]
    assert ev.parse_model_specs(["/a/m", "/b/m"])[1].label == "m-2"
    assert ev.pick_baseline(specs, None) == "Qwen2.5-0.5B-Instruct"
    assert ev.pick_baseline(specs, "ppo") == "ppo"
    assert ev.pick_baseline(specs, "/x/merged") == "merged"
    with pytest.raises(ev.UsageError):
        ev.pick_baseline(specs, "nope")

    results = [
        {"model": "base", "mode": "training", "accuracy": 0.40, "our_reward_accuracy": 0.38},
        {"model": "base", "mode": "evalscope", "accuracy": 0.45, "our_reward_accuracy": None},
        {"model": "ppo", "mode": "training", "accuracy": 0.55, "our_reward_accuracy": 0.56},
        {"model": "ppo", "mode": "evalscope", "accuracy": 0.50, "our_reward_accuracy": None},
        {"model": "bad", "mode": "training", "accuracy": None, "error": "boom"},
    ]
    scoring.add_deltas(results, "base")
    assert results[0]["delta_vs_baseline"] is None
    assert results[2]["delta_vs_baseline"] == pytest.approx(0.15)
    assert results[2]["our_reward_delta_vs_baseline"] == pytest.approx(0.18)
    assert results[3]["delta_vs_baseline"] == pytest.approx(0.05)  # same mode only
    assert results[3]["our_reward_delta_vs_baseline"] is None
    assert results[4]["delta_vs_baseline"] is None


def test_rescore_pass_at_k_unbiased_per_row_and_flags_short_questions(tmp_path, capsys):
    from data_prep.gsm8k import ground_truth

    (q0, a0), (q1, a1) = TEST_ROWS[0], TEST_ROWS[1]
    rows = [{"question": q0, "answer": a0}, {"question": q0, "answer": a0}]  # same text twice
    rows.append({"question": q1, "answer": a1})
    right, wrong = STUB_ANSWERS[q0], "I do not know.\n#### 987654"
    answers = [(0, right), (0, wrong), (0, wrong), (1, wrong), (1, wrong), (1, wrong), (2, right)]
    records = []
    for index, text in answers:
        record = json.loads(json.dumps(PREDICTION))
        record["index"] = index
        record["messages"][0]["content"] = build_prompt(rows[index]["question"], "hash")
        record["model_output"]["choices"][0]["message"]["content"] = text
        records.append(record)
    path = tmp_path / "pred.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    scored = scoring.rescore(path, rows, k=2)
    # row 0: n=3, c=1: 1 - C(2,2)/C(3,2) = 2/3; row 1: 0; row 2 has 1 answer < k: flagged, left out
    assert scored["questions"] == 3
    assert scored["pass_at_k"] == pytest.approx((2 / 3 + 0.0) / 2)
    assert scored["short_questions"] == [2]
    assert "fewer than 2 scored answers" in capsys.readouterr().err
    assert scoring.pass_at_k([1.0, 0.0, 0.0, 0.0], 2) == pytest.approx(1 - 3 / 6)
    with pytest.raises(ValueError):
        scoring.pass_at_k([1.0], 2)


def test_checkpoint_sweep_marks_the_kept_best_checkpoint(tmp_path, capsys):
    """eval.sh --run: the step a run's best_checkpoint.json names (KEEP_BEST=1) is marked in the
    table by step; without the file nothing is; an unreadable one is one line, nothing marked."""
    from verl_gsm8k.common.run_dir import write_best
    from verl_gsm8k.evaluate.sweep import kept_best, render_steps

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "mode": "training", "accuracy": a, "our_reward_accuracy": a, "n": 100}
            for s, a in ((0, 0.4), (10, 0.57), (20, 0.55))]  # fmt: skip

    def table(best):
        sweep = {"run_dir": str(run), "starting_model": "base", "best_checkpoint": best}
        return render_steps({"sweep": sweep, "results": rows})

    assert kept_best(run) is None and "best" not in table(None)
    write_best(run, 10, "val-core/openai/gsm8k/acc/mean@1", 0.57, "20260101T000000Z")
    markdown = table(kept_best(run))
    marked = [line for line in markdown.splitlines() if "best (" in line]
    assert marked == ["| 10 best (val acc 0.57) | training | 57.00 | 57.00 | 100 |"]
    assert f"`bash scripts/merge.sh {run} OUT --best` merges it" in markdown
    (run / "best_checkpoint.json").write_text("{")
    assert kept_best(run) is None
    (line,) = capsys.readouterr().err.splitlines()
    assert "best_checkpoint.json: not readable JSON" in line and "not marked" in line


# ---------------------------------------------------------------------------------------------
# Evaluation as verl validates: the run's response limit, best@N, the resume key


def _run_with_records(tmp_path: Path, *lengths) -> Path:
    """A run directory whose launch records set data.max_response_length to each of ``lengths``
    in turn (the last is the run's latest launch)."""
    from verl_gsm8k.common.launch_record import write_record

    run = tmp_path / "run"
    for i, length in enumerate(lengths):
        config = {"data": {"max_response_length": length, "val_files": ["/x/test.parquet"]}}
        write_record(run, {"format": 1, "stamp": f"2026010{i + 1}T000000Z", "config": config})
    return run


def _sweep_settings(run: Path, *flags):
    argv = ["--run", str(run), "--backend", "transformers", "--dtype", "float32", "--data", "d",
            *flags]  # fmt: skip
    return ev.parse_settings(ev.build_parser().parse_args(argv))[0]


def test_a_runs_evaluation_answers_within_the_runs_own_response_limit(tmp_path):
    """eval.sh --run: max_tokens is the run's data.max_response_length (its last launch record),
    --max-tokens overrides it, and where it came from is said; only the run's own limit is called
    comparable to verl's validation score."""
    run = _run_with_records(tmp_path, 128, 256)
    settings = _sweep_settings(run)
    assert settings.max_tokens == 256
    assert settings.max_tokens_from == (
        f"data.max_response_length of the run's launch record "
        f"{run / 'launches' / 'launch-20260102T000000Z.yaml'}"
    )
    assert settings.comparable_to().startswith("Comparable to this run's validation")
    override = _sweep_settings(run, "--max-tokens", "64")
    assert (override.max_tokens, override.max_tokens_from) == (64, "--max-tokens")
    assert "Comparable to this" not in override.comparable_to()
    plain, _, _ = ev.parse_settings(ev.build_parser().parse_args(
        ["--model", str(tmp_path), "--backend", "transformers", "--dtype", "float32"]))  # fmt: skip
    assert (plain.max_tokens, plain.max_tokens_from) == (1024, ev.MAX_TOKENS_DEFAULT)
    assert "only if that equals the run's data.max_response_length" in plain.comparable_to()
    bad = _run_with_records(tmp_path / "bad", "long")
    with pytest.raises(ev.UsageError) as err:
        _sweep_settings(bad)
    assert "launch-20260101T000000Z.yaml: data.max_response_length is 'long'" in str(err.value)
    assert _sweep_settings(bad, "--max-tokens", "32").max_tokens == 32


def test_the_page_says_where_max_tokens_came_from_and_how_verl_counts_best_at_n():
    from verl_gsm8k.evaluate.render import render_markdown

    source = "data.max_response_length of the run's launch record /r/launches/launch-1.yaml"
    row = {"model": "m", "mode": "training", "accuracy": 0.5, "n": 4, "backend": "api",
           "pass_at_k": 0.75, "our_reward_pass_at_k": 0.75}  # fmt: skip
    summary = {
        "evalscope_version": "1.14.1", "data": {"source": "d", "n_test": 4}, "baseline": "m",
        "generation": {"max_tokens": 256, "max_tokens_from": source, "temperature": 1.0,
                       "samples_per_question": 4, "repetition_penalty": 1.0, "batch_size": 8},
        "modes": {}, "results": [row],
    }  # fmt: skip
    markdown = render_markdown(summary)
    assert f"max_tokens 256 (from {source})" in markdown
    assert "with replacement" in markdown and "1 - (1 - c/N)^N" in markdown
    assert "Do not compare pass@k with best@N" in markdown


def test_a_resumed_sweep_with_another_sampling_setting_is_refused_not_mixed(tmp_path):
    """The resume key holds every setting that changes an answer: an earlier sweep into the same
    directory with another one is refused in one line naming it, never mixed into the table."""
    import dataclasses

    from verl_gsm8k.evaluate.sweep import earlier_rows

    def settings_key(settings, data):
        return dataclasses.replace(settings, data=data).key()

    base, _, _ = ev.parse_settings(ev.build_parser().parse_args(
        ["--model", str(tmp_path), "--backend", "transformers", "--dtype", "float32",
         "--samples-per-question", "4", "--out", str(tmp_path / "o")]))  # fmt: skip
    out = tmp_path / "sweep"
    out.mkdir()
    row = {"step": 0, "mode": "training", "accuracy": 0.5, "error": None}
    (out / "comparison.json").write_text(
        json.dumps({"sweep": {"settings": settings_key(base, "d")}, "results": [row]})
    )
    assert earlier_rows(out, settings_key(base, "d")) == [row]
    changes = {"top_p": 0.8, "top_k": 20, "temperature": 0.7, "max_tokens": 256, "repeats": 8,
               "limit": 5, "backend": "vllm", "dtype": "bfloat16"}  # fmt: skip
    for field, value in changes.items():
        key = settings_key(dataclasses.replace(base, **{field: value}), "d")
        with pytest.raises(ev.UsageError) as err:
            earlier_rows(out, key)
        message = str(err.value)
        assert "\n" not in message and "would mix" in message, field
        name = {"repeats": "samples_per_question"}.get(field, field)
        assert f"{name} " in message and f"{value!r} now" in message, (field, message)
    # greedy ignores top_p/top_k: they do not split a greedy sweep
    greedy = dataclasses.replace(base, repeats=1, temperature=0.0)
    assert settings_key(greedy, "d") == settings_key(dataclasses.replace(greedy, top_p=0.5), "d")
    # a sweep written before top_p/top_k were in the key is refused too, naming them
    old_key = {k: v for k, v in settings_key(base, "d").items() if k not in ("top_p", "top_k")}
    (out / "comparison.json").write_text(json.dumps({"sweep": {"settings": old_key}}))
    with pytest.raises(ev.UsageError, match="top_k 'unrecorded' there, -1 now"):
        earlier_rows(out, settings_key(base, "d"))

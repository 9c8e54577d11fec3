"""python -m verl_gsm8k.report RUN_A RUN_B: a PPO run against a GRPO one; the two real logs."""

import json
from pathlib import Path
from typing import Any

import pytest
import report_runs as rr
from browser import dom, plot_series

from verl_gsm8k.common.command_line import shell_line
from verl_gsm8k.common.config_diff import leaves
from verl_gsm8k.common.launch_record import build_record, write_record
from verl_gsm8k.compare import cli as compare_cli
from verl_gsm8k.compare import config as cc
from verl_gsm8k.compare.runs import unique_labels
from verl_gsm8k.report import cli as report

CRITIC_KEYS = ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/values/mean")
KNOB_KEYS = {
    "data.train_batch_size": "TRAIN_BATCH_SIZE",
    "actor_rollout_ref.rollout.n": "ROLLOUT_N",
    "actor_rollout_ref.actor.optim.lr": "ACTOR_LR",
    "critic.optim.lr": "CRITIC_LR",
}


def verl_config(adv_estimator: str, rollout_n: int) -> dict[str, Any]:
    """Part of a resolved verl 0.9.1 config; critic.enable null as in verl's ppo_trainer.yaml."""
    return {
        "data": {"train_batch_size": 64, "max_prompt_length": 512, "max_response_length": 512},
        "actor_rollout_ref": {
            "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
            "actor": {"optim": {"lr": 1e-6}, "use_kl_loss": adv_estimator == "grpo"},
            "rollout": {"n": rollout_n, "name": "vllm"},
        },
        "critic": {"enable": None, "optim": {"lr": 1e-5}, "model": {"path": "Qwen/Qwen2.5-0.5B"}},
        "algorithm": {"adv_estimator": adv_estimator, "use_kl_in_reward": adv_estimator == "gae"},
        "trainer": {"n_gpus_per_node": 2, "nnodes": 1, "total_epochs": 15},
    }


def grpo_metrics(step: int, data: dict[str, Any]):
    for key in CRITIC_KEYS:
        data.pop(key)
    data["actor/kl_loss"] = data.pop("actor/reward_kl_penalty")
    data["critic/score/mean"] += 0.05


def make_run(root: Path, name: str, algo: str | None = "gae", stamp: str = "20250101T000000Z",
             verl_command: str | None = None, **trainer: Any) -> Path:  # fmt: skip
    """A run of ``algo`` (None: no launch record), ``trainer`` set in its config."""
    run = rr.write_run(root / name, rr.build_run(grpo_metrics, seed=8) if algo == "grpo" else None)
    if algo is not None:
        kind, n = ("grpo", 5) if algo == "grpo" else ("ppo", 1)
        config = verl_config(algo, n)
        config["trainer"].update(trainer)
        write_record(run, build_record(
            stamp=stamp, recipe=f"{kind}_qwen2.5-0.5b_gsm8k", trainer="ppo",
            config_name=f"gsm8k_{kind}", knobs={"ROLLOUT_N": str(n)}, knob_keys=KNOB_KEYS,
            user_overrides=["trainer.total_epochs=15"], config=config, root=root,
            gpus=[("NVIDIA H100", 80.0)] * 2, verl_command=verl_command))  # fmt: skip
    return run


def verl_line(threads: str, stamp: str, config: str) -> str:
    env = {"ATTENTION": "auto", "OMP_NUM_THREADS": threads, "GSM8K_LAUNCH_ID": f"{stamp}-1-h",
           "VERL_FILE_LOGGER_PATH": f"/r/{stamp}.jsonl"}  # fmt: skip
    argv = ["/venv/bin/python", "-m", "verl.trainer.main_ppo", "--config-path", "/repo",
            "--config-name", config, "data.train_files=['/d/t.parquet']"]  # fmt: skip
    return shell_line(argv, env)


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    return (make_run(tmp_path, "ppo-gae", verl_command=verl_line("1", "A", "gsm8k_ppo")),
            make_run(tmp_path, "grpo", "grpo", "20250102T000000Z",
                     verl_line("4", "B", "gsm8k_grpo")))  # fmt: skip


def diff_keys(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for rows in summary["config_diff"]["groups"].values() for row in rows}


def test_diff_names_what_differs_by_value_and_groups_it():
    gae = cc.RunConfig(leaves(verl_config("gae", 1)), "a", KNOB_KEYS)
    grpo = cc.RunConfig(leaves(verl_config("grpo", 5)), "b", KNOB_KEYS)
    diff = cc.config_diff({"gae": gae, "grpo": grpo})
    rows = {row.key: row for row in diff.rows}
    assert set(rows) == {"algorithm.adv_estimator", "algorithm.use_kl_in_reward", cc.CRITIC_IN_USE,
                         "actor_rollout_ref.actor.use_kl_loss",
                         "actor_rollout_ref.rollout.n"}  # fmt: skip
    assert rows["algorithm.adv_estimator"].values == {"gae": "gae", "grpo": "grpo"}
    assert (rows[cc.CRITIC_IN_USE].values, rows[cc.CRITIC_IN_USE].group) == (
        {"gae": True, "grpo": False}, "critic")  # fmt: skip
    assert rows["actor_rollout_ref.rollout.n"].knobs == ["ROLLOUT_N"]
    assert rows["algorithm.adv_estimator"].knobs == []  # set by the config file, not a knob
    assert list(diff.by_group()) == ["actor", "rollout", "critic", "algorithm"]
    gae.flat["critic.enable"] = False  # wins over the estimator
    del grpo.flat["critic.enable"]
    rows = {row.key: row for row in cc.config_diff({"gae": gae, "grpo": grpo}).rows}
    assert cc.CRITIC_IN_USE not in rows and rows["critic.enable"].values == {"gae": False}
    assert rows["critic.enable"].missing_in == ["grpo"]

    named = cc.config_diff({label: cc.RunConfig({
        "trainer.experiment_name": label, "trainer.default_local_dir": f"/runs/{label}",
        "trainer.rollout_data_dir": f"/runs/{label}/rollouts",
        "data.train_files": f"/data/{label}.parquet",  # a file named like the run: a setting
        "data.val_files": "/data/test.parquet" if label == "a" else "/data/b/test.parquet",
    }, "x") for label in ("a", "b")})  # fmt: skip
    assert {row.key: row.group for row in named.rows} == {
        "trainer.experiment_name": cc.NAMED, "trainer.default_local_dir": cc.NAMED,
        "trainer.rollout_data_dir": cc.NAMED, "data.train_files": "data",
        "data.val_files": "data"}  # fmt: skip
    assert list(named.by_group()) == ["data", cc.NAMED]  # the settings first
    keys = ("actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref.model.path",
            "reward_model.enable", "ray_kwargs.ray_init.x")  # fmt: skip
    assert [cc.group_of(k) for k in keys] == ["reference", "actor", "reward", "other"]


def test_config_dump_read_safely_from_a_console_log(tmp_path):
    """A "}" in a string; never evaluated. Other processes' lines: test_real_logs_compared."""
    me = "\x1b[36m(TaskRunner pid=7)\x1b[0m "
    log = tmp_path / "console.log"
    log.write_text(f"{me}{{'data': {{'n': 256}},\n{me} 'reward': {{'note': 'a }} in it'}}}}\n")
    assert leaves(cc.config_dump(log) or {}) == {"data.n": 256, "reward.note": "a } in it"}
    marker = tmp_path / "ran"
    log.write_text(f"{me}{{'a': __import__('pathlib').Path({str(marker)!r}).touch()}}\n")
    assert cc.config_dump(log) is None and not marker.exists()
    log.write_text(me + "step:1 - critic/score/mean:0.5\n")
    assert cc.config_dump(log) is None


def test_two_run_dirs_gae_vs_grpo(two_runs: tuple[Path, Path], tmp_path, capsys):
    gae, grpo = two_runs
    rr.write_evals(gae, [
        {"step": 0, "model": "base", "mode": "training", "accuracy": 0.33,
         "our_reward_accuracy": 0.31, "n": 100},
        {"step": 0, "model": "base", "mode": "evalscope", "accuracy": 0.40,
         "our_reward_accuracy": None},
        {"step": 100, "model": "s100", "mode": "training", "accuracy": 0.52,
         "our_reward_accuracy": 0.50, "n": 100},
    ])  # fmt: skip
    out = tmp_path / "cmp"
    assert report.main([str(gae), str(grpo), "--out", str(out)]) == 0
    assert "config diff: " in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert [r["label"] for r in summary["runs"]] == ["ppo-gae", "grpo"]
    rows = diff_keys(summary)
    assert rows["recipe"]["group"] == "launch"
    assert not {"critic.optim.lr", "trainer.total_epochs", "host.gpus"} & set(rows)  # the same
    # the recorded verl commands' variables and entry point, not the launch's id or metrics path
    threads = rows["verl command: OMP_NUM_THREADS"]
    assert threads["group"] == "launch" and threads["values"] == {"ppo-gae": "1", "grpo": "4"}
    assert rows["verl command: entry point"]["values"] == {
        "ppo-gae": "verl.trainer.main_ppo gsm8k_ppo", "grpo": "verl.trainer.main_ppo gsm8k_grpo"
    }  # fmt: skip
    assert not [key for key in rows if key.endswith(("GSM8K_LAUNCH_ID", "VERL_FILE_LOGGER_PATH"))]
    assert "verl command: ATTENTION" not in rows  # the same in both
    some = summary["metrics_in_some_runs"]
    assert (some["vf_loss"], some["kl"], some["kl_loss"]) == (["ppo-gae"], ["ppo-gae"], ["grpo"])
    assert "score" in summary["shared_metrics"]
    # the table: 64 prompts x rollout.n responses a step, 2 GPUs
    gae_t, grpo_t = (r["table"] for r in summary["runs"])
    assert (gae_t["samples_per_step"], grpo_t["samples_per_step"], grpo_t["n_gpus"]) == (64, 320, 2)
    assert grpo_t["gpu_hours"] == pytest.approx(2 * grpo_t["wall_time_s"] / 3600)
    assert gae_t["val_best"]["value"] == max(v for s, v in summary["curves"]["val_acc"]["ppo-gae"])
    # x axes in the JSON: samples = step x 320 for GRPO; wall time = cumulative step time
    x = summary["runs"][1]["x"]
    assert x["steps"][:3] == [0, 1, 2] and x["samples"][:3] == [0, 320, 640]
    step_time = dict(summary["curves"]["step_time"]["grpo"])
    assert x["wall_time_s"][2] == pytest.approx(step_time[1] + step_time[2])
    # checkpoint evaluations (training mode only) against verl's validation, as in the report
    evals = summary["runs"][0]["checkpoint_evals"]
    assert [r["step"] for r in evals["rows"]] == [0, 100]
    assert evals["agreement"]["steps"][0]["gap"] == pytest.approx(0.31 - 0.30)
    assert summary["runs"][1]["checkpoint_evals"] is None
    # the page: both runs in each shared chart, on all three axes, and the evaluations
    page = (out / "comparison.html").read_text()
    svgs = rr.parse_svgs(page)
    for axis in ("step", "samples", "wall_time"):
        names = {chart: {n for n, _ in svgs[f"{chart}-{axis}"]["names"]}
                 for chart in ("score", "vf_loss", "checkpoint_eval")}  # fmt: skip
        assert names == {"score": {"ppo-gae", "ppo-gae (raw)", "grpo", "grpo (raw)"},
                         "vf_loss": {"ppo-gae", "ppo-gae (raw)"},
                         "checkpoint_eval": {"ppo-gae verl validation",
                                             "ppo-gae our reward (checkpoints)"}}, axis  # fmt: skip
    assert 'data-key="algorithm.adv_estimator"' in page and 'data-key="critic.optim.lr"' not in page
    assert "<script" not in page and "http" not in page.split("</style>")[0]
    # in Chromium: the x-axis buttons switch the sets; the samples axis is step x rollout.n
    probe = ("<script>const seen = () => [...document.querySelectorAll('.axis-set')]"
             ".map(e => e.id + '=' + getComputedStyle(e).display).join(' ');"
             "document.body.dataset.before = seen();"
             "document.querySelector('label[for=x-samples]').click();"
             "document.body.dataset.after = seen();</script></body>")  # fmt: skip
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", probe))
    shown = dom(probed, tmp_path)
    assert 'data-before="set-step=flex set-samples=none set-wall_time=none"' in shown
    assert 'data-after="set-step=none set-samples=flex set-wall_time=none"' in shown
    by_samples = plot_series(shown, "Validation accuracy by samples seen")
    assert by_samples["grpo"][-1][0] == pytest.approx(rr.STEPS * 320, rel=0.005)
    assert by_samples["ppo-gae"][-1][0] == pytest.approx(rr.STEPS * 64, rel=0.005)


def test_a_cpu_run_is_counted_in_device_hours(tmp_path):
    gpu, cpu = make_run(tmp_path, "gpu"), make_run(tmp_path, "cpu", device="cpu", n_gpus_per_node=1)
    summary = compare_cli.compare([gpu, cpu], tmp_path / "cmp")
    table = {r["label"]: r["table"] for r in summary["runs"]}["cpu"]
    assert table["device"] == "cpu" and table["n_gpus"] == 1
    page = (tmp_path / "cmp" / "comparison.html").read_text()
    assert "<td>1 cpu</td>" in page and "device hours" in page and "GPU hours" not in page


def test_real_logs_compared(verl_logs_dir, tmp_path):
    c512 = leaves(cc.config_dump(verl_logs_dir / rr.LOG_512) or {})
    c256 = leaves(cc.config_dump(verl_logs_dir / rr.LOG_256) or {})
    assert len(c512) == len(c256) == 97  # two empty override_config mappings: no setting
    assert (c512["data.max_prompt_length"], c256["data.max_prompt_length"]) == (1024, 512)
    # the 256 log's dump is cut by 49 lines of worker output after trainer.experiment_name
    assert c256["trainer.experiment_name"] == "gemma2b_function_rm"
    assert c256["trainer.total_epochs"] == 15 and c256["data.train_batch_size"] == 256
    out = tmp_path / "cmp"
    summary = compare_cli.compare([verl_logs_dir / rr.LOG_512, verl_logs_dir / rr.LOG_256], out)
    r512, r256 = (r["label"] for r in summary["runs"])
    assert (r512, r256) == (Path(rr.LOG_512).stem, Path(rr.LOG_256).stem)
    rows = diff_keys(summary)
    assert set(rows) == {"data.max_response_length", "data.max_prompt_length", "data.val_files",
                         "actor_rollout_ref.rollout.response_length", "data.train_files",
                         "actor_rollout_ref.rollout.prompt_length"}  # fmt: skip
    assert rows["data.max_response_length"]["values"] == {r512: 512, r256: 256}
    assert rows["data.max_prompt_length"]["values"] == {r512: 1024, r256: 512}
    assert list(summary["config_diff"]["groups"]) == ["data", "rollout"]
    t512, t256 = (r["table"] for r in summary["runs"])
    assert t512["samples_per_step"] == t256["samples_per_step"] == 256  # no rollout.n: one
    assert t512["n_gpus"] == 1 and t512["gpu_hours"] == pytest.approx(t512["wall_time_s"] / 3600)
    assert summary["metrics_in_some_runs"] == {}
    page = (out / "comparison.html").read_text()
    assert "0.579 @ 349" in page and "0.538 @ 199" in page
    svgs = rr.parse_svgs(page)
    assert svgs["val_acc-step"]["series"] == [(43, 43), (43, 43)]


def test_a_resumed_run_without_launch_record_is_one_line_said_and_compared(tmp_path):
    records = rr.build_run()
    resumed = tmp_path / "resumed"
    rr.write_run(resumed, records[:131])
    rr.write_jsonl(resumed / "metrics" / "metrics-20250102T000000Z.jsonl", records[100:])
    gae = make_run(tmp_path, "gae")
    out = tmp_path / "cmp"
    summary = compare_cli.compare([resumed, gae], out)
    run = summary["runs"][0]
    assert len(run["sources"]) == 2 and run["x"]["steps"] == list(range(rr.STEPS + 1))
    assert run["x"]["samples"] is None
    diff = summary["config_diff"]
    assert diff["not_compared"] == {"resumed": f"no launch record in {resumed / 'launches'}"}
    assert diff["compared"] == ["gae"] and diff["groups"] == {}
    page = (out / "comparison.html").read_text()
    assert page.count('class="config-missing"') == 1
    assert "Not drawn: resumed: no data.train_batch_size in its config" in page
    svgs = rr.parse_svgs(page)
    assert [n for n, _ in svgs["score-step"]["names"]] == [
        "resumed (raw)", "resumed", "gae (raw)", "gae"]  # fmt: skip
    assert {n for n, _ in svgs["score-samples"]["names"]} == {"gae", "gae (raw)"}
    assert [n for n, _ in svgs["val_acc-step"]["names"]] == ["resumed", "gae"]
    assert svgs["val_acc-step"]["series"][0] == (rr.STEPS // 10 + 1, rr.STEPS // 10 + 1)


def test_unique_labels(tmp_path):
    a, b = tmp_path / "a" / "run", tmp_path / "b" / "run"
    for path in (a, b, tmp_path / "x"):
        path.mkdir(parents=True)
    log = tmp_path / "a" / "console.log"
    log.write_text("")
    assert unique_labels([a, b, tmp_path / "x", log]) == ["a/run", "b/run", "x", "console"]
    assert unique_labels([Path(".")])[0] == Path.cwd().name


def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    good, nope = make_run(tmp_path, "good"), tmp_path / "nope"
    (tmp_path / "empty").mkdir()
    broken = make_run(tmp_path, "broken", None)
    (broken / "launches").mkdir()
    (broken / "launches" / "launch-20250101T000000Z.yaml").write_text("format: 1\n")
    cases = {
        nope: f"input not found: {nope}", tmp_path / "empty": "no metrics/*.jsonl in directory",
        rr.write_run(tmp_path / "started", []): "no metrics could be read",
        tmp_path / "good" / ".." / "good": "are the same run",
        rr.write_run(tmp_path / "odd", [{"step": 1, "data": {"x/unknown": 1.0}}]):
            "the runs have no metric in common",
        broken: "launch-20250101T000000Z.yaml: not a launch record",
    }  # fmt: skip
    for other, expected in cases.items():
        assert report.main([str(good), str(other), "--out", str(tmp_path / "cmp")]) == 2
        printed, err = capsys.readouterr()
        (line,) = err.strip().splitlines()
        assert line.startswith("verl_gsm8k.report: error: ") and expected in line and printed == ""
        assert not (tmp_path / "cmp").exists()


def test_follow_takes_one_input_and_the_default_out_dir(two_runs, tmp_path, monkeypatch, capsys):
    gae, grpo = two_runs
    assert report.main([str(gae), str(grpo), "--follow"]) == 2
    assert "--follow reads one INPUT" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    assert report.main([str(gae), str(grpo), "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(Path("comparison") / "comparison.html")
    assert sorted(p.name for p in (tmp_path / "comparison").iterdir()) == [
        "comparison.html", "summary.json"]  # fmt: skip
    text = " ".join(report.build_parser().format_help().split())
    assert "Two or more INPUTs" in text and "./comparison" in text and "comparison.html" in text

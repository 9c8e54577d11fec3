"""The same-config check (resume/same_config.py): a relaunch against the launch that wrote the
checkpoint it resumes."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, get

from verl_gsm8k.common.config_diff import leaves
from verl_gsm8k.common.launch_record import read_records, write_record
from verl_gsm8k.common.run_dir import TRACKER, write_stamp
from verl_gsm8k.resume.__main__ import main, record_launch
from verl_gsm8k.resume.same_config import ALLOWED, allowed, differences, refusal

STAMPS = [f"20261125T10000{i}Z" for i in range(10)]
LR = "actor_rollout_ref.actor.optim.lr"
OVERRIDES = ["actor_rollout_ref.model.path=/models/m", "critic.model.path=/models/m",
             "data.train_files=[/data/train.parquet]", "data.val_files=[/data/test.parquet]",
             "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
             "trainer.logger=[console,file]", "trainer.save_freq=10"]  # fmt: skip


def launch(run: Path, stamp: str, *extra: str, resume: str = "auto", knobs=None, sft=False):
    config, tail = ("gsm8k_sft", ["model.path=/models/m"]) if sft else ("gsm8k_ppo", OVERRIDES)
    return record_launch(run, stamp, "r", "sft" if sft else "ppo", config, [*tail, *extra],
                         resume=resume, knobs=knobs)  # fmt: skip


@pytest.fixture(scope="module")
def ppo_record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run = tmp_path_factory.mktemp("record") / "run"
    argv = ["--run-dir", str(run), "--stamp", STAMPS[0], "--recipe", "r", "--config-name",
            "gsm8k_ppo", "--knob", "ACTOR_LR=1e-6", "--", *OVERRIDES]  # fmt: skip
    assert main(argv) == 0  # python -m verl_gsm8k.resume
    (record,) = read_records(run)
    assert record["knobs"] == {"ACTOR_LR": "1e-6"}
    return record


def changed(record: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    assert key in leaves(record["config"]), f"{key} is not a key of the composed config"
    out = copy.deepcopy(record)
    parents, _, last = key.rpartition(".")
    get(out["config"], parents)[last] = value
    return out


def place(whole: Path, run: Path, stamps: dict[int, str]) -> None:
    for step, stamp in stamps.items():
        shutil.copytree(whole / "global_step_4", run / f"global_step_{step}")
        write_stamp(run, step, stamp)
    (run / TRACKER).write_text(str(max(stamps)))


def refused_line(capsys) -> str:
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("launch:")]
    return line


def test_the_same_command_relaunched_differs_in_nothing(tmp_path, ppo_record):
    run = tmp_path / "run"
    assert launch(run, STAMPS[1], f"{LR}=0.000001", knobs={"ACTOR_LR": "0.000001"}) == 0
    first, (second,) = ppo_record, read_records(run)
    second.update(git={"commit": "0" * 40, "dirty": True}, host={"name": "other"},
                  versions={"verl": "0.9.1", "torch": "other"}, recipe="other")  # fmt: skip
    assert first["knobs"] != second["knobs"] and differences(first, second) == []
    assert len(leaves(ppo_record["config"])) > 500  # the whole config is compared, not 5 keys


def other(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return [*value, "x"] if isinstance(value, list) else f"{value}x"


A, R, M = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model."
# Keys that make another experiment (docs/reliability.md), and keys that may change.
GUARDED = [f"{M}path", "critic.model.path", "algorithm.adv_estimator", "algorithm.gamma",
           "algorithm.lam", "algorithm.kl_ctrl.kl_coef", "algorithm.use_kl_in_reward",
           "algorithm.kl_penalty", LR, f"{A}optim.lr_warmup_steps_ratio", f"{A}optim.weight_decay",
           f"{A}optim.betas", f"{A}optim.clip_grad", "critic.optim.lr", "data.train_batch_size",
           f"{A}ppo_mini_batch_size", f"{A}ppo_epochs", f"{R}n", f"{R}temperature", f"{R}top_p",
           "data.train_files", "data.max_response_length", "reward.custom_reward_function.path",
           "reward.custom_reward_function.name", f"{A}use_kl_loss", f"{A}kl_loss_coef",
           f"{A}kl_loss_type", f"{A}clip_ratio_high", f"{A}entropy_coeff", f"{A}loss_agg_mode",
           f"{M}lora_rank", f"{M}lora_alpha", f"{M}target_modules", "data.seed"]  # fmt: skip
MAY_CHANGE = ["trainer.total_epochs", "trainer.total_training_steps", "trainer.save_freq",
              "trainer.test_freq", "trainer.max_actor_ckpt_to_keep", "trainer.resume_mode",
              "trainer.val_before_train", "trainer.log_val_generations", "trainer.logger",
              "trainer.experiment_name", "trainer.rollout_data_dir",
              f"{A}ppo_micro_batch_size_per_gpu", f"{A}ppo_max_token_len_per_gpu",
              f"{A}use_dynamic_bsz", f"{A}fsdp_config.param_offload",
              f"{R}gpu_memory_utilization", f"{R}enforce_eager", f"{R}tensor_model_parallel_size",
              f"{M}enable_gradient_checkpointing", "actor_rollout_ref.nccl_timeout",
              "trainer.v1.trainer_mode", f"{A}profiler.enable", "gsm8k_trace.samples",
              "ray_kwargs.ray_init.num_cpus", "trainer.nnodes",
              "trainer.n_gpus_per_node"]  # fmt: skip


def test_each_key_of_another_experiment_is_named_and_the_others_may_change(ppo_record):
    flat = leaves(ppo_record["config"])
    for key in GUARDED:
        value = other(flat[key])
        shown = [json.dumps(v) if not isinstance(v, str) else v for v in (flat[key], value)]
        line = f"{key} {shown[0]} -> {shown[1]}"
        assert differences(ppo_record, changed(ppo_record, key, value)) == [line]
    new = dict(ppo_record, stamp=STAMPS[5], recipe="other", config_name="other", knobs={},
               knob_keys={}, user_overrides=["x=1"], git=None, host={}, versions={})  # fmt: skip
    for key in MAY_CHANGE:
        new = changed(new, key, other(flat[key]))
    new["config"]["ray_kwargs"]["ray_init"]["runtime_env"] = {"env_vars": {"WANDB_DIR": "/w"}}
    new["config"]["gsm8k_guard"] = {"watchdog": {"mode": "warn"}, "keep_best": False}
    assert differences(ppo_record, new) == []
    assert not allowed("trainer.nnodes")  # PPO reshards it (RESHARDED); an SFT run refuses
    assert allowed("trainer.logger") and allowed("trainer.logger.3")  # "X.*" matches X too
    assert len(ALLOWED) < 60  # short enough to read in docs/


def test_numbers_lists_and_absent_keys():
    def rec(**config: Any) -> dict[str, Any]:
        return {"trainer": "ppo", "config": config}

    assert differences(rec(lr=1e-6, n=1, nan=float("nan")),
                       rec(lr="0.000001", n=1.0, nan=float("nan"))) == []  # fmt: skip
    assert differences(rec(flag=True), rec(flag=1)) == ["flag true -> 1"]
    assert differences(rec(m=["q", "k"]), rec(m=["k", "q"])) == ['m ["q", "k"] -> ["k", "q"]']
    assert differences(rec(a={"b": 1}, gone=None), rec(a={"b": 1, "c": 2})) == [
        "gone null -> (absent)", "a.c (absent) -> 2"]  # fmt: skip
    assert differences(rec(kwargs={}, ids=[]), rec()) == []  # an empty one holds no setting
    assert differences(rec(big=10**400), rec(big=10**400 + 1)) == [
        f"big {10**400} -> {10**400 + 1}"]  # fmt: skip
    assert differences(rec(), {"trainer": "sft", "config": {}}) == ["trainer ppo -> sft"]


def test_sft_configs_are_compared_the_same_way(tmp_path):
    run = tmp_path / "run"
    assert launch(run, STAMPS[0], sft=True) == 0
    (old,) = read_records(run)
    same = old
    for key, value in [
        ("trainer.total_epochs", 9), ("trainer.save_freq", 50), ("trainer.max_ckpt_to_keep", 2),
        ("trainer.logger", ["wandb"]), ("data.micro_batch_size_per_gpu", 1),
        ("data.max_token_len_per_gpu", 4096), ("engine.param_offload", True),
    ]:  # fmt: skip
        same = changed(same, key, value)
    assert differences(old, same) == []
    for key, value in [
        ("model.path", "/models/other"), ("optim.lr", 1e-4), ("data.train_batch_size", 64),
        ("data.max_length", 2048), ("trainer.seed", 3), ("model.lora_rank", 8),
        ("trainer.n_gpus_per_node", 2),  # an SFT checkpoint is not resharded
    ]:  # fmt: skip
        was = leaves(old["config"])[key]
        assert differences(old, changed(old, key, value)) == [f"{key} {was} -> {value}"]


def test_a_disable_launch_sets_the_earlier_run_aside_and_it_speaks_for_nothing(
    whole_checkpoints, tmp_path, capsys
):
    run = tmp_path / "run"
    assert launch(run, STAMPS[0]) == 0
    place(whole_checkpoints, run, {2: STAMPS[0], 4: STAMPS[0]})
    (run / "best_checkpoint.json").write_text('{"step": 2, "value": 0.9}')
    other = (f"{LR}=1e-4", "actor_rollout_ref.rollout.n=4")
    assert launch(run, STAMPS[1], *other, resume="disable") == 0
    aside = run / f"superseded-{STAMPS[1]}"
    assert f"moved to {aside} (nothing deleted" in capsys.readouterr().out
    moved = ["best_checkpoint.json", "global_step_2", "global_step_4", TRACKER]
    assert sorted(p.name for p in aside.iterdir()) == moved
    assert not list(run.glob("global_step_*"))
    assert launch(run, STAMPS[2], *other) == 0  # B's settings: a start, nothing to resume
    assert launch(run, STAMPS[3]) == 0  # A's: the same, its steps are aside, not lost
    assert (aside / "global_step_4" / "actor").is_dir() and len(read_records(run)) == 4


def test_the_guard_judges_the_step_verify_falls_back_to_and_a_refusal_changes_nothing(
    whole_checkpoints, tmp_path, capsys
):
    """Step 2 by A, step 4 by B (truncated): step 2 is compared with A."""
    run = tmp_path / "run"
    assert launch(run, STAMPS[0]) == 0
    assert launch(run, STAMPS[1], f"{LR}=1e-4", resume="force") == 0
    place(whole_checkpoints, run, {2: STAMPS[0], 4: STAMPS[1]})
    shard = run / "global_step_4" / "actor" / "model_world_size_2_rank_0.pt"
    shard.write_bytes(shard.read_bytes()[:1000])
    capsys.readouterr()
    assert launch(run, STAMPS[2], f"{LR}=1e-4") == 2
    line = refused_line(capsys)
    assert "checkpoint of step 2 " in line and f"differ from launch {STAMPS[0]}: " in line
    assert (run / TRACKER).read_text() == "4" and len(read_records(run)) == 2
    assert launch(run, STAMPS[3]) == 0
    out = capsys.readouterr().out
    assert f"resume: from global_step_2 instead ({TRACKER} now names it)" in out
    assert (run / TRACKER).read_text() == "2"


@pytest.mark.parametrize("stamp", [None, "20000101T000000Z"], ids=["no stamp", "no record"])
def test_without_the_writers_record_the_last_launch_is_compared(ppo_record, tmp_path, stamp):
    run = tmp_path / "run"
    first = changed(ppo_record, LR, 1e-6)
    last = dict(changed(ppo_record, LR, 3e-6), stamp=STAMPS[1])
    write_record(run, first)
    write_record(run, last)
    (run / "global_step_4").mkdir()
    if stamp:
        write_stamp(run, 4, stamp)
    assert refusal(run, 4, dict(first, stamp=STAMPS[2]), "auto") is not None
    assert refusal(run, 4, dict(last, stamp=STAMPS[2]), "auto") is None
    assert refusal(run, 4, dict(first, stamp=STAMPS[2]), "force") is None
    assert refusal(run, None, dict(first, stamp=STAMPS[2]), "auto") is None


def test_docs_name_every_key_that_may_change():
    page = (ROOT / "docs" / "reliability.md").read_text()
    assert [p for p in ALLOWED if f"`{p}`" not in page] == []


def test_verification_follows_what_verl_loads(tmp_path, whole_checkpoints, capsys):
    run = tmp_path / "run"
    place(whole_checkpoints, run, {2: STAMPS[0], 4: STAMPS[0]})
    for shard in run.glob("global_step_*/*/optim_world_size_*_rank_*.pt"):
        shard.unlink()
    no_optim = ["actor_rollout_ref.actor.checkpoint.save_contents=[model,extra]",
                "critic.checkpoint.save_contents=[model,extra]"]  # fmt: skip
    assert launch(run, STAMPS[0], *no_optim) == 0
    (record,) = read_records(run)
    assert record["config"]["critic"]["checkpoint"]["load_contents"] == ["model", "extra"]
    assert "resume: global_step_4 is whole (every shard checked)" in capsys.readouterr().out
    assert launch(run, STAMPS[1]) == 2
    assert "missing optim_world_size_2_rank_0.pt" in refused_line(capsys)


def test_a_resume_on_another_number_of_gpus_is_resharded_before_verl_starts(
    whole_checkpoints, tmp_path, capsys
):
    run = tmp_path / "run"
    assert launch(run, STAMPS[0], "trainer.n_gpus_per_node=2") == 0
    place(whole_checkpoints, run, {2: STAMPS[0], 4: STAMPS[0]})
    capsys.readouterr()
    one = "trainer.n_gpus_per_node=1"
    assert launch(run, STAMPS[1], one) == 0
    out = capsys.readouterr().out
    for role in ("actor", "critic"):
        said = f"reshard: global_step_4/{role} was saved at world size 2: rewritten for 1 "
        assert said in out, out
        folder = run / "global_step_4" / role
        assert json.loads((folder / "fsdp_config.json").read_text())["world_size"] == 1
        assert not list((run / "global_step_2" / role).glob("*_world_size_1_*"))
    assert out.index("reshard: global_step_4 resharded in") < out.index("launch: recorded")
    assert launch(run, STAMPS[2], one) == 0
    assert "reshard:" not in capsys.readouterr().out  # already at one rank
    assert launch(run, STAMPS[3], one, "trainer.nnodes=2") == 0
    assert "global_step_4/critic was saved at world size 1: rewritten for 2 " in (
        capsys.readouterr().out)  # fmt: skip

"""The same-config check (verl_gsm8k/resume/same_config.py): a relaunch is compared, key by key
over the resolved config, with the launch that WROTE the checkpoint it would resume. Launches are
the launcher's own main() (python -m verl_gsm8k.resume: the installed verl config composed by Hydra,
a real record written); the checkpoints are real FSDP ones of verl's checkpoint manager
(tests/conftest.py's ``whole_checkpoints``), stamped as the recipes' trainer stamps them."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from verl_gsm8k.common.launch_record import read_records, write_record
from verl_gsm8k.common.run_dir import TRACKER, write_stamp
from verl_gsm8k.resume.__main__ import main
from verl_gsm8k.resume.same_config import ALLOWED, allowed, differences, leaves, refusal

STAMPS = [f"20261125T10000{i}Z" for i in range(10)]


def overrides(model: str = "/models/m", data: str = "/data") -> list[str]:
    """What a recipe hands the launcher: the model, the data, the run's keys."""
    return [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
            f"data.train_files=[{data}/train.parquet]", f"data.val_files=[{data}/test.parquet]",
            "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "trainer.logger=[console,file]", "trainer.save_freq=10"]  # fmt: skip


def launch(run: Path, stamp: str, *extra: str, resume: str = "auto", knobs=(), trainer="ppo"):
    """One launch as the launcher (verl_gsm8k/launch/) runs it: its exit status."""
    config = "gsm8k_ppo" if trainer == "ppo" else "gsm8k_sft"
    argv = ["--run-dir", str(run), "--stamp", stamp, "--recipe", "r", "--trainer", trainer,
            "--config-name", config, "--resume", resume]  # fmt: skip
    for knob in knobs:
        argv += ["--knob", knob]
    tail = overrides() if trainer == "ppo" else ["model.path=/models/m"]
    return main([*argv, "--", *tail, *extra])


@pytest.fixture(scope="module")
def ppo_record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run = tmp_path_factory.mktemp("record") / "run"
    assert launch(run, STAMPS[0]) == 0
    (record,) = read_records(run)
    return record


def changed(record: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy of ``record`` with the leaf ``key`` of its config set (it must exist)."""
    out = copy.deepcopy(record)
    *parents, last = key.split(".")
    node: Any = out["config"]
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        assert last in node, f"{key} is not a key of the composed config"
        node[last] = value
    return out


def place(whole: Path, run: Path, stamps: dict[int, str]) -> None:
    """Whole checkpoints at the steps of ``stamps`` (the tracker naming the last), each stamped
    with the launch that saved it."""
    for step, stamp in stamps.items():
        shutil.copytree(whole / "global_step_4", run / f"global_step_{step}")
        write_stamp(run, step, stamp)
    (run / TRACKER).write_text(str(max(stamps)))


def refused_line(capsys) -> str:
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("launch:")]
    return line


def test_the_same_command_relaunched_differs_in_nothing(tmp_path, ppo_record):
    """Two launches of one command: stamps, knobs as written (1e-6 or 0.000001), git, host and
    versions may differ; the resolved configs do not."""
    run = tmp_path / "run"
    lr = "actor_rollout_ref.actor.optim.lr"
    assert launch(run, STAMPS[0], f"{lr}=1e-6", knobs=["ACTOR_LR=1e-6"]) == 0
    assert launch(run, STAMPS[1], f"{lr}=0.000001", knobs=["ACTOR_LR=0.000001"]) == 0
    first, second = read_records(run)
    second.update(git={"commit": "0" * 40, "dirty": True}, host={"name": "other"},
                  versions={"verl": "0.9.1", "torch": "other"}, recipe="other")  # fmt: skip
    assert first["knobs"] != second["knobs"] and differences(first, second) == []
    assert len(leaves(ppo_record["config"])) > 500  # the whole config is compared, not 5 keys


# A key of each kind that makes another experiment, and a value it takes in another one.
GUARDED = [
    ("actor_rollout_ref.model.path", "/models/other"),
    ("critic.model.path", "/models/other"),
    ("algorithm.adv_estimator", "grpo"),
    ("algorithm.gamma", 0.99),
    ("algorithm.lam", 0.95),
    ("algorithm.kl_ctrl.kl_coef", 0.01),
    ("algorithm.use_kl_in_reward", "not"),
    ("algorithm.kl_penalty", "low_var_kl"),
    ("actor_rollout_ref.actor.optim.lr", 2e-6),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", 0.1),
    ("actor_rollout_ref.actor.optim.weight_decay", 0.1),
    ("actor_rollout_ref.actor.optim.betas.1", 0.95),
    ("actor_rollout_ref.actor.optim.clip_grad", 5.0),
    ("critic.optim.lr", 1e-4),
    ("data.train_batch_size", 32),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", 4),
    ("actor_rollout_ref.actor.ppo_epochs", 2),
    ("actor_rollout_ref.rollout.n", 5),
    ("actor_rollout_ref.rollout.temperature", 0.7),
    ("actor_rollout_ref.rollout.top_p", 0.9),
    ("data.train_files.0", "/data/other.parquet"),
    ("data.max_response_length", 1024),
    ("reward.custom_reward_function.path", "/rewards/other.py"),
    ("reward.custom_reward_function.name", "compute_score_flexible"),
    ("actor_rollout_ref.actor.use_kl_loss", "not"),
    ("actor_rollout_ref.actor.kl_loss_coef", 0.01),
    ("actor_rollout_ref.actor.kl_loss_type", "k1"),
    ("actor_rollout_ref.actor.clip_ratio_high", 0.28),
    ("actor_rollout_ref.actor.entropy_coeff", 0.001),
    ("actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-mean"),
    ("actor_rollout_ref.model.lora_rank", 32),
    ("actor_rollout_ref.model.lora_alpha", 64),
    ("actor_rollout_ref.model.target_modules", "q_proj"),
    ("data.seed", 7),
]


@pytest.mark.parametrize(("key", "value"), GUARDED, ids=[key for key, _ in GUARDED])
def test_each_key_of_another_experiment_is_named(ppo_record, key, value):
    old = leaves(ppo_record["config"])[key]
    value = (not old) if value == "not" else value  # a switch: the other way
    assert str(old) != str(value)

    def shown(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v)

    line = f"{key} {shown(old)} -> {shown(value)}"
    assert differences(ppo_record, changed(ppo_record, key, value)) == [line]


def test_the_keys_that_may_change_on_a_resume(ppo_record):
    new = copy.deepcopy(ppo_record)
    new.update(stamp=STAMPS[5], recipe="other", config_name="other", knobs={}, knob_keys={},
               user_overrides=["trainer.total_epochs=30"], git=None, host={},
               versions={})  # fmt: skip
    for key, value in [
        ("trainer.total_epochs", 30), ("trainer.total_training_steps", 400),
        ("trainer.save_freq", 5), ("trainer.test_freq", 1), ("trainer.max_actor_ckpt_to_keep", 1),
        ("trainer.resume_mode", "resume_path"), ("trainer.val_before_train", False),
        ("trainer.log_val_generations", 0), ("trainer.logger.1", "wandb"),
        ("trainer.experiment_name", "renamed"), ("trainer.rollout_data_dir", "/elsewhere"),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 2),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 4096),
        ("actor_rollout_ref.actor.use_dynamic_bsz", False),
        ("actor_rollout_ref.actor.fsdp_config.param_offload", True),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", 0.8),
        ("actor_rollout_ref.rollout.enforce_eager", False),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 2),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
        ("actor_rollout_ref.nccl_timeout", 1800), ("trainer.v1.trainer_mode", "gsm8k"),
        ("actor_rollout_ref.actor.profiler.enable", True), ("gsm8k_trace.samples", 0),
        ("ray_kwargs.ray_init.num_cpus", 64),
    ]:  # fmt: skip
        new = changed(new, key, value)
    new = changed(changed(new, "trainer.nnodes", 2), "trainer.n_gpus_per_node", 4)  # resharded
    new["config"]["trainer"]["logger"].append("tensorboard")  # a key the old record lacks
    new["config"]["ray_kwargs"]["ray_init"]["runtime_env"] = {"env_vars": {"WANDB_DIR": "/w"}}
    new["config"]["gsm8k_guard"] = {"watchdog": {"mode": "warn"}, "keep_best": False}
    assert differences(ppo_record, new) == []
    assert not allowed("trainer.nnodes") and not allowed("data.train_batch_size")
    assert allowed("trainer.logger") and allowed("trainer.logger.3")  # "X.*" matches X too
    assert len(ALLOWED) < 60  # short enough to read in docs/


def test_numbers_lists_and_absent_keys():
    def rec(**config: Any) -> dict[str, Any]:
        return {"trainer": "ppo", "config": config}

    assert differences(rec(lr=1e-6, n=1), rec(lr="0.000001", n=1.0)) == []
    assert differences(rec(flag=True), rec(flag=1)) == ["flag true -> 1"]
    assert differences(rec(m=["q", "k"]), rec(m=["q", "v", "o"])) == [
        "m.1 k -> v", "m.2 (absent) -> o"]  # fmt: skip
    assert differences(rec(a={"b": 1}, gone=None), rec(a={"b": 1, "c": 2})) == [
        "gone null -> (absent)", "a.c (absent) -> 2"]  # fmt: skip
    assert differences(rec(kwargs={}), rec()) == []  # an empty mapping holds no setting
    assert differences(rec(), {"trainer": "sft", "config": {}}) == ["trainer ppo -> sft"]


def test_sft_configs_are_compared_the_same_way(tmp_path):
    run = tmp_path / "run"
    assert launch(run, STAMPS[0], trainer="sft") == 0
    (old,) = read_records(run)
    same = copy.deepcopy(old)
    for key, value in [
        ("trainer.total_epochs", 9), ("trainer.save_freq", 50), ("trainer.max_ckpt_to_keep", 2),
        ("trainer.logger.0", "wandb"), ("data.micro_batch_size_per_gpu", 1),
        ("data.max_token_len_per_gpu", 4096), ("engine.param_offload", True),
        ("trainer.profile_interval.0", 3),
    ]:  # fmt: skip
        same = changed(same, key, value)
    assert differences(old, same) == []
    for key, value in [
        ("model.path", "/models/other"),
        ("optim.lr", 1e-4),
        ("data.train_batch_size", 64),
        ("data.max_length", 2048),
        ("trainer.seed", 3),
        ("model.lora_rank", 8),
        ("trainer.n_gpus_per_node", 2),
    ]:  # an SFT checkpoint is not resharded
        was = leaves(old["config"])[key]
        assert differences(old, changed(old, key, value)) == [f"{key} {was} -> {value}"]


def test_a_disable_launch_sets_the_earlier_run_aside_and_it_speaks_for_nothing(
    whole_checkpoints, tmp_path, capsys
):
    """A saved steps 2 and 4; B started over (RESUME=disable) with other settings and died before
    its first save. B's launch moved A's checkpoints aside (they would crowd out B's lower step
    numbers: docs/reliability.md, "What survives what"), so no relaunch resumes them, nothing is
    refused, nothing is deleted: they stay in superseded-<B's stamp>/."""
    run = tmp_path / "run"
    assert launch(run, STAMPS[0]) == 0
    place(whole_checkpoints, run, {2: STAMPS[0], 4: STAMPS[0]})
    other = ("actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.rollout.n=4")
    assert launch(run, STAMPS[1], *other, resume="disable") == 0
    aside = run / f"superseded-{STAMPS[1]}"
    assert f"moved to {aside}" in capsys.readouterr().out
    assert sorted(p.name for p in aside.iterdir()) == ["global_step_2", "global_step_4", TRACKER]
    assert not list(run.glob("global_step_*"))
    assert launch(run, STAMPS[2], *other) == 0  # B's settings: a start, nothing to resume
    assert launch(run, STAMPS[3]) == 0  # A's: the same, its steps are aside, not lost
    assert (aside / "global_step_4" / "actor").is_dir() and len(read_records(run)) == 4


def test_the_guard_judges_the_step_verify_falls_back_to_and_a_refusal_changes_nothing(
    whole_checkpoints, tmp_path, capsys
):
    """Step 2 was saved by A (lr 1e-6), step 4 by B (lr 1e-4, forced) and is truncated: the
    launch resumes step 2, so it is compared with A; refused, the tracker still names 4."""
    run = tmp_path / "run"
    lr = "actor_rollout_ref.actor.optim.lr"
    assert launch(run, STAMPS[0]) == 0
    assert launch(run, STAMPS[1], f"{lr}=1e-4", resume="force") == 0
    place(whole_checkpoints, run, {2: STAMPS[0], 4: STAMPS[1]})
    shard = run / "global_step_4" / "actor" / "model_world_size_2_rank_0.pt"
    shard.write_bytes(shard.read_bytes()[:1000])
    capsys.readouterr()
    assert launch(run, STAMPS[2], f"{lr}=1e-4") == 2
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
    lr = "actor_rollout_ref.actor.optim.lr"
    first = changed(ppo_record, lr, 1e-6)
    last = dict(changed(ppo_record, lr, 3e-6), stamp=STAMPS[1])
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
    page = (Path(__file__).resolve().parents[1] / "docs" / "resume.md").read_text()
    assert [p for p in ALLOWED if f"`{p}`" not in page] == []


def test_verification_follows_what_verl_loads(tmp_path, whole_checkpoints, capsys):
    """save_contents=[model,extra] (docs/reliability.md, "What survives what"): verl writes no
    optimizer shard and, its load_contents following save_contents, resumes without one; the
    launch must resume such a checkpoint, and still refuse one that lacks a shard verl does
    load."""
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
    # the default load_contents (model, optimizer, extra): no step is whole, nothing is launched
    assert launch(run, STAMPS[1]) == 2
    assert "missing optim_world_size_2_rank_0.pt" in refused_line(capsys)


def test_a_resume_on_another_number_of_gpus_is_resharded_before_verl_starts(
    whole_checkpoints, tmp_path, capsys
):
    """Saved at world size 2, resumed on one GPU: the launch rewrites the step it resumes for
    one rank (verl_gsm8k/reshard/, tests/test_reshard.py for what the shards then hold), keeps
    the original files, and leaves the other steps as they are; back on two GPUs, the same."""
    run = tmp_path / "run"
    assert launch(run, STAMPS[0], "trainer.n_gpus_per_node=2") == 0
    place(whole_checkpoints, run, {2: STAMPS[0], 4: STAMPS[0]})
    capsys.readouterr()
    one = "trainer.n_gpus_per_node=1"  # the recipes' one GPU
    assert launch(run, STAMPS[1], one) == 0
    out = capsys.readouterr().out
    for role in ("actor", "critic"):
        said = f"reshard: global_step_4/{role} was saved at world size 2: rewritten for 1 "
        assert said in out, out
        folder = run / "global_step_4" / role
        assert json.loads((folder / "fsdp_config.json").read_text())["world_size"] == 1
        assert (folder / "model_world_size_1_rank_0.pt").is_file()
        assert (folder / "model_world_size_2_rank_1.pt").is_file()  # kept
        assert not list((run / "global_step_2" / role).glob("*_world_size_1_*"))
    assert out.index("reshard: global_step_4 resharded in") < out.index("launch: recorded")
    assert launch(run, STAMPS[2], one) == 0
    assert "reshard:" not in capsys.readouterr().out  # already at one rank
    assert launch(run, STAMPS[3], one, "trainer.nnodes=2") == 0
    assert (
        "global_step_4/critic was saved at world size 1: rewritten for 2 "
        in capsys.readouterr().out
    )

"""Each planted mistake is caught by the preflight with its message; a correct config passes.

The preflight runs in-process on the override list that the launcher really builds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import (
    QWEN25_05B,
    ROOT,
    prepare,
    recipe_env,
    refusing_port,
    write_synthetic_gsm8k,
)

from verl_gsm8k.launch.plan import bare_overrides as recipe_overrides
from verl_gsm8k.preflight import cli as preflight
from verl_gsm8k.preflight.model import count_parameters


@pytest.fixture(scope="module")
def base_overrides(tiny_model_dir, prepared_gsm8k_dir, tmp_path_factory) -> list[str]:
    # No trace (tests/test_trace.py checks the preflight's trace line); the recipes' trainer is
    # selected all the same, with its plugin (recipes_trainer_plugin below).
    env = recipe_env(
        tiny_model_dir, prepared_gsm8k_dir, tmp_path_factory.mktemp("runs"), TRACE_SAMPLES="0"
    )
    return recipe_overrides("gsm8k_ppo", env)


@pytest.fixture(autouse=True)
def recipes_trainer_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the launcher exports for every PPO launch: the module that registers the
    recipes' trainer (trainer.v1.trainer_mode=gsm8k), which this in-process preflight checks."""
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "verl_gsm8k.verl_plugins.register_trainer")


def run_preflight(overrides: list[str], config: str = "gsm8k_ppo") -> preflight.Report:
    return preflight.run(config, ROOT / "configs", overrides, None)


def errors(report: preflight.Report) -> str:
    return "\n".join(line for line in report.lines if "[error]" in line)


def test_correct_config_passes(base_overrides):
    report = run_preflight(base_overrides)
    assert report.errors == 0, "\n".join(report.lines)
    checks = {line.split("]", 1)[1].split(":", 1)[0].strip() for line in report.lines}
    assert {"keys", "config", "model", "data", "reward", "gpu"} <= checks


# Planted mistake -> the text its error must contain (the right key, or the exact problem).
MISTAKES = {
    "unknown key": (
        ["actor_rollout_ref.actor.optim.lrr=1e-6"],
        "unknown key 'actor_rollout_ref.actor.optim.lrr' in the installed verl config; "
        "did you mean actor_rollout_ref.actor.optim.lr",
    ),
    "unknown leaf moved elsewhere": (
        ["trainer.n_gpus=1"],
        "did you mean trainer.n_gpus_per_node",
    ),
    "top-level custom_reward_function": (
        ["custom_reward_function.path=/x/reward.py"],
        "use reward.custom_reward_function.path",
    ),
    "clip_ratio alone": (
        ["actor_rollout_ref.actor.clip_ratio=0.3"],
        "set actor_rollout_ref.actor.clip_ratio_low and actor_rollout_ref.actor.clip_ratio_high",
    ),
    "actor lora": (
        ["actor_rollout_ref.actor.lora.rank=16"],
        "use actor_rollout_ref.model.lora_rank",
    ),
    "critic fsdp_config": (
        ["critic.model.fsdp_config.param_offload=True"],
        "use critic.fsdp.param_offload",
    ),
    "reward_model.reward_manager": (
        ["reward_model.reward_manager=naive"],
        "use reward.reward_manager.name",
    ),
    "balance_batch in v1": (
        ["trainer.balance_batch=True"],
        "'trainer.balance_batch' is ignored by verl's v1 trainer (trainer.use_v1=true, the "
        "default): the v1 trainer balances every batch",
    ),
    "critic token budget in v1": (
        ["critic.ppo_max_token_len_per_gpu=8192"],
        "use critic.ppo_infer_max_token_len_per_gpu",
    ),
    "val do_sample": (
        ["actor_rollout_ref.rollout.val_kwargs.do_sample=False"],
        "validation is greedy when val_kwargs.temperature is 0",
    ),
    "fsdp_config.strategy": (
        ["actor_rollout_ref.actor.fsdp_config.strategy=fsdp2"],
        "use actor_rollout_ref.actor.strategy",
    ),
    "verl validate_config": (
        ["actor_rollout_ref.actor.use_dynamic_bsz=False", "critic.use_dynamic_bsz=False"],
        "verl validate_config: [actor] Please set at least one of 'actor.ppo_micro_batch_size'",
    ),
    "batch not divisible by GPUs": (
        ["trainer.n_gpus_per_node=3"],
        "train_batch_size x rollout.n = 128 responses must be divisible by the 3 GPUs",
    ),
    "mini-batch larger than batch": (
        ["actor_rollout_ref.actor.ppo_mini_batch_size=256"],
        "actor_rollout_ref.actor.ppo_mini_batch_size=256 is larger than data.train_batch_size=128",
    ),
    "batch does not split into mini-batches": (
        ["data.train_batch_size=96", "actor_rollout_ref.actor.ppo_mini_batch_size=64"],
        "data.train_batch_size=96 does not split into mini-batches of "
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    ),
    "no GPU per node": (["trainer.n_gpus_per_node=0"], "trainer.n_gpus_per_node=0: must be"),
    "no response per prompt": (
        ["actor_rollout_ref.rollout.n=0"],
        "actor_rollout_ref.rollout.n=0: must be at least 1",
    ),
    "missing model": (
        ["actor_rollout_ref.model.path=/nonexistent/model"],
        "actor model path '/nonexistent/model' does not exist",
    ),
    "context too short": (
        ["data.max_prompt_length=4000", "data.max_response_length=1000"],
        "max_prompt_length + max_response_length = 5000 > context 4096",
    ),
    "missing train file": (
        ["data.train_files=['/nonexistent/train.parquet']"],
        "train file /nonexistent/train.parquet does not exist",
    ),
    "batch larger than data": (["data.train_batch_size=512"], "not one full batch"),
    "an override Hydra cannot parse": (
        ["data.train_files=$(x)"],
        "override 'data.train_files=$(x)' is not in Hydra's override grammar (mismatched input",
    ),
    "unknown reward function": (
        ["reward.custom_reward_function.name=compute_scor"],
        "functions in that file: compute_score",
    ),
    "missing reward file": (
        ["reward.custom_reward_function.path=/nonexistent/reward.py"],
        "reward file /nonexistent/reward.py does not exist",
    ),
    "async save on FSDP (no tracker: a relaunch starts over)": (
        ["actor_rollout_ref.actor.checkpoint.async_save=True"],
        "actor.checkpoint.async_save=true with strategy fsdp2",
    ),
    "more checkpoints kept than the disk holds": (
        ["trainer.max_actor_ckpt_to_keep=1000000000", "trainer.save_freq=1"],
        "the disk fills before the run ends",
    ),
    "run directory inside a file (RUNS_ROOT)": (
        [f"trainer.default_local_dir={ROOT}/README.md/run"],
        f"trainer.default_local_dir cannot be made: {ROOT}/README.md is not a writable directory",
    ),
    "a run name longer than the filesystem allows (EXPERIMENT_NAME)": (
        [f"trainer.default_local_dir=/tmp/{'a' * 300}"],
        "trainer.default_local_dir cannot be made: File name too long",
    ),
    "prompts too long with truncation=error": (
        ["data.max_prompt_length=20", "data.filter_overlong_prompts=False"],
        "prompts exceed max_prompt_length 20",
    ),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_planted_mistake_is_caught(name, base_overrides):
    extra, expected = MISTAKES[name]
    report = run_preflight(base_overrides + extra)
    assert report.errors >= 1, "\n".join(report.lines)
    assert expected in errors(report), "\n".join(report.lines)


# One planted key for every row of the preflight's key tables -> the value for the key it
# suggests instead. Each suggestion, as printed, must compose against our configs.
SUGGESTED = {
    "custom_reward_function.path=/x/reward.py": "/x/reward.py",
    "actor_rollout_ref.actor.lora.rank=16": "16",
    "actor_rollout_ref.actor.lora.alpha=16": "16",
    "actor_rollout_ref.actor.lora.target_modules=all-linear": "all-linear",
    "critic.model.fsdp_config.param_offload=True": "True",
    "critic.fsdp_config.optimizer_offload=True": "True",
    "reward_model.reward_manager=naive": "naive",
    "reward_model.reward_kwargs.max_resp_len=256": "256",
    "reward_model.enable=False": "False",
    "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2": "fsdp2",
    "actor_rollout_ref.ref.fsdp_config.strategy=fsdp2": "fsdp2",
    "critic.fsdp.strategy=fsdp2": "fsdp2",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=False": "0",
    "trainer.balance_batch=True": None,  # "remove it"
    "critic.ppo_max_token_len_per_gpu=8192": "8192",
    "actor_rollout_ref.actor.clip_ratio=0.3": "0.3",
}


def suggestions(line: str) -> list[str]:
    """The keys an error line tells to use ("; use K" or "; set K and K"), as printed."""
    tail = line.rsplit("; ", 1)[1]
    if tail == "remove it":
        return []
    verb, _, keys = tail.partition(" ")
    assert verb in ("use", "set"), line
    return keys.split(" and ")


def test_every_suggested_key_composes(base_overrides):
    from verl_gsm8k.preflight.compose import split_override

    planted = [split_override(o)[0] for o in SUGGESTED]
    rows = list(preflight.LEGACY_KEYS) + list(preflight.V1_IGNORED_KEYS)
    for row in rows:  # every row of the tables has its planted key here
        assert any(k == row or (row.endswith(".") and k.startswith(row)) for k in planted), row
    cfg = preflight.compose(ROOT / "configs", "gsm8k_ppo", base_overrides)
    for override, value in SUGGESTED.items():
        report = preflight.Report()
        clean = preflight.check_legacy_keys([override], report)
        preflight.check_trainer_keys(cfg, [override], report, clean)
        (line,) = [ln for ln in report.lines if "[error] keys" in ln]
        keys = suggestions(line)
        assert bool(keys) == (value is not None), line
        fixed = [f"{key}={value}" for key in keys]
        fixed_cfg = preflight.compose(ROOT / "configs", "gsm8k_ppo", base_overrides + fixed)
        again = preflight.Report()  # and the keys it suggests are not refused in their turn
        preflight.check_trainer_keys(
            fixed_cfg, fixed, again, preflight.check_legacy_keys(fixed, again)
        )
        assert again.errors == 0, (line, again.lines)


def test_legacy_trainer_keys_are_accepted_where_the_legacy_trainer_runs(base_overrides):
    """trainer.use_v1=false (the LoRA recipe): verl's legacy trainer reads both keys
    (trainer/ppo/ray_trainer.py ~811 and ~1549), so they are not refused there."""
    keys = ["trainer.balance_batch=False", "critic.ppo_max_token_len_per_gpu=8192"]
    for config, extra in (("gsm8k_ppo", ["trainer.use_v1=false"]), ("gsm8k_ppo_lora", [])):
        cfg = preflight.compose(ROOT / "configs", config, base_overrides + extra + keys)
        report = preflight.Report()
        preflight.check_trainer_keys(cfg, extra + keys, report, True)
        assert report.errors == 0, report.lines
        assert "none the legacy trainer (trainer.use_v1=false) ignores" in report.lines[-1]
    lora = preflight.compose(ROOT / "configs", "gsm8k_ppo_lora", base_overrides)
    assert lora.trainer.use_v1 is False and lora.trainer.balance_batch is True
    assert lora.critic.ppo_max_token_len_per_gpu == 16384  # not the legacy default 32768


def test_esi_redundant_time_under_the_v1_trainer_is_said_not_refused(base_overrides):
    """verl 0.9.1 reads trainer.esi_redundant_time only in the legacy trainer (docs/reliability.md,
    "Preemption"): under v1 the preflight warns (the launch goes on), under the legacy trainer it
    is silent."""
    key = ["trainer.esi_redundant_time=300"]
    for extra, warned in (([], True), (["trainer.use_v1=false"], False)):
        cfg = preflight.compose(ROOT / "configs", "gsm8k_ppo", base_overrides + extra + key)
        report = preflight.Report()
        preflight.check_trainer_keys(cfg, extra + key, report, True)
        warnings = [ln for ln in report.lines if "[warn" in ln and "esi_redundant_time" in ln]
        assert report.errors == 0, report.lines
        assert bool(warnings) == warned, (extra, report.lines)
        assert all("STOP_GRACE_S" in line for line in warnings), warnings  # what to use instead


def test_bad_schema_names_the_file_and_columns(base_overrides, tmp_path):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["q"], "answer": ["#### 1"]}), bad)
    report = run_preflight(base_overrides + [f"data.val_files=['{bad}']"])
    assert f"val file {bad}: missing column(s) prompt, data_source, reward_model" in errors(report)


def test_a_reward_that_cannot_tell_right_from_wrong_fails(base_overrides, tmp_path):
    reward = tmp_path / "always_one.py"
    reward.write_text("def compute_score(**kwargs):\n    return 1.0\n")
    report = run_preflight(base_overrides + [f"reward.custom_reward_function.path={reward}"])
    assert "does not separate them" in errors(report)


def test_hub_id_unreachable_is_said_clearly(base_overrides, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # empty cache
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    report = run_preflight(
        base_overrides + ["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"]
    )
    message = errors(report)
    assert "'Qwen/Qwen2.5-0.5B-Instruct' is a hub id, not cached here" in message
    assert "the hub cannot be reached from this machine: http://127.0.0.1:9" in message


def test_lora_rank_is_checked_without_vllm(base_overrides):
    lora = ["actor_rollout_ref.model.lora_rank=1000"]
    report = run_preflight(base_overrides + lora, config="gsm8k_ppo_lora")
    assert "LoRA rank 1000 is above vLLM's maximum 512" in errors(report)
    report = run_preflight(
        base_overrides
        + ["actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.rollout.load_format=auto"],
        config="gsm8k_ppo_lora",
    )
    assert "needs actor_rollout_ref.rollout.load_format=safetensors" in errors(report)


def test_parameter_count_matches_the_published_qwen_size():
    from transformers import Qwen2Config

    assert count_parameters(Qwen2Config(**QWEN25_05B)) == 494_032_768


def test_cli_prints_time_and_exits_nonzero_on_error(base_overrides):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_gsm8k.preflight",
            "--",
            *base_overrides,
            "custom_reward_function.path=/x.py",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "preflight: FAILED with 1 error(s)" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_grpo_with_one_response_per_prompt_is_said_not_refused(base_overrides):
    """verl runs GRPO at rollout.n=1 (the raw score as the advantage): a warning, the launch goes
    on; rloo_vectorized there trains nothing (every advantage 0): refused."""
    report = run_preflight(base_overrides + ["actor_rollout_ref.rollout.n=1"], config="gsm8k_grpo")
    assert report.errors == 0, "\n".join(report.lines)
    warned = [line for line in report.lines if "[warn] algorithm:" in line]
    assert len(warned) == 1 and "adv_estimator=grpo compares the responses" in warned[0], warned
    vectorized = ["actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=rloo_vectorized"]
    report = run_preflight(base_overrides + vectorized, config="gsm8k_grpo")
    assert "the advantage is 0 for every response" in errors(report)
    report = run_preflight(base_overrides + ["actor_rollout_ref.rollout.n=4"], config="gsm8k_grpo")
    assert report.errors == 0, "\n".join(report.lines)


def test_kl_in_the_reward_and_in_the_loss_is_said_not_refused(base_overrides):
    """verl runs both at once (it prints a notice): a warning that says so, and the launch goes on
    with the algorithm line naming both."""
    both = ["algorithm.use_kl_in_reward=True", "actor_rollout_ref.rollout.n=4"]
    report = run_preflight(base_overrides + both, config="gsm8k_grpo")
    assert report.errors == 0, "\n".join(report.lines)
    warned = [line for line in report.lines if "[warn] algorithm:" in line]
    assert len(warned) == 1 and "verl allows this" in warned[0], "\n".join(report.lines)
    assert "charges the KL to the reference twice" in warned[0]
    assert any(
        "[ok] algorithm:" in line and "KL in the reward and in the loss" in line
        for line in report.lines
    ), "\n".join(report.lines)


def test_reward_is_tried_in_the_format_the_prompts_ask_for(base_overrides, tmp_path):
    """Boxed prompts with the #### reward would score every response 0: caught, with the fix."""
    boxed = prepare(
        write_synthetic_gsm8k(tmp_path / "src"), tmp_path / "boxed", "--prompt-style", "boxed"
    )
    files = [
        f"data.train_files=['{boxed}/train.parquet']",
        f"data.val_files=['{boxed}/test.parquet']",
    ]
    report = run_preflight(base_overrides + files)
    message = errors(report)
    assert "compute_score scores a right \\boxed{} answer 0.0 and a wrong one 0.0" in message
    assert "REWARD_FN=compute_score_flexible" in message
    flexible = ["reward.custom_reward_function.name=compute_score_flexible"]
    report = run_preflight(base_overrides + files + flexible)
    assert report.errors == 0, "\n".join(report.lines)
    assert "right \\boxed{} answer -> 1.0, wrong -> 0.0" in "\n".join(report.lines)


@pytest.mark.parametrize(
    "right,wrong,shown",
    [
        ("None", "None", "returned None for a right answer"),
        ('"1.0"', '"0.0"', "returned '1.0' for a right answer"),  # "1.0" > "0.0" as strings
        ("True", "False", "returned True for a right answer"),
        ('{"acc": 1.0}', '{"acc": 0.0}', "returned a dict without 'score' (keys: acc)"),
        ('{"score": "1"}', '{"score": "0"}', "returned a dict with score '1' for a right"),
    ],
)
def test_a_reward_must_return_a_number(base_overrides, tmp_path, right, wrong, shown):
    reward = tmp_path / "odd_reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        f"    return {right} if solution_str.endswith(ground_truth) else {wrong}\n"
    )
    report = run_preflight(base_overrides + [f"reward.custom_reward_function.path={reward}"])
    (line,) = [line for line in report.lines if "[error]" in line]
    assert shown in line, line
    assert "a reward must return a number, or a dict with a numeric 'score'" in line


def test_an_unreachable_hub_is_said_in_seconds(base_overrides, tmp_path):
    """Without the early probe, verl's validate_config retried the hub for ~50 s."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    }
    hub_model = "Qwen/Qwen2.5-0.5B-Instruct"
    # the "hub" refuses at once, for the whole run
    with refusing_port() as port:
        endpoint = f"http://127.0.0.1:{port}"
        env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"))
        start = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "verl_gsm8k.preflight", "--", *base_overrides,
             f"actor_rollout_ref.model.path={hub_model}", f"critic.model.path={hub_model}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )  # fmt: skip
    elapsed = time.monotonic() - start
    assert result.returncode == 1
    assert f"the hub cannot be reached from this machine: {endpoint}" in result.stdout
    assert elapsed < 30, f"{elapsed:.0f} s"


def test_calculate_entropy_is_a_costly_warning(base_overrides):
    report = run_preflight(base_overrides + ["actor_rollout_ref.actor.calculate_entropy=True"])
    warned = [line for line in report.lines if "[warn] keys:" in line]
    assert report.errors == 0 and len(warned) == 1, "\n".join(report.lines)
    assert "both trainers log actor/entropy without it" in warned[0]


def test_checkpoint_size_and_free_space_are_said(base_overrides):
    keep = ["trainer.max_actor_ckpt_to_keep=2"]
    report = run_preflight(base_overrides + keep + ["trainer.v1.trainer_mode=sync"])  # verl's own
    (line,) = [x for x in report.lines if "] checkpoint:" in x]
    assert "[ok] checkpoint:" in line and "x 2 kept" in line and "GiB free at" in line, line
    # the recipes' trainer holds one more while it saves, and the kept best beside them
    guarded = run_preflight(base_overrides + keep)
    (line,) = [x for x in guarded.lines if "] checkpoint:" in x]
    assert "x 4 kept" in line, line
    # no save step, or every save kept: the kept best is still written (docs/reliability.md,
    # "The kept best")
    no_saves = run_preflight(base_overrides + ["trainer.save_freq=-1"])
    (line,) = [x for x in no_saves.lines if "] checkpoint:" in x]
    assert "x 2 kept" in line, line
    every = ["trainer.max_actor_ckpt_to_keep=0", "trainer.total_training_steps=20",
             "trainer.save_freq=5"]  # fmt: skip
    (line,) = [x for x in run_preflight(base_overrides + every).lines if "] checkpoint:" in x]
    assert "x 5 kept" in line, line
    plain = ["trainer.save_freq=-1", "trainer.v1.trainer_mode=sync"]  # verl's own: nothing saved
    (line,) = [x for x in run_preflight(base_overrides + plain).lines if "] checkpoint:" in x]
    assert "writes no checkpoint" in line, line


def test_a_line_escapes_terminal_control_characters():
    """A run name or a path with terminal escapes is printed escaped, never raw."""
    report = preflight.Report()
    report.ok("checkpoint", "free at runs/x\x1b[31mred\x1b]0;title\x07")
    assert report.lines == [
        "preflight: [ok] checkpoint: free at runs/x\\x1b[31mred\\x1b]0;title\\x07"
    ]

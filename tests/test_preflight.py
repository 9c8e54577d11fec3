"""The PPO preflight in-process: a correct config passes, each planted mistake is caught."""

import os
import re
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, capture, prepare, recipe_env, refusing_port, write_synthetic_gsm8k

from verl_gsm8k.common.qwen25 import qwen25_config
from verl_gsm8k.launch.plan import bare_overrides
from verl_gsm8k.preflight import checkpoints, inputs
from verl_gsm8k.preflight import cli as preflight
from verl_gsm8k.preflight import compose as composing
from verl_gsm8k.preflight.compose import split_override
from verl_gsm8k.preflight.model import count_parameters


@pytest.fixture(scope="module")
def base_overrides(tiny_model_dir, prepared_gsm8k_dir, tmp_path_factory) -> list[str]:
    runs = tmp_path_factory.mktemp("runs")  # no trace: tests/test_trace.py checks its line
    return bare_overrides("gsm8k_ppo", recipe_env(tiny_model_dir, prepared_gsm8k_dir, runs,
                                                  TRACE_SAMPLES="0"))  # fmt: skip


@pytest.fixture(autouse=True)
def recipes_trainer_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher exports it for every PPO launch: the preflight checks it is there."""
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "verl_gsm8k.verl_plugins.register_trainer")


def run_preflight(overrides: list[str], config: str = "gsm8k_ppo") -> preflight.Report:
    return preflight.run(config, ROOT / "configs", overrides)


def compose(overrides: list[str], config: str = "gsm8k_ppo"):
    return composing.compose(ROOT / "configs", config, overrides)


def errors(report: preflight.Report) -> str:
    return "\n".join(line for line in report.lines if "[error]" in line)


def synthetic_files(tmp_path, *flags: str) -> list[str]:
    """The overrides naming synthetic rows prepared in ``tmp_path``/rows with ``flags``."""
    rows = prepare(write_synthetic_gsm8k(tmp_path / "src"), tmp_path / "rows", *flags)
    return [f"data.train_files=['{rows}/train.parquet']", f"data.val_files=['{rows}/test.parquet']"]


def test_correct_config_passes(base_overrides):
    report = run_preflight(base_overrides)
    assert report.errors == 0, "\n".join(report.lines)
    checks = {line.split("]", 1)[1].split(":", 1)[0].strip() for line in report.lines}
    assert {"keys", "config", "model", "checkpoint", "data", "reward", "gpu", "memory"} <= checks


# Planted mistakes, one run a group -> the text of each error it must give.
MISTAKES = {
    "unknown key": (["actor_rollout_ref.actor.optim.lrr=1e-6"], [
        "unknown key 'actor_rollout_ref.actor.optim.lrr' in the installed verl config; did you "
        "mean actor_rollout_ref.actor.optim.lr"]),
    "unknown leaf moved elsewhere": (["trainer.n_gpus=1"], ["did you mean trainer.n_gpus_per_"]),
    "an override Hydra cannot parse": (["data.train_files=$(x)"], [
        "override 'data.train_files=$(x)' is not in Hydra's override grammar (mismatched input"]),
    "verl validate_config": (
        ["actor_rollout_ref.actor.use_dynamic_bsz=False", "critic.use_dynamic_bsz=False"],
        ["verl validate_config: [actor] Please set at least one of 'actor.ppo_micro_batch_size'"]),
    "batch not divisible by GPUs": (["trainer.n_gpus_per_node=3"], [
        "train_batch_size x rollout.n = 128 responses must be divisible by the 3 GPUs"]),
    "batch does not split into mini-batches": (
        ["data.train_batch_size=96", "actor_rollout_ref.actor.ppo_mini_batch_size=64"],
        ["data.train_batch_size=96 does not split into mini-batches of "
         "actor_rollout_ref.actor.ppo_mini_batch_size=64"]),
    "no GPU per node, no response per prompt": (
        ["trainer.n_gpus_per_node=0", "actor_rollout_ref.rollout.n=0"],
        ["trainer.n_gpus_per_node=0, actor_rollout_ref.rollout.n=0: must be at least 1"]),
    "a model, a data file, a reward function; a run name too long (EXPERIMENT_NAME)": ([
        "actor_rollout_ref.model.path=/nonexistent/model",
        "data.train_files=['/nonexistent/train.parquet']",
        "reward.custom_reward_function.name=compute_scor",
        f"trainer.default_local_dir=/tmp/{'a' * 300}"], [
        "actor model path '/nonexistent/model' does not exist",
        "train file /nonexistent/train.parquet does not exist",
        "functions in that file: compute_score",
        "trainer.default_local_dir cannot be made: File name too long"]),
    "context, batch, async save, reward file, run dir in a file (RUNS_ROOT)": ([
        "data.max_prompt_length=4000", "data.max_response_length=1000",
        "data.train_batch_size=512", "actor_rollout_ref.actor.checkpoint.async_save=True",
        "reward.custom_reward_function.path=/nonexistent/reward.py",
        f"trainer.default_local_dir={ROOT}/README.md/run"], [
        "max_prompt_length + max_response_length = 5000 > context 4096",
        "not one full batch", "actor.checkpoint.async_save=true with strategy fsdp2",
        "reward file /nonexistent/reward.py does not exist",
        f"trainer.default_local_dir cannot be made: {ROOT}/README.md is not a writable directory"]),
    "prompts too long with truncation=error; a LoRA rank vLLM refuses": ([
        "data.max_prompt_length=20", "data.filter_overlong_prompts=False",
        "actor_rollout_ref.model.lora_rank=1000", "actor_rollout_ref.rollout.load_format=auto"], [
        "prompts exceed max_prompt_length 20", "LoRA rank 1000 is above vLLM's maximum 512",
        "needs actor_rollout_ref.rollout.load_format=safetensors"]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_planted_mistakes_are_caught(name, base_overrides):
    extra, expected = MISTAKES[name]
    config = "gsm8k_ppo_lora" if any("lora_rank" in key for key in extra) else "gsm8k_ppo"
    report = run_preflight(base_overrides + extra, config)
    for text in expected:
        assert text in errors(report), (text, report.lines)


# One planted key for every row of the preflight's key tables -> the value for the key it
# suggests instead. Each suggestion, as printed, must compose and pass in its turn.
SUGGESTED = {
    "custom_reward_function.path=/x/reward.py": "/x/reward.py",
    "actor_rollout_ref.actor.lora.rank=16": "16", "actor_rollout_ref.actor.lora.alpha=16": "16",
    "actor_rollout_ref.actor.lora.target_modules=all-linear": "all-linear",
    "critic.model.fsdp_config.param_offload=True": "True",
    "critic.fsdp_config.optimizer_offload=True": "True",
    "reward_model.reward_manager=naive": "naive", "reward_model.enable=False": "False",
    "reward_model.reward_kwargs.max_resp_len=256": "256", "critic.fsdp.strategy=fsdp2": "fsdp2",
    "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2": "fsdp2",
    "actor_rollout_ref.ref.fsdp_config.strategy=fsdp2": "fsdp2",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=False": "0",
    "trainer.balance_batch=True": None,  # "remove it"
    "critic.ppo_max_token_len_per_gpu=8192": "8192",
    "actor_rollout_ref.actor.clip_ratio=0.3": "0.3",
}  # fmt: skip


def test_every_suggested_key_composes(base_overrides):
    planted = [split_override(o)[0] for o in SUGGESTED]
    for row in [*preflight.LEGACY_KEYS, *preflight.V1_IGNORED_KEYS]:  # each row planted here
        assert any(k == row or (row.endswith(".") and k.startswith(row)) for k in planted), row
    cfg, fixed = compose(base_overrides), []
    for override, value in SUGGESTED.items():
        report = preflight.Report()
        preflight.check_trainer_keys(cfg, [override], report,
                                     preflight.check_legacy_keys([override], report))  # fmt: skip
        (line,) = [ln for ln in report.lines if "[error] keys" in ln]
        tail = line.rsplit("; ", 1)[1]  # "use K", "set K and K" or "remove it"
        keys = [] if tail == "remove it" else tail.split(" ", 1)[1].split(" and ")
        assert bool(keys) == (value is not None) and tail.split()[0] in ("use", "set", "remove")
        assert keys or "ignored by verl's v1 trainer (trainer.use_v1=true, the default)" in line
        fixed += [f"{key}={value}" for key in keys]
    again = preflight.Report()  # the suggestions, as printed, compose and pass in their turn
    preflight.check_trainer_keys(compose(base_overrides + fixed), fixed, again,
                                 preflight.check_legacy_keys(fixed, again))  # fmt: skip
    assert again.errors == 0, again.lines


def test_keys_only_the_legacy_trainer_reads_are_accepted_and_said_where_it_runs(base_overrides):
    keys = ["trainer.balance_batch=False", "critic.ppo_max_token_len_per_gpu=8192"]
    esi = ["trainer.esi_redundant_time=300"]
    for config, extra in (("gsm8k_ppo", ["trainer.use_v1=false"]), ("gsm8k_ppo_lora", [])):
        report = preflight.Report()
        cfg = compose(base_overrides + extra + keys + esi, config)
        preflight.check_trainer_keys(cfg, extra + keys + esi, report, True)
        assert report.errors == 0 and report.warnings == 0, report.lines
        assert "none the legacy trainer (trainer.use_v1=false) ignores" in report.lines[-1]
    lora = compose(base_overrides, "gsm8k_ppo_lora")
    assert lora.trainer.use_v1 is False and lora.trainer.balance_batch is True
    assert lora.critic.ppo_max_token_len_per_gpu == 16384  # not the legacy default 32768
    report = preflight.Report()
    preflight.check_trainer_keys(compose(base_overrides + esi), esi, report, True)
    (warning,) = [ln for ln in report.lines if "[warn] keys" in ln]
    assert "esi_redundant_time" in warning and "STOP_GRACE_S" in warning
    report = preflight.Report()
    assert preflight.check_legacy_keys(["actor_rollout_ref.actor.calculate_entropy=True"], report)
    assert report.warnings == 1 and "both trainers log actor/entropy without it" in report.lines[0]


def test_bad_data_and_an_algorithm_warning_or_refusal(base_overrides, tmp_path):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["q"], "answer": ["#### 1"]}), bad)
    warned = ["actor_rollout_ref.rollout.n=1", "algorithm.use_kl_in_reward=True"]
    report = run_preflight(base_overrides + warned + [f"data.val_files=['{bad}']"], "gsm8k_grpo")
    (error,) = [line for line in report.lines if "[error]" in line]
    assert f"val file {bad}: missing column(s) prompt, data_source, reward_model" in error
    warnings = [line for line in report.lines if "[warn] algorithm:" in line]
    assert len(warnings) == 2 and "adv_estimator=grpo compares the responses" in warnings[0]
    assert "charges the KL to the reference twice" in warnings[1]
    assert any("[ok] algorithm:" in line and "KL in the reward and in the loss" in line
               for line in report.lines), report.lines  # fmt: skip
    vectorized = ["actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=rloo_vectorized"]
    report = run_preflight(base_overrides + vectorized, "gsm8k_grpo")
    assert "the advantage is 0 for every response" in errors(report)


def test_reward_is_tried_in_the_format_the_prompts_ask_for(base_overrides, tmp_path):
    files = synthetic_files(tmp_path, "--prompt-style", "boxed")
    message = errors(run_preflight(base_overrides + files))
    assert "compute_score scores a right \\boxed{} answer 0.0 and a wrong one 0.0" in message
    assert "it does not separate them" in message and "compute_score_flexible" in message
    flexible = ["reward.custom_reward_function.name=compute_score_flexible"]
    report = run_preflight(base_overrides + files + flexible)
    assert report.errors == 0, "\n".join(report.lines)
    assert "right \\boxed{} answer -> 1.0, wrong -> 0.0" in "\n".join(report.lines)


def test_a_reward_must_return_a_number(base_overrides, tmp_path):
    cfg = compose(base_overrides)
    for n, (right, wrong, shown) in enumerate([
        ("None", "None", "returned None for a right answer"),
        ('"1.0"', '"0.0"', "returned '1.0' for a right answer"),  # "1.0" > "0.0" as strings
        ("True", "False", "returned True for a right answer"),
        ('{"acc": 1.0}', '{"acc": 0.0}', "returned a dict without 'score' (keys: acc)"),
        ('{"score": "1"}', '{"score": "0"}', "returned a dict with score '1' for a right"),
    ]):  # fmt: skip
        reward = tmp_path / f"reward_{n}.py"
        reward.write_text(f"def compute_score(solution_str, **_):\n    return {right} if "
                          f"solution_str.endswith('72') else {wrong}\n")  # fmt: skip
        cfg.reward.custom_reward_function.path = str(reward)
        report = preflight.Report()
        assert inputs.check_reward(cfg, report) is None
        (line,) = report.lines
        assert shown in line and "a reward must return a number, or a dict with a numeric " \
            "'score'" in line, line  # fmt: skip


def test_checkpoints_kept_and_the_disk_they_need(base_overrides, tiny_model_dir, tmp_path):
    from transformers import AutoConfig

    kept = {  # overrides -> checkpoints kept at most (0: none written)
        ("trainer.max_actor_ckpt_to_keep=2", "trainer.v1.trainer_mode=sync"): 2,
        ("trainer.max_actor_ckpt_to_keep=2",): 4,
        ("trainer.save_freq=-1",): 2,  # no save step: the kept best alone
        ("trainer.max_actor_ckpt_to_keep=0", "trainer.total_training_steps=20",
         "trainer.save_freq=5"): 5,
        ("trainer.save_freq=-1", "trainer.v1.trainer_mode=sync"): 0,
    }  # fmt: skip
    for extra, count in kept.items():
        assert checkpoints.kept_checkpoints(compose(base_overrides + list(extra))) == count, extra
    hf = AutoConfig.from_pretrained(tiny_model_dir)
    report = preflight.Report()
    checkpoints.check_disk(compose(base_overrides + ["trainer.max_actor_ckpt_to_keep=2"]),
                           {"actor": hf, "critic": hf}, tmp_path, report)  # fmt: skip
    assert "[ok] checkpoint:" in report.lines[0] and "x 4 kept = " in report.lines[0]
    assert f"GiB free at {tmp_path}" in report.lines[0]
    huge = ["trainer.max_actor_ckpt_to_keep=1000000000", "trainer.save_freq=1"]
    checkpoints.check_disk(compose(base_overrides + huge), {"actor": hf}, tmp_path, report)
    assert "the disk fills before the run ends" in errors(report)


def test_the_cli_says_its_time_and_the_hub_it_cannot_reach_in_seconds(base_overrides, tmp_path):
    hub_model = "Qwen/Qwen2.5-0.5B-Instruct"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    with refusing_port() as port:  # the "hub" refuses at once, for the whole run
        env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"))
        start = time.monotonic()
        result = capture([sys.executable, "-m", "verl_gsm8k.preflight", "--", *base_overrides,
                          f"actor_rollout_ref.model.path={hub_model}",
                          f"critic.model.path={hub_model}", "custom_reward_function.path=/x.py"],
                         1, 300, env=env)  # fmt: skip
    assert time.monotonic() - start < 120 and "Retrying" not in result.stderr  # no hub retry
    assert "Traceback" not in result.stdout + result.stderr
    assert "preflight: FAILED with" in result.stdout, result.stdout[-3000:]
    assert f"'{hub_model}' is a hub id, not cached here" in result.stdout
    assert f"the hub cannot be reached from this machine: http://127.0.0.1:{port}" in result.stdout


def test_the_parameter_count_and_a_line_without_terminal_escapes():
    assert count_parameters(qwen25_config("0.5B")) == 494_032_768  # the published size
    report = preflight.Report()  # a run name or a path with escapes is printed escaped
    report.ok("checkpoint", "free at runs/x\x1b[31mred\x1b]0;title\x07")
    assert report.lines == [
        "preflight: [ok] checkpoint: free at runs/x\\x1b[31mred\\x1b]0;title\\x07"]  # fmt: skip


def test_a_tool_launch_refuses_rows_that_run_without_the_tool(base_overrides, tiny_model_dir,
                                                              tmp_path):  # fmt: skip
    """Refused on rows prepared without --tools (verl would show them no tool); with --tools,
    the prompt length counts the tools block (verl's agent loop would cut it first)."""
    from transformers import AutoTokenizer

    from verl_gsm8k.tools import config_path

    multi_turn = "actor_rollout_ref.rollout.multi_turn"
    tools = [f"{multi_turn}.tool_config_path={config_path('calculator')}",
             f"{multi_turn}.max_assistant_turns=3"]  # fmt: skip
    refused = errors(run_preflight(base_overrides + tools))
    assert "rows run verl's single_turn_agent loop, which shows the model no tools" in refused
    files = [*synthetic_files(tmp_path, "--tools", "calculator"), "data.max_prompt_length=1024"]
    report = run_preflight(base_overrides + tools + files)
    assert report.errors == 0, "\n".join(report.lines)
    said = "\n".join(report.lines)
    assert "train file train.parquet: every row runs verl's tool_agent loop" in said
    assert "is the whole response, every turn and the tool's replies included" in said

    with_tools = int(re.search(r"train.parquet: longest prompt (\d+)", said)[1])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = pq.read_table(tmp_path / "rows" / "train.parquet").to_pylist()
    plain = max(len(tok.apply_chat_template(row["prompt"], add_generation_prompt=True)["input_ids"])
                for row in rows)  # fmt: skip
    assert with_tools > plain + 100  # the tools block is counted
    short = errors(run_preflight(base_overrides + tools + files +
                                 [f"data.max_prompt_length={with_tools - 1}"]))  # fmt: skip
    assert "exceed max_prompt_length" in short and "lose the tools block first" in short

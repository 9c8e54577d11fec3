"""The bash recipes, run for real; a stand-in PYTHON (fake_verl_python) records verl's start."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers import (
    RECIPES,
    ROOT,
    composed_config,
    fake_nvidia_smi,
    get,
    launch_in_process,
    recipe_env,
    run_recipe,
)

from verl_gsm8k.common.command_line import PREFIX
from verl_gsm8k.common.launch_record import read_records
from verl_gsm8k.launch.cli import warn_unshared_run_dir
from verl_gsm8k.launch.knobs import hydra_quote, recipe_arguments
from verl_gsm8k.launch.plan import VERL_PLUGINS, Recipe, bare_overrides, make_plan, recipe_plan

# One xdist worker for the tests of gpu_dry_run (a module fixture): each dry run made once.
SHARED_DRY_RUNS = pytest.mark.xdist_group("test_recipes-dry-runs")
SECRETS = {"WANDB_API_KEY": "wandb-secret-0123456789", "HF_TOKEN": "hf_secret_abcdef123456"}
H100 = ("NVIDIA H100 80GB HBM3", 81559)
PPO, SFT = "ppo_qwen2.5-0.5b_gsm8k", "sft_qwen2.5-0.5b_gsm8k"


def fake_verl_python(path: Path, record: Path) -> Path:
    """A PYTHON that runs all but verl's entry points, which it records in ``record``."""
    path.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> "{record}.calls"\n'
        'if [[ "${1:-}" == "-m" && ( "${2:-}" == verl.trainer.main_ppo ||'
        ' "${2:-}" == torch.distributed.run ) ]]; then\n'
        '  { echo "metrics=${VERL_FILE_LOGGER_PATH:-}"; env | grep "^VERL_" | sort;'
        f' printf "arg=%s\\n" "$@"; }} > "{record}"\n'
        '  echo "fake verl ran"; exit "${FAKE_VERL_RC:-0}"\n'
        "fi\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    path.chmod(0o755)
    return path


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def on_h100(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    env["PATH"] = f"{fake_nvidia_smi(tmp_path / 'bin', [H100])}:{env['PATH']}"
    return env


def recorded(record: Path) -> tuple[list[str], dict[str, str], Path]:
    """(verl's arguments, its VERL_* variables, the metrics file) a fake verl recorded."""
    lines = record.read_text().splitlines()
    args = [line.removeprefix("arg=") for line in lines if line.startswith("arg=")]
    env = dict(line.split("=", 1) for line in lines if line.startswith("VERL_"))
    return args, env, Path(lines[0].removeprefix("metrics="))


@pytest.fixture(scope="module")
def gpu_dry_run(tiny_model_dir, prepared_gsm8k_dir, tmp_path_factory) -> Callable:
    """DRY_RUN=1 on a fake H100, no flash_attn, secrets set; once per recipe, in-process:
    (its result, its RUNS_ROOT)."""
    base = tmp_path_factory.mktemp("gpu-dry-runs")
    made: dict[str, tuple] = {}

    def dry_run(recipe: str) -> tuple[subprocess.CompletedProcess, Path]:
        if recipe not in made:
            runs = base / recipe / "runs"
            env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, runs, DRY_RUN="1", **SECRETS)
            # one nvidia-smi per recipe: gpus.listed asks each one once per process
            bin_dir = fake_nvidia_smi(base / recipe / "bin", [H100], compute_cap="9.0")
            env["PATH"] = f"{bin_dir}:{env['PATH']}"
            env["FAKE_NVIDIA_SMI_CALLS"] = str(base / f"{recipe}.nvidia-smi-calls")
            # a user key=value comes last: it beats the recipe's own setting
            made[recipe] = launch_in_process(recipe, env, "trainer.test_freq=13"), runs
        return made[recipe]

    return dry_run


RECIPE_SPECIFIC = {
    "grpo_qwen2.5-0.5b_gsm8k": {
        "algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.use_kl_loss": True,
        "algorithm.use_kl_in_reward": False, "actor_rollout_ref.rollout.n": 5,
    },
    "ppo_lora_qwen2.5-1.5b_gsm8k": {
        "actor_rollout_ref.model.lora_rank": 32,
        "critic.model.lora_rank": 0,  # verl 0.9.1 cannot wrap a critic in LoRA
        "trainer.use_v1": False,  # v1 crashes with a LoRA actor and a critic
        "critic.fsdp.offload_policy": True,  # 24 GB: critic states in host memory
        "actor_rollout_ref.rollout.load_format": "safetensors",
    },
}  # fmt: skip


@pytest.mark.slow
@SHARED_DRY_RUNS
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_passes_its_dry_run(recipe, tiny_model_dir, gpu_dry_run):
    result, runs_root = gpu_dry_run(recipe)
    ok(result)
    assert re.search(r"preflight: passed \(\d+ warning\(s\)\) in \d+\.\d s", result.stdout)
    # guarded and traced, on verl's v1 trainer or (ReMax, LoRA) its legacy one: ppo_trainer/
    assert re.search(r"preflight: \[ok\] trace: \d+ responses per step", result.stdout)
    assert "preflight: [warn] guard" not in result.stdout
    # the launch asked the GPUs once; a bare `nvidia-smi` would be verl's own platform check
    calls = (runs_root.parent.parent / f"{recipe}.nvidia-smi-calls").read_text().splitlines()
    ours = [call for call in calls if call]
    assert ours == ["--query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits"]
    cfg = composed_config(result.stdout)
    run_dir = str(runs_root / recipe)
    for key, value in {
        "trainer.test_freq": 13, "actor_rollout_ref.model.path": str(tiny_model_dir),
        "reward.custom_reward_function.path": str(ROOT / "rewards" / "gsm8k.py"),
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.actor.calculate_entropy": False,  # v1 logs entropy anyway
        "critic.ppo_infer_max_token_len_per_gpu": 16384,
        "actor_rollout_ref.rollout.name": "vllm", "trainer.resume_mode": "auto",
        "trainer.val_before_train": True, "trainer.default_local_dir": run_dir,
        "trainer.rollout_data_dir": f"{run_dir}/rollouts", **RECIPE_SPECIFIC.get(recipe, {}),
    }.items():  # fmt: skip
        assert get(cfg, key) == value, (recipe, key)
    assert not runs_root.exists(), "a dry run must not create the run directory"


# Each trainer's knobs: the value set, and the verl keys it must land on.
A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
BOTH = {
    "TEST_FREQ": ("9", "trainer.test_freq"),
    "TOTAL_TRAINING_STEPS": ("11", "trainer.total_training_steps"),
    "PROJECT_NAME": ("knob_project", "trainer.project_name"),
    "EXPERIMENT_NAME": ("knob_experiment", "trainer.experiment_name"),
}
KNOBS = {
    "ppo": {
        "NNODES": ("2", "trainer.nnodes"), "NDEVICES_PER_NODE": ("4", "trainer.n_gpus_per_node"),
        "TRAIN_BATCH_SIZE": ("96", "data.train_batch_size"),
        "PPO_MINI_BATCH_SIZE": ("48", f"{A}ppo_mini_batch_size"),
        "MAX_PROMPT_LENGTH": ("1024", "data.max_prompt_length"),
        "MAX_RESPONSE_LENGTH": ("300", "data.max_response_length"),
        "ACTOR_LR": ("2e-06", f"{A}optim.lr"), "CRITIC_LR": ("3e-05", "critic.optim.lr"),
        "ROLLOUT_TP": ("2", f"{R}tensor_model_parallel_size"), "ROLLOUT_N": ("2", f"{R}n"),
        "ROLLOUT_GPU_MEM_UTIL": ("0.55", f"{R}gpu_memory_utilization"),
        "TOTAL_EPOCHS": ("3", "trainer.total_epochs"), "SAVE_FREQ": ("7", "trainer.save_freq"),
        "KL_COEF": ("0.005", f"algorithm.kl_ctrl.kl_coef {A}kl_loss_coef"),
        "REWARD_FN": ("compute_score_flexible", "reward.custom_reward_function.name"),
        "MAX_CKPT_TO_KEEP": ("5", "trainer.max_actor_ckpt_to_keep trainer.max_critic_ckpt_to_keep"),
        "RESUME": ("disable", "trainer.resume_mode"), **BOTH,
    },
    "sft": {
        "NDEVICES_PER_NODE": ("2", "trainer.n_gpus_per_node"), "SFT_LR": ("2e-05", "optim.lr"),
        "TRAIN_BATCH_SIZE": ("48", "data.train_batch_size"),
        "MAX_LENGTH": ("512", "data.max_length"),
        "TOTAL_EPOCHS": ("4", "trainer.total_epochs"),
        "MAX_CKPT_TO_KEEP": ("5", "trainer.max_ckpt_to_keep"), **BOTH,
    },
}  # fmt: skip
# The SFT run's key=value arguments, each beating another layer: a knob (SAVE_FREQ=7), the
# recipe's config file, the CPU overlay.
SFT_USER = {"trainer.save_freq": 13, "data.max_token_len_per_gpu": 4096,
            "engine.use_torch_compile": True}  # fmt: skip


@pytest.fixture(scope="module")
def knob_runs(tiny_model_dir, prepared_gsm8k_dir, prepared_sft_dir, tmp_path_factory):
    """The PPO and SFT recipes' dry runs with every knob of their table set."""
    runs = {}
    for trainer, data, recipe in (("ppo", prepared_gsm8k_dir, PPO), ("sft", prepared_sft_dir, SFT)):
        tmp = tmp_path_factory.mktemp(trainer)
        prefix = "GSM8K" if trainer == "ppo" else "SFT"
        paths = {f"{prefix}_TRAIN_FILE": str(data / "train.parquet"),
                 f"{prefix}_TEST_FILE": str(data / "test.parquet"), "RUN_DIR": str(tmp / "run"),
                 "LOGGER": "console,file,tensorboard"}  # fmt: skip
        extra, user = dict(DEVICE="cpu", SAVE_FREQ="7", ACTOR_LR="1e-6", **SECRETS), SFT_USER
        if trainer == "ppo":
            paths["CRITIC_MODEL_PATH"] = str(shutil.copytree(tiny_model_dir, tmp / "critic"))
            extra, user = {}, {}
        knobs = {name: value for name, (value, _) in KNOBS[trainer].items()}
        env = recipe_env(tiny_model_dir, tmp / "no-data-here", tmp / "runs", DRY_RUN="1",
                         **knobs, **paths, **extra)  # fmt: skip
        result = launch_in_process(recipe, env, *(f"{k}={str(v).lower()}" for k, v in user.items()))
        ok(result)
        runs[trainer] = (result, composed_config(result.stdout), paths, tmp)
    return runs


@pytest.mark.parametrize("trainer", ["ppo", "sft"])
def test_knobs_land_on_their_verl_keys(trainer, knob_runs, tiny_model_dir):
    result, cfg, paths, tmp = knob_runs[trainer]
    for knob, (value, keys) in KNOBS[trainer].items():
        for key in keys.split():
            assert str(get(cfg, key)) == value, f"{knob}={value} did not reach {key}"
    prefix = "GSM8K" if trainer == "ppo" else "SFT"
    assert get(cfg, "data.train_files") == [paths[f"{prefix}_TRAIN_FILE"]]
    assert get(cfg, "data.val_files") == [paths[f"{prefix}_TEST_FILE"]]
    assert get(cfg, "trainer.logger") == ["console", "file", "tensorboard"]
    assert get(cfg, "trainer.default_local_dir") == paths["RUN_DIR"]
    if trainer == "ppo":
        assert get(cfg, "critic.model.path") == paths["CRITIC_MODEL_PATH"]
        assert get(cfg, "trainer.rollout_data_dir") == paths["RUN_DIR"] + "/rollouts"
        assert get(cfg, "trainer.validation_data_dir") == paths["RUN_DIR"] + "/validation"
    else:  # and the SFT config's layers, each beaten by the next; secrets never printed
        assert get(cfg, "model.path") == str(tiny_model_dir)
        for key, value in SFT_USER.items():
            assert get(cfg, key) == value, key
        assert "device: cpu (DEVICE=cpu)" in result.stdout
        assert "preflight: [ok] device: trains on the CPU" in result.stdout
        for key, value in {  # configs/gsm8k_sft.yaml, then device/cpu_sft.yaml, attention/sdpa_sft
            "engine.strategy": "fsdp2", "data.use_dynamic_bsz": True,
            "data.messages_key": "messages", "trainer.resume_mode": "auto",
            "trainer.device": "cpu", "model.enable_gradient_checkpointing": False,
            "data.num_workers": 0, "model.use_remove_padding": False,
            "model.override_config.attn_implementation": "sdpa",
            "engine.mixed_precision": dict.fromkeys(("param_dtype", "reduce_dtype",
                                                     "buffer_dtype"), "fp32"),
        }.items():  # fmt: skip
            assert get(cfg, key) == value, key
        assert "model" in get(cfg, "checkpoint.save_contents")  # what scripts/merge.sh merges
        assert "actor_rollout_ref" not in cfg and "critic" not in cfg  # verl's SFT config only
        assert not any(value in result.stdout + result.stderr for value in SECRETS.values())
        assert "recipe: ignoring ACTOR_LR: not knobs of verl's SFT trainer" in result.stderr
    assert not (tmp / "run").exists() and not (tmp / "runs").exists()


def test_an_sft_step_count_alone_brings_enough_epochs():
    for knobs, epochs in [
        ({}, "3"),
        ({"TOTAL_TRAINING_STEPS": "150"}, "150"),
        ({"TOTAL_TRAINING_STEPS": "150", "TOTAL_EPOCHS": "2"}, "2"),
    ]:
        plan = recipe_plan(ROOT / "recipes" / f"{SFT}.sh", {"HOME": "/x", **knobs})
        assert f"trainer.total_epochs={epochs}" in plan.overrides, knobs


@SHARED_DRY_RUNS
def test_the_printed_verl_command_run_by_hand_composes_the_launchers_config(gpu_dry_run, tmp_path):
    result = gpu_dry_run("smoke_tiny")[0]
    ok(result)
    (line,) = [x for x in result.stdout.splitlines() if x.startswith(PREFIX)]
    command = line.removeprefix(PREFIX)
    assert " -m verl.trainer.main_ppo " in command and " data.train_batch_size=16 " in command
    assert not any(value in line for value in SECRETS.values())
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    by_hand = subprocess.run(["bash", "-c", f"{command} --cfg job"], capture_output=True,
                             text=True, timeout=300, env=env, cwd=tmp_path)  # fmt: skip
    assert by_hand.returncode == 0, by_hand.stderr[-3000:]
    launched = composed_config(result.stdout)
    assert yaml.safe_load(by_hand.stdout) == launched
    assert get(launched, "data.train_batch_size") == 16
    assert get(launched, "gsm8k_trace.samples") == 4


@SHARED_DRY_RUNS
def test_no_secret_printed_wandb_with_the_key_sdpa_packed_without_flash_attn_knobs_said(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path, gpu_dry_run
):
    result = gpu_dry_run(PPO)[0]
    ok(result)
    cfg = composed_config(result.stdout)
    assert get(cfg, "trainer.logger") == ["console", "file", "wandb"]
    # a GPU without flash_attn: GPU settings, sdpa WITH padding removal (the sdpa_packed overlay)
    assert __import__("importlib").util.find_spec("flash_attn") is None
    assert f"preflight: [ok] gpu: 1 x {H100[0]}" in result.stdout  # the GPU machine, seen
    said = "attention: sdpa, padding removal on (flash_attn not installed; packed rows, "
    assert f"device: gpu (DEVICE=auto) | {said}" in result.stdout  # the launch line
    assert f"[ok] device: trains on cuda; {said}" in result.stdout  # the preflight's
    assert get(cfg, "trainer.device") == "cuda"  # no CPU settings on a GPU machine
    for role in ("actor_rollout_ref", "critic"):
        assert get(cfg, f"{role}.model.use_remove_padding") is True
        assert get(cfg, f"{role}.model.override_config.attn_implementation") == "sdpa"
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                     HF_TOKEN=SECRETS["HF_TOKEN"], SEED="7", NOT_A_KNOB="x")  # fmt: skip
    bare = launch_in_process(PPO, env)
    ok(bare)
    for value in SECRETS.values():
        assert value not in result.stdout + result.stderr + bare.stdout + bare.stderr
    cfg = composed_config(bare.stdout)
    assert get(cfg, "trainer.logger") == ["console", "file"] and get(cfg, "data.seed") == 7
    (line,) = [x for x in bare.stdout.splitlines() if "knobs from the environment" in x]
    words = line.removeprefix("recipe: knobs from the environment: ").split()
    assert sorted(words) == sorted([f"MODEL_PATH={tiny_model_dir}", "DRY_RUN=1", "SEED=7",
                                    f"DATA_DIR={prepared_gsm8k_dir}",
                                    f"RUNS_ROOT={tmp_path / 'runs'}"])  # fmt: skip


MISSING = "/no-such-model"
NO_GPU = "no NVIDIA GPU is visible here"
# (recipe, knobs, a GPU, exit status, stderr's last line holds, in stdout, not in stdout)
STOPS = {
    "no GPU": (PPO, {}, False, 3, (NO_GPU, "bash recipes/smoke_tiny.sh, or DEVICE=cpu bash "
               "recipes/"), "preflight: passed", None),
    "no GPU, SFT": (SFT, {}, False, 3, (NO_GPU, f"DEVICE=cpu bash recipes/{SFT}.sh; DRY_RUN=1 "
                    "prints the final"), "preflight: passed", None),
    "no model": (PPO, {"MODEL_PATH": MISSING, "DRY_RUN": "1"}, False, 2, (f"recipe: MODEL_PATH="
                 f"{MISSING} does not exist: a local directory holding the model's config.json and "
                 "weights, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct",), "", "preflight:"),
    "GPU count": (PPO, {"NDEVICES_PER_NODE": "2", "DRY_RUN": "1"}, True, 1, (), "trainer.n_gpus_"
                  "per_node=2 but this node has 1 GPU(s)", "model_engine:"),  # verl never ran
}  # fmt: skip


@pytest.mark.parametrize("case", STOPS)
def test_a_recipe_that_cannot_run_stops_with_one_line(case, tiny_model_dir, request, tmp_path):
    recipe, knobs, gpu, code, parts, shown, unseen = STOPS[case]
    data = request.getfixturevalue("prepared_sft_dir" if recipe == SFT else "prepared_gsm8k_dir")
    env = recipe_env(tiny_model_dir, data, tmp_path / "runs", **knobs)
    if gpu:
        on_h100(env, tmp_path)
    else:
        env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi
    result = launch_in_process(recipe, env)
    assert result.returncode == code, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stderr.strip().splitlines() or [""]
    assert all(part in lines[-1] for part in parts), lines
    assert code != 2 or len(lines) == 1  # refused before the preflight: that line alone
    assert shown in result.stdout and (unseen is None or unseen not in result.stdout)
    assert not (tmp_path / "runs").exists()


def test_each_recipe_file_passes_the_launcher_its_array_and_the_users_arguments(tmp_path):
    record = tmp_path / "argv"
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "{record}"\n')
    python.chmod(0o755)
    recipes = sorted(path.stem for path in (ROOT / "recipes").glob("*.sh"))
    assert len(recipes) >= 13
    env = recipe_env(Path("/x"), Path("/x"), Path("/x"))
    for recipe in recipes:
        run = run_recipe(recipe, dict(env, PYTHON=str(python)), "a.b='c d'", "x=1")
        assert run.returncode == 0, run.stderr
        argv = record.read_text().split("\0")[:-1]
        words = recipe_arguments(ROOT / "recipes" / f"{recipe}.sh")
        assert argv == ["-m", "verl_gsm8k.launch", *words, "--", "a.b='c d'", "x=1"]
    helped = run_recipe(SFT, env, "--help")
    assert helped.returncode == 0 and f"bash recipes/{SFT}.sh" in helped.stdout
    assert "DRY_RUN=1" in helped.stdout


def test_paths_reach_ray_workers_absolute_and_hydra_quoted(tiny_model_dir, tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for value in ["/data/my run's dir", "a\\b", "x\\'y", "ends\\", "''", "a,b=c [x]"]:
        text = hydra_quote(value)
        assert parser.parse_override(f"k={text}").value() == value, text
        assert parser.parse_override(f"k=[{text}]").value() == [value], text
    (tmp_path / "model").symlink_to(tiny_model_dir)
    env = recipe_env(Path("model"), Path("data"), Path("runs"), RUN_DIR="my-run")
    overrides = bare_overrides("gsm8k_ppo", env, cwd=tmp_path)
    assert f"actor_rollout_ref.model.path='{tmp_path}/model'" in overrides
    assert f"data.train_files=['{tmp_path}/data/train.parquet']" in overrides
    assert f"trainer.default_local_dir='{tmp_path}/my-run'" in overrides
    hub = bare_overrides("gsm8k_ppo", dict(env, MODEL_PATH="Qwen/Qwen2.5-0.5B-Instruct"),
                         cwd=tmp_path)  # fmt: skip
    assert "actor_rollout_ref.model.path='Qwen/Qwen2.5-0.5B-Instruct'" in hub  # a hub id stays


@pytest.mark.slow
def test_paths_with_quotes_and_spaces_reach_verl_exactly(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    base = tmp_path / "it's a dir, a=b"
    model = base / "model's copy"
    shutil.copytree(tiny_model_dir, model)
    data = base / "my data's dir"
    data.mkdir()
    for name in ("train.parquet", "test.parquet"):
        shutil.copy(prepared_gsm8k_dir / name, data / name)
    reward = base / "reward's file.py"
    shutil.copy(ROOT / "rewards" / "gsm8k.py", reward)
    runs = base / "runs 'root'"
    env = recipe_env(model, data, runs, DRY_RUN="1", REWARD_FILE=str(reward))
    result = launch_in_process(PPO, env)
    ok(result)
    cfg = composed_config(result.stdout)
    run_dir = runs / PPO
    for key, value in {
        "actor_rollout_ref.model.path": str(model), "critic.model.path": str(model),
        "data.train_files": [str(data / "train.parquet")],
        "data.val_files": [str(data / "test.parquet")],
        "reward.custom_reward_function.path": str(reward),
        "trainer.default_local_dir": str(run_dir),
        "trainer.rollout_data_dir": f"{run_dir}/rollouts",
        "trainer.validation_data_dir": f"{run_dir}/validation",
    }.items():  # fmt: skip
        assert get(cfg, key) == value, key
    assert "preflight: [ok] reward: reward's file.py:compute_score" in result.stdout


def test_the_plugins_verl_imports_follow_the_launch():
    def plan(trainer: str, device: str, **env: str):
        recipe = Recipe("r", f"gsm8k_{trainer}", trainer)
        return make_plan(recipe, {"HOME": "/x", "DEVICE": device, **env}, probe=False)

    def modules(*args: str, **env: str) -> list[str]:
        return plan(*args, **env).exports["VERL_USE_EXTERNAL_MODULES"].split(",")

    assert modules("ppo", "cpu") == list(VERL_PLUGINS)
    assert modules("ppo", "gpu") == [m for m in VERL_PLUGINS if not m.endswith(".cpu_platform")]
    ppo_only = (".register_trainer", ".stop_on_sigterm")
    assert modules("sft", "cpu") == [m for m in VERL_PLUGINS if not m.endswith(ppo_only)]
    assert modules("ppo", "cpu", VERL_USE_EXTERNAL_MODULES="my.module")[-1] == "my.module"
    sft = plan("sft", "cpu")  # its overlays, and the CPU platform's variables
    assert sft.device_overrides == ["+attention=sdpa_sft", "+device=cpu_sft"]
    assert (sft.exports["VERL_PLATFORM"], sft.exports["VERL_ENGINE_DEVICE"]) == ("cpu", "cuda")


# trainer -> (recipe, its knobs, the data fixture, how verl starts before its config)
LAUNCHES = {
    "ppo": (PPO, {"ACTOR_LR": "2e-6"}, "prepared_gsm8k_dir", ["-m", "verl.trainer.main_ppo"]),
    "sft": (SFT, {"SKIP_PREFLIGHT": "1", "NDEVICES_PER_NODE": "2"}, "prepared_sft_dir",
            ["-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2",
             "-m", "verl_gsm8k.sft_trainer"]),
}  # fmt: skip


@pytest.mark.parametrize("trainer", sorted(LAUNCHES))
def test_launch_on_a_gpu_machine(trainer, tiny_model_dir, request, tmp_path):
    recipe, knobs, data, head = LAUNCHES[trainer]
    record = tmp_path / "launch.txt"
    python = fake_verl_python(tmp_path / "python", record)
    env = recipe_env(tiny_model_dir, request.getfixturevalue(data), tmp_path / "runs",
                     PYTHON=str(python), **knobs)  # fmt: skip
    on_h100(env, tmp_path)
    result = run_recipe(recipe, env, "trainer.total_epochs=3")
    ok(result)
    args, verl_env, metrics = recorded(record)
    config = ["--config-path", str(ROOT / "configs"), "--config-name", f"gsm8k_{trainer}"]
    assert args[: len(head) + 4] == [*head, *config] and args[-1] == "trainer.total_epochs=3"
    assert "VERL_PLATFORM" not in verl_env and not any("+device=" in a for a in args)
    run_dir = tmp_path / "runs" / recipe
    assert metrics.parent == run_dir / "metrics"
    assert re.fullmatch(r"metrics-\d{8}T\d{6}Z\.jsonl", metrics.name)
    (console,) = (run_dir / "logs").glob("console-*.log")
    assert "fake verl ran" in console.read_text()
    calls = Path(f"{record}.calls").read_text().splitlines()
    assert len(calls) == 2 and calls[0].startswith("-m verl_gsm8k.launch "), calls
    if trainer == "ppo":  # and every launch records what it was
        assert "preflight: [ok] gpu: 1 x NVIDIA H100 80GB HBM3" in result.stdout
        (launch,) = read_records(run_dir)
        assert f"recorded -> {run_dir}/launches/launch-{launch['stamp']}.yaml" in result.stdout
        assert metrics.name == f"metrics-{launch['stamp']}.jsonl"  # one stamp per launch
        assert (launch["recipe"], launch["trainer"], launch["config_name"]) == (
            PPO, "ppo", "gsm8k_ppo")  # fmt: skip
        assert launch["config"]["actor_rollout_ref"]["actor"]["optim"]["lr"] == 2e-6  # typed
        assert launch["config"]["trainer"]["total_epochs"] == 3  # the user's override, last
        assert launch["knobs"]["ACTOR_LR"] == "2e-6"
        assert launch["knob_keys"]["actor_rollout_ref.actor.optim.lr"] == "ACTOR_LR"
        assert launch["user_overrides"] == ["trainer.total_epochs=3"]
        assert launch["versions"]["verl"] == "0.9.1" and launch["versions"]["torch"]
        assert len(launch["git"]["commit"]) == 40 and isinstance(launch["git"]["dirty"], bool)
        assert launch["host"]["gpus"] == [{"name": H100[0], "memory_gib": 79.6}]
        # the exact command verl got: said on the console, kept in the record, what verl received
        (said,) = [x for x in result.stdout.splitlines() if x.startswith(PREFIX)]
        command = shlex.split(launch["verl_command"])
        assert said == PREFIX + launch["verl_command"]
        assert command[next(i for i, w in enumerate(command) if "=" not in w) + 1 :] == args
        assert f"VERL_FILE_LOGGER_PATH={metrics}" in command
    else:
        assert f"bash scripts/merge.sh {run_dir} OUT_DIR" in result.stdout
        failed = run_recipe(recipe, dict(env, FAKE_VERL_RC="7", SKIP_PREFLIGHT="1"))
        assert failed.returncode == 7 and "verl exited with 7" in failed.stdout  # verl's status


RAY_COPY = "/var/raytmp/session_2026-11-24_01-00-00_000000_1/runtime_resources/working_dir_files"


@pytest.mark.parametrize(
    "nnodes,runs_root,warned",
    [("2", "/tmp/runs", "under /tmp, usually a node's local disk"),
     ("2", f"{RAY_COPY}/_ray_pkg_0123/runs", "inside Ray's session directory"),
     ("2", "/mnt/shared/runs", None), ("1", "/tmp/runs", None)],
)  # fmt: skip
def test_a_multi_node_run_dir_that_is_not_shared_is_warned(nnodes, runs_root, warned, capsys):
    env = {k: v for k, v in os.environ.items() if k not in ("RUN_DIR", "DEVICE")}
    env.update(NNODES=nnodes, RUNS_ROOT=runs_root)
    warn_unshared_run_dir(make_plan(Recipe("t", "gsm8k_ppo"), env, gpu=lambda: False, probe=False))
    err = capsys.readouterr().err
    if warned is None:
        assert err == ""
        return
    (line,) = err.splitlines()
    assert line.startswith(f"recipe: warning: NNODES=2 and RUN_DIR={runs_root}/t is {warned}")
    assert "every node writes its ranks' checkpoint shards there" in line


def test_without_a_gpu_device_cpu_trains_here_and_device_gpu_on_the_ray_clusters(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    record = tmp_path / "launch.txt"
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                     PYTHON=str(fake_verl_python(tmp_path / "python", record)), DEVICE="cpu",
                     PATH="/usr/bin:/bin")  # no nvidia-smi here  # fmt: skip
    result = run_recipe(PPO, env, "reward.num_workers=2")
    ok(result)
    assert "device: cpu (DEVICE=cpu)" in result.stdout
    assert "preflight: [ok] device: trains on the CPU" in result.stdout
    cfg = composed_config(result.stdout)
    assert get(cfg, "trainer.device") == "cpu"
    assert get(cfg, "actor_rollout_ref.rollout.enable_sleep_mode") is False
    assert get(cfg, "actor_rollout_ref.rollout.agent.num_workers") == 1
    # logical GPUs in Ray: one per FSDP/vLLM worker (resolved when verl starts Ray)
    assert get(cfg, "ray_kwargs.ray_init.num_gpus") == "${trainer.n_gpus_per_node}"
    assert get(cfg, "reward.num_workers") == 2  # the user's argument beats the overlay's 1
    assert get(cfg, "critic.model.override_config.attn_implementation") == "sdpa"
    # the dry run, preflight and verl's composed config included, is one Python process
    calls = Path(f"{record}.calls").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("-m verl_gsm8k.launch "), calls
    env.update(DEVICE="gpu", DRY_RUN="0", SKIP_PREFLIGHT="1", RAY_ADDRESS="10.0.0.1:6379",
               NNODES="2")  # a CPU-only Ray head  # fmt: skip
    result = run_recipe(PPO, env)
    ok(result)
    assert "recipe: warning: NNODES=2 and RUN_DIR=" in result.stderr  # under /tmp
    assert "device: gpu (DEVICE=gpu) on the Ray cluster at RAY_ADDRESS=10.0.0.1:6379" in (
        result.stdout)  # fmt: skip
    args, _, _ = recorded(record)
    assert "+ray=attach" in args and "trainer.device=cpu" not in args
    auto = launch_in_process(PPO, dict(env, DEVICE="auto"))
    assert auto.returncode == 3  # auto: nothing says the GPUs are there
    assert "To train on the GPUs of the Ray cluster at RAY_ADDRESS=10.0.0.1:6379: DEVICE=gpu" in (
        auto.stderr)  # fmt: skip
    env.pop("RAY_ADDRESS")
    alone = launch_in_process(PPO, env)
    assert alone.returncode == 3 and "no NVIDIA GPU is visible here" in alone.stderr

"""The bash recipes, run for real: dry runs against the installed verl, knob mapping, safety."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import (
    RECIPES,
    ROOT,
    composed_config,
    fake_nvidia_smi,
    get,
    launch_in_process,
    plant_flash_attn,
    recipe_env,
    run_recipe,
    with_pythonpath,
)

from verl_gsm8k.common.command_line import PREFIX
from verl_gsm8k.launch.cli import prune_finished, warn_unshared_run_dir
from verl_gsm8k.launch.knobs import hydra_quote, recipe_arguments
from verl_gsm8k.launch.plan import Recipe, bare_overrides, make_plan

# The tests that read one dry run made for several of them (module fixtures gpu_dry_run, knob_run)
# run on one xdist worker, so that each dry run is made once (a module fixture is per worker).
SHARED_DRY_RUNS = pytest.mark.xdist_group("test_recipes-dry-runs")
SECRETS = {"WANDB_API_KEY": "wandb-secret-0123456789", "HF_TOKEN": "hf_secret_abcdef123456"}
H100 = ("NVIDIA H100 80GB HBM3", 81559)


@dataclass
class DryRun:
    result: subprocess.CompletedProcess
    runs_root: Path


@pytest.fixture(scope="module")
def gpu_dry_run(tiny_model_dir, prepared_gsm8k_dir, tmp_path_factory) -> Callable[[str], DryRun]:
    """A recipe's DRY_RUN=1 on a GPU machine without flash_attn (a fake nvidia-smi lists an
    H100), a wandb key and an HF token in the environment, an extra key=value argument last:
    made once per recipe, on first use, for every test that reads it (each dry run ~12-18 s)."""
    base = tmp_path_factory.mktemp("gpu-dry-runs")
    bin_dir = fake_nvidia_smi(base / "bin", [H100], compute_cap="9.0")
    made: dict[str, DryRun] = {}

    def dry_run(recipe: str) -> DryRun:
        if recipe not in made:
            runs = base / recipe / "runs"
            env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, runs, DRY_RUN="1", **SECRETS)
            env["PATH"] = f"{bin_dir}:{env['PATH']}"
            env["FAKE_NVIDIA_SMI_CALLS"] = str(base / f"{recipe}.nvidia-smi-calls")
            # an extra key=value argument comes last, so it beats the recipe's own setting
            made[recipe] = DryRun(run_recipe(recipe, env, "trainer.test_freq=13"), runs)
        return made[recipe]

    return dry_run


@pytest.mark.slow
@SHARED_DRY_RUNS
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_passes_its_dry_run(recipe, tiny_model_dir, gpu_dry_run):
    made = gpu_dry_run(recipe)
    result = made.result
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"preflight: passed \(\d+ warning\(s\)\) in \d+\.\d s", result.stdout)
    # guarded and traced, on verl's v1 trainer or (ReMax, LoRA) its legacy one: ppo_trainer/
    assert re.search(r"preflight: \[ok\] trace: \d+ responses per step", result.stdout)
    assert "preflight: [warn] guard" not in result.stdout
    # the launch asked the GPUs once (common/gpus.py) for the plan, attention, preflight, record;
    # a bare `nvidia-smi` is verl's own platform check (verl/plugin/platform/platform_cuda.py)
    calls = (made.runs_root.parent.parent / f"{recipe}.nvidia-smi-calls").read_text().splitlines()
    ours = [call for call in calls if call]
    assert ours == ["--query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits"]
    cfg = composed_config(result.stdout)
    assert get(cfg, "trainer.test_freq") == 13
    assert get(cfg, "actor_rollout_ref.model.path") == str(tiny_model_dir)
    assert get(cfg, "reward.custom_reward_function.path") == str(ROOT / "rewards" / "gsm8k.py")
    assert get(cfg, "actor_rollout_ref.actor.strategy") == "fsdp2"
    assert get(cfg, "actor_rollout_ref.actor.calculate_entropy") is False  # v1 logs entropy anyway
    assert get(cfg, "critic.ppo_infer_max_token_len_per_gpu") == 16384
    assert get(cfg, "actor_rollout_ref.rollout.name") == "vllm"
    assert get(cfg, "trainer.resume_mode") == "auto"
    assert get(cfg, "trainer.val_before_train") is True
    run_dir = str(made.runs_root / recipe)
    assert get(cfg, "trainer.default_local_dir") == run_dir
    assert get(cfg, "trainer.rollout_data_dir") == f"{run_dir}/rollouts"
    assert not made.runs_root.exists(), "a dry run must not create the run directory"
    for key, value in RECIPE_SPECIFIC.get(recipe, {}).items():
        assert get(cfg, key) == value, (recipe, key)


# What a recipe sets beyond the base: GRPO drops the critic for group advantages; LoRA sets
# adapters and safetensors loading.
RECIPE_SPECIFIC = {
    "grpo_qwen2.5-0.5b_gsm8k": {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.actor.use_kl_loss": True,
        "algorithm.use_kl_in_reward": False,
        "actor_rollout_ref.rollout.n": 5,
    },
    "ppo_lora_qwen2.5-1.5b_gsm8k": {
        "actor_rollout_ref.model.lora_rank": 32,
        "critic.model.lora_rank": 0,  # verl 0.9.1 cannot wrap a critic in LoRA
        "trainer.use_v1": False,  # v1 crashes with a LoRA actor and a critic
        "critic.fsdp.offload_policy": True,  # 24 GB: critic states in host memory
        "actor_rollout_ref.rollout.load_format": "safetensors",
    },
}


# Each knob: the environment value set, and every verl key it must land on.
KNOBS = {
    "NNODES": ("2", ["trainer.nnodes"]),
    "NDEVICES_PER_NODE": ("4", ["trainer.n_gpus_per_node"]),
    "TRAIN_BATCH_SIZE": ("96", ["data.train_batch_size"]),
    "PPO_MINI_BATCH_SIZE": ("48", ["actor_rollout_ref.actor.ppo_mini_batch_size"]),
    "MAX_PROMPT_LENGTH": ("1024", ["data.max_prompt_length"]),
    "MAX_RESPONSE_LENGTH": ("300", ["data.max_response_length"]),
    "ACTOR_LR": ("2e-06", ["actor_rollout_ref.actor.optim.lr"]),
    "CRITIC_LR": ("3e-05", ["critic.optim.lr"]),
    "ROLLOUT_TP": ("2", ["actor_rollout_ref.rollout.tensor_model_parallel_size"]),
    "ROLLOUT_GPU_MEM_UTIL": ("0.55", ["actor_rollout_ref.rollout.gpu_memory_utilization"]),
    "ROLLOUT_N": ("2", ["actor_rollout_ref.rollout.n"]),
    "TOTAL_EPOCHS": ("3", ["trainer.total_epochs"]),
    "TOTAL_TRAINING_STEPS": ("11", ["trainer.total_training_steps"]),
    "SAVE_FREQ": ("7", ["trainer.save_freq"]),
    "TEST_FREQ": ("9", ["trainer.test_freq"]),
    "KL_COEF": ("0.005", ["algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.kl_loss_coef"]),
    "REWARD_FN": ("compute_score_flexible", ["reward.custom_reward_function.name"]),
    "PROJECT_NAME": ("knob_project", ["trainer.project_name"]),
    "EXPERIMENT_NAME": ("knob_experiment", ["trainer.experiment_name"]),
    "MAX_CKPT_TO_KEEP": (
        "5",
        ["trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"],
    ),
}


@pytest.fixture(scope="module")
def knob_run(tiny_model_dir, prepared_gsm8k_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("knobs")
    critic_dir = tmp / "critic-model"
    shutil.copytree(tiny_model_dir, critic_dir)
    paths = {
        "CRITIC_MODEL_PATH": str(critic_dir),
        "GSM8K_TRAIN_FILE": str(prepared_gsm8k_dir / "train.parquet"),
        "GSM8K_TEST_FILE": str(prepared_gsm8k_dir / "test.parquet"),
        "RUN_DIR": str(tmp / "my-run"),
        "LOGGER": "console,tensorboard",
    }
    env = recipe_env(
        tiny_model_dir,
        tmp / "no-data-here",
        tmp / "runs",
        DRY_RUN="1",
        **{k: v for k, (v, _) in KNOBS.items()},
        **paths,
    )
    result = launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return composed_config(result.stdout), paths


@SHARED_DRY_RUNS
@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_knob_lands_on_its_verl_key(knob, knob_run):
    cfg, _ = knob_run
    value, keys = KNOBS[knob]
    for key in keys:
        assert str(get(cfg, key)) == value, f"{knob}={value} did not reach {key}"


@SHARED_DRY_RUNS
def test_path_knobs_land_on_their_keys(knob_run):
    cfg, paths = knob_run
    assert get(cfg, "critic.model.path") == paths["CRITIC_MODEL_PATH"]
    assert get(cfg, "data.train_files") == [paths["GSM8K_TRAIN_FILE"]]
    assert get(cfg, "data.val_files") == [paths["GSM8K_TEST_FILE"]]
    for key, suffix in (
        ("default_local_dir", ""),
        ("rollout_data_dir", "/rollouts"),
        ("validation_data_dir", "/validation"),
    ):
        assert get(cfg, f"trainer.{key}") == paths["RUN_DIR"] + suffix
    assert get(cfg, "trainer.logger") == ["console", "tensorboard"]


@SHARED_DRY_RUNS
def test_the_printed_verl_command_run_by_hand_composes_the_launchers_config(gpu_dry_run, tmp_path):
    """DRY_RUN=1 prints the command a launch gives verl as one shell line; that line, run in a
    shell with ``--cfg job`` appended, prints the very config the launcher composed."""
    result = gpu_dry_run("smoke_tiny").result
    assert result.returncode == 0, result.stdout[-2000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith(PREFIX)]
    command = line.removeprefix(PREFIX)
    assert " -m verl.trainer.main_ppo " in command and " data.train_batch_size=16 " in command
    assert not any(value in line for value in SECRETS.values())
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    by_hand = subprocess.run(["bash", "-c", f"{command} --cfg job"], capture_output=True,
                             text=True, timeout=300, env=env, cwd=tmp_path)  # fmt: skip
    assert by_hand.returncode == 0, by_hand.stderr[-3000:]
    import yaml

    launched = composed_config(result.stdout)
    assert yaml.safe_load(by_hand.stdout) == launched
    assert (
        get(launched, "data.train_batch_size") == 16 and get(launched, "gsm8k_trace.samples") == 4
    )


@SHARED_DRY_RUNS
def test_secrets_are_never_printed_and_wandb_follows_the_key(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path, gpu_dry_run
):
    result = gpu_dry_run("ppo_qwen2.5-0.5b_gsm8k").result  # both secrets in its environment
    assert result.returncode == 0, result.stdout[-2000:]
    for value in SECRETS.values():
        assert value not in result.stdout + result.stderr
    assert get(composed_config(result.stdout), "trainer.logger") == ["console", "file", "wandb"]
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                     HF_TOKEN=SECRETS["HF_TOKEN"])  # fmt: skip
    result = launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 0, result.stdout[-2000:]
    assert SECRETS["HF_TOKEN"] not in result.stdout + result.stderr
    assert get(composed_config(result.stdout), "trainer.logger") == ["console", "file"]


def test_a_launch_names_the_knobs_it_took_from_the_environment(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    """A variable a shell exported for something else (SEED, LOGGER) is a knob here: the launch
    says in one line which knobs came from the environment, and no other variable."""
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                     SEED="7", LOGGER="console", NOT_A_KNOB="x")  # fmt: skip
    result = launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [x for x in result.stdout.splitlines() if "knobs from the environment" in x]
    words = line.removeprefix("recipe: knobs from the environment: ").split()
    assert sorted(words) == sorted([
        f"MODEL_PATH={tiny_model_dir}", f"DATA_DIR={prepared_gsm8k_dir}",
        f"RUNS_ROOT={tmp_path / 'runs'}", "DRY_RUN=1", "SEED=7", "LOGGER=console",
    ])  # fmt: skip
    assert get(composed_config(result.stdout), "data.seed") == 7


def test_without_gpu_a_recipe_stops_after_preflight_with_one_line(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs")
    env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi
    result = launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 3
    assert "preflight: passed" in result.stdout
    assert "no NVIDIA GPU is visible here" in result.stderr
    # it says how to train here instead
    assert "bash recipes/smoke_tiny.sh" in result.stderr and "DEVICE=cpu" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "runs").exists()


def test_a_failing_preflight_stops_the_recipe_before_verl(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1")
    result = launch_in_process(
        "ppo_qwen2.5-0.5b_gsm8k", env, "custom_reward_function.name=compute_score"
    )
    assert result.returncode == 1
    assert "use reward.custom_reward_function.name" in result.stdout
    assert "model_engine:" not in result.stdout  # verl's --cfg job never ran


def test_a_missing_local_model_is_one_line_before_anything_of_verl(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    missing = tmp_path / "no-such-model"
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                     MODEL_PATH=str(missing))  # fmt: skip
    result = launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"recipe: MODEL_PATH={missing} does not exist: a local directory holding the model's "
        "config.json and weights, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct"
    ]
    assert "preflight:" not in result.stdout  # nothing of verl was imported


def test_gpu_count_is_checked_against_the_request(tiny_model_dir, prepared_gsm8k_dir, tmp_path):
    env = recipe_env(
        tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1", NDEVICES_PER_NODE="2"
    )
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [("NVIDIA H100 80GB HBM3", 81559)])
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    result = launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 1
    assert "trainer.n_gpus_per_node=2 but this node has 1 GPU(s)" in result.stdout


def test_each_recipe_file_passes_the_launcher_its_array_and_the_users_arguments(tmp_path):
    """What bash hands the launcher is what launch.knobs.recipe_arguments reads from the file (the
    in-process launches of the tests, the docs' tables): each recipe run with a PYTHON that
    records its arguments."""
    record = tmp_path / "argv"
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "{record}"\n')
    python.chmod(0o755)
    recipes = sorted(path.stem for path in (ROOT / "recipes").glob("*.sh"))
    assert len(recipes) >= 13
    for recipe in recipes:
        env = recipe_env(Path("/x"), Path("/x"), Path("/x"), PYTHON=str(python))
        run = run_recipe(recipe, env, "a.b='c d'", "x=1")
        assert run.returncode == 0, run.stderr
        argv = record.read_text().split("\0")[:-1]
        words = recipe_arguments(ROOT / "recipes" / f"{recipe}.sh")
        assert argv == ["-m", "verl_gsm8k.launch", *words, "--", "a.b='c d'", "x=1"]


def test_help_lists_usage():
    result = run_recipe(
        "ppo_qwen2.5-0.5b_gsm8k", recipe_env(Path("/x"), Path("/x"), Path("/x")), "--help"
    )
    assert result.returncode == 0
    assert "DRY_RUN=1" in result.stdout


def test_relative_paths_become_absolute_for_ray_workers(tiny_model_dir, tmp_path):
    (tmp_path / "model").symlink_to(tiny_model_dir)
    env = recipe_env(Path("model"), Path("data"), Path("runs"), RUN_DIR="my-run")
    overrides = bare_overrides("gsm8k_ppo", env, cwd=tmp_path)
    assert f"actor_rollout_ref.model.path='{tmp_path}/model'" in overrides
    assert f"data.train_files=['{tmp_path}/data/train.parquet']" in overrides
    assert f"trainer.default_local_dir='{tmp_path}/my-run'" in overrides
    hub = bare_overrides(
        "gsm8k_ppo", dict(env, MODEL_PATH="Qwen/Qwen2.5-0.5B-Instruct"), cwd=tmp_path
    )
    assert "actor_rollout_ref.model.path='Qwen/Qwen2.5-0.5B-Instruct'" in hub  # a hub id stays


@pytest.mark.slow
def test_paths_with_quotes_and_spaces_reach_verl_exactly(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    """A quote in a path once broke Hydra's override parser; spaces, commas and = too now."""
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
    result = launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cfg = composed_config(result.stdout)
    assert get(cfg, "actor_rollout_ref.model.path") == str(model)
    assert get(cfg, "critic.model.path") == str(model)
    assert get(cfg, "data.train_files") == [str(data / "train.parquet")]
    assert get(cfg, "data.val_files") == [str(data / "test.parquet")]
    assert get(cfg, "reward.custom_reward_function.path") == str(reward)
    run_dir = runs / "ppo_qwen2.5-0.5b_gsm8k"
    assert get(cfg, "trainer.default_local_dir") == str(run_dir)
    assert get(cfg, "trainer.rollout_data_dir") == f"{run_dir}/rollouts"
    assert get(cfg, "trainer.validation_data_dir") == f"{run_dir}/validation"
    assert "preflight: [ok] reward: reward's file.py:compute_score" in result.stdout


def test_hydra_quote_round_trips_any_path():
    """The launcher's quoting against Hydra's own override parser, on quotes and backslashes."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    values = ["/data/my run's dir", "a\\b", "x\\'y", "ends\\", "''", "a,b=c [x]"]
    parser = OverridesParser.create()
    for value in values:
        text = hydra_quote(value)
        assert parser.parse_override(f"k={text}").value() == value, text
        assert parser.parse_override(f"k=[{text}]").value() == [value], text


def fake_verl_python(path: Path, record: Path) -> Path:
    """A PYTHON that runs everything for real but `-m verl.trainer.main_ppo`, which it records;
    every call is logged, one line each, in ``<record>.calls``."""
    path.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> "{record}.calls"\n'
        'if [[ "${1:-}" == "-m" && "${2:-}" == "verl.trainer.main_ppo" ]]; then\n'
        f'  {{ echo "metrics=$VERL_FILE_LOGGER_PATH"; printf "arg=%s\\n" "$@"; }} > "{record}"\n'
        '  echo "fake verl ran"; exit "${FAKE_VERL_RC:-0}"\n'
        "fi\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    path.chmod(0o755)
    return path


def test_launch_on_a_gpu_machine(tiny_model_dir, prepared_gsm8k_dir, tmp_path):
    """The training path: metrics file and console log in the run dir, user arguments last."""
    record = tmp_path / "launch.txt"
    python = fake_verl_python(tmp_path / "python", record)
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [("NVIDIA H100 80GB HBM3", 81559)])
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", PYTHON=str(python))
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    result = run_recipe("ppo_qwen2.5-0.5b_gsm8k", env, "trainer.total_epochs=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "preflight: [ok] gpu: 1 x NVIDIA H100 80GB HBM3" in result.stdout
    lines = record.read_text().splitlines()
    run_dir = tmp_path / "runs" / "ppo_qwen2.5-0.5b_gsm8k"
    metrics = Path(lines[0].removeprefix("metrics="))
    assert metrics.is_absolute() and metrics.parent == run_dir / "metrics"
    assert re.fullmatch(r"metrics-\d{8}T\d{6}Z\.jsonl", metrics.name)
    args = [line.removeprefix("arg=") for line in lines[1:]]
    assert args[:6] == [
        "-m",
        "verl.trainer.main_ppo",
        "--config-path",
        str(ROOT / "configs"),
        "--config-name",
        "gsm8k_ppo",
    ]
    assert args[-1] == "trainer.total_epochs=1"
    (console,) = (run_dir / "logs").glob("console-*.log")
    assert "fake verl ran" in console.read_text()
    # the whole launch is one Python process, and verl's driver another (knob checks, attention,
    # preflight, same-config check, record, supervision, status and pruning run in the launcher)
    calls = Path(f"{record}.calls").read_text().splitlines()
    assert len(calls) == 2 and calls[0].startswith("-m verl_gsm8k.launch "), calls


def test_a_cpu_only_ray_head_launches_onto_the_clusters_gpus(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    """DEVICE=gpu with RAY_ADDRESS: the launching node (a KubeRay head, a `ray job submit`
    entrypoint) has no GPU, the cluster has them (the preflight counts them through Ray:
    tests/test_ray_cluster.py)."""
    record = tmp_path / "launch.txt"
    python = fake_verl_python(tmp_path / "python", record)
    env = recipe_env(
        tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", PYTHON=str(python),
        DEVICE="gpu", SKIP_PREFLIGHT="1", RAY_ADDRESS="10.0.0.1:6379",
    )  # fmt: skip
    env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi here
    result = run_recipe("ppo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "device: gpu (DEVICE=gpu) on the Ray cluster at RAY_ADDRESS=10.0.0.1:6379" in (
        result.stdout
    )
    args = [line.removeprefix("arg=") for line in record.read_text().splitlines()[1:]]
    assert "+ray=attach" in args and "trainer.device=cpu" not in args
    record.unlink()
    auto = run_recipe("ppo_qwen2.5-0.5b_gsm8k", dict(env, DEVICE="auto"))
    assert auto.returncode == 3 and not record.exists()  # auto: nothing says the GPUs are there
    assert "To train on the GPUs of the Ray cluster at RAY_ADDRESS=10.0.0.1:6379: DEVICE=gpu" in (
        auto.stderr
    )
    env.pop("RAY_ADDRESS")
    alone = run_recipe("ppo_qwen2.5-0.5b_gsm8k", env)
    assert alone.returncode == 3 and "no NVIDIA GPU is visible here" in alone.stderr


RAY_COPY = "/var/raytmp/session_2026-11-24_01-00-00_000000_1/runtime_resources/working_dir_files"


@pytest.mark.parametrize(
    "nnodes,runs_root,warned",
    [
        ("2", "/tmp/runs", "under /tmp, usually a node's local disk"),
        ("2", f"{RAY_COPY}/_ray_pkg_0123/runs", "inside Ray's session directory"),
        ("2", "/mnt/shared/runs", None),
        ("1", "/tmp/runs", None),
    ],
)
def test_a_multi_node_run_dir_that_is_not_shared_is_warned(nnodes, runs_root, warned, capsys):
    """The launcher's warn_unshared_run_dir, which every launch calls."""
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


def test_the_launch_warns_of_a_node_local_run_dir(tiny_model_dir, prepared_gsm8k_dir, tmp_path):
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", NNODES="2",
                     DRY_RUN="1", SKIP_PREFLIGHT="1")  # fmt: skip
    result = launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "recipe: warning: NNODES=2 and RUN_DIR=" in result.stderr


def test_launch_returns_verl_exit_status(tiny_model_dir, prepared_gsm8k_dir, tmp_path):
    python = fake_verl_python(tmp_path / "python", tmp_path / "launch.txt")
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [("NVIDIA H100 80GB HBM3", 81559)])
    env = recipe_env(
        tiny_model_dir,
        prepared_gsm8k_dir,
        tmp_path / "runs",
        PYTHON=str(python),
        FAKE_VERL_RC="7",
        SKIP_PREFLIGHT="1",
    )
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    result = run_recipe("grpo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 7
    assert "verl exited with 7" in result.stdout


# ---------------------------------------------------------------------------------------------
# DEVICE and the attention fallback: which settings reach verl (its own --cfg job)


def test_device_cpu_adds_the_cpu_overlay_and_user_arguments_still_win(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    python = fake_verl_python(tmp_path / "python", tmp_path / "never-ran")
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                     PYTHON=str(python))  # fmt: skip
    env.update(DEVICE="cpu", PATH="/usr/bin:/bin")
    result = run_recipe("ppo_qwen2.5-0.5b_gsm8k", env, "reward.num_workers=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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
    calls = (tmp_path / "never-ran.calls").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("-m verl_gsm8k.launch "), calls


@SHARED_DRY_RUNS
def test_without_flash_attn_the_sdpa_fallback_keys_appear(gpu_dry_run):
    """A GPU machine without flash_attn: GPU settings, PyTorch attention WITH padding removal
    (ATTENTION=auto's default there: the sdpa_packed overlay), and it says so."""
    assert __import__("importlib").util.find_spec("flash_attn") is None
    result = gpu_dry_run("ppo_qwen2.5-0.5b_gsm8k").result
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"preflight: [ok] gpu: 1 x {H100[0]}" in result.stdout  # the GPU machine, seen
    said = "attention: sdpa, padding removal on (flash_attn not installed; packed rows, "
    assert f"device: gpu (DEVICE=auto) | {said}" in result.stdout  # the launch line
    assert f"[ok] device: trains on cuda; {said}" in result.stdout  # the preflight's
    cfg = composed_config(result.stdout)
    assert get(cfg, "trainer.device") == "cuda"  # no CPU settings on a GPU machine
    for role in ("actor_rollout_ref", "critic"):
        assert get(cfg, f"{role}.model.use_remove_padding") is True
        assert get(cfg, f"{role}.model.override_config.attn_implementation") == "sdpa"


def test_with_flash_attn_nothing_changes_on_a_gpu(tiny_model_dir, prepared_gsm8k_dir, tmp_path):
    site = plant_flash_attn(tmp_path / "site", works=True)  # its CUDA extension loads
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [("NVIDIA H100 80GB HBM3", 81559)])
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1")
    env = with_pythonpath(env, site)
    env.update(PATH=f"{bin_dir}:{env['PATH']}")
    result = run_recipe("ppo_qwen2.5-0.5b_gsm8k", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cfg = composed_config(result.stdout)
    assert get(cfg, "actor_rollout_ref.model.use_remove_padding") is True
    assert "attn_implementation" not in get(cfg, "critic.model.override_config")
    assert "+attention=sdpa" not in result.stdout


def test_pruning_never_removes_the_step_the_tracker_names(tmp_path, capsys):
    """MAX_CKPT_TO_KEEP keeps the newest steps, and the one latest_checkpointed_iteration.txt
    names (what a relaunch resumes from) even when it is older: the launcher's own call."""
    run = tmp_path / "run"
    for step in (2, 4, 6):
        (run / f"global_step_{step}" / "actor").mkdir(parents=True)
    (run / "latest_checkpointed_iteration.txt").write_text("2\n")
    prune_finished(run, "1")
    out = capsys.readouterr().out
    assert sorted(p.name for p in run.glob("global_step_*")) == ["global_step_2", "global_step_6"]
    assert "keeping" in out and "latest_checkpointed_iteration.txt names it" in out

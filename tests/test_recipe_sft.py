"""recipes/sft_qwen2.5-0.5b_gsm8k.sh, run for real: its dry run against the installed verl (knobs
on their keys in verl's own `--cfg job`, user arguments last, secrets never printed), the stop
without a GPU, and the exact command it launches (a stand-in PYTHON records verl's entry point).

It is not in helpers.RECIPES: the shared dry-run test there checks PPO keys (actor, critic,
rollout, reward) that verl's SFT config does not have.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from helpers import (
    ROOT,
    composed_config,
    fake_nvidia_smi,
    get,
    launch_in_process,
    recipe_env,
    run_recipe,
)

RECIPE = "sft_qwen2.5-0.5b_gsm8k"
SECRETS = {"WANDB_API_KEY": "wandb-secret-0123456789", "HF_TOKEN": "hf_secret_abcdef123456"}
# Each knob: the value set, and every verl key it must land on.
KNOBS = {
    "NDEVICES_PER_NODE": ("2", ["trainer.n_gpus_per_node"]),
    "TRAIN_BATCH_SIZE": ("48", ["data.train_batch_size"]),
    "MAX_LENGTH": ("512", ["data.max_length"]),
    "SFT_LR": ("2e-05", ["optim.lr"]),
    "TOTAL_EPOCHS": ("4", ["trainer.total_epochs"]),
    "TOTAL_TRAINING_STEPS": ("11", ["trainer.total_training_steps"]),
    "TEST_FREQ": ("9", ["trainer.test_freq"]),
    "MAX_CKPT_TO_KEEP": ("5", ["trainer.max_ckpt_to_keep"]),
    "PROJECT_NAME": ("knob_project", ["trainer.project_name"]),
    "EXPERIMENT_NAME": ("knob_experiment", ["trainer.experiment_name"]),
}
# The user's key=value arguments, each beating a different layer: a knob (SAVE_FREQ=7), the
# recipe's config file, the CPU overlay.
USER_ARGS = {
    "trainer.save_freq": 13,
    "data.max_token_len_per_gpu": 4096,
    "engine.use_torch_compile": True,
}


@pytest.fixture(scope="module")
def dry_run(tiny_model_dir, prepared_sft_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft-knobs")
    paths = {
        "SFT_TRAIN_FILE": str(prepared_sft_dir / "train.parquet"),
        "SFT_TEST_FILE": str(prepared_sft_dir / "test.parquet"),
        "RUN_DIR": str(tmp / "my-run"),
        "LOGGER": "console,tensorboard",
    }
    env = recipe_env(
        tiny_model_dir,
        tmp / "no-data-here",
        tmp / "runs",
        DRY_RUN="1",
        DEVICE="cpu",
        SAVE_FREQ="7",
        ACTOR_LR="1e-6",  # a PPO knob: ignored here, and said so
        **{k: v for k, (v, _) in KNOBS.items()},
        **paths,
        **SECRETS,
    )
    args = [f"{key}={str(value).lower()}" for key, value in USER_ARGS.items()]
    result = run_recipe(RECIPE, env, *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, composed_config(result.stdout), paths, tmp


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_knob_lands_on_its_verl_key(knob, dry_run):
    _, cfg, _, _ = dry_run
    value, keys = KNOBS[knob]
    for key in keys:
        assert str(get(cfg, key)) == value, f"{knob}={value} did not reach {key}"


def test_paths_and_logger_land_and_nothing_is_created(dry_run, tiny_model_dir):
    _, cfg, paths, tmp = dry_run
    assert get(cfg, "model.path") == str(tiny_model_dir)
    assert get(cfg, "data.train_files") == [paths["SFT_TRAIN_FILE"]]
    assert get(cfg, "data.val_files") == [paths["SFT_TEST_FILE"]]
    assert get(cfg, "trainer.default_local_dir") == paths["RUN_DIR"]
    assert get(cfg, "trainer.logger") == ["console", "tensorboard"]
    assert not (tmp / "my-run").exists() and not (tmp / "runs").exists()


def test_user_arguments_win(dry_run):
    _, cfg, _, _ = dry_run
    for key, value in USER_ARGS.items():
        assert get(cfg, key) == value, key


def test_the_sft_config_and_the_cpu_overlays_reach_verl(dry_run):
    result, cfg, _, _ = dry_run
    assert "device: cpu (DEVICE=cpu)" in result.stdout
    assert "preflight: [ok] device: trains on the CPU" in result.stdout
    # configs/gsm8k_sft.yaml
    assert get(cfg, "engine.strategy") == "fsdp2"
    assert get(cfg, "data.use_dynamic_bsz") is True
    assert get(cfg, "data.messages_key") == "messages"
    assert "model" in get(cfg, "checkpoint.save_contents")  # what scripts/merge.sh merges
    assert get(cfg, "trainer.resume_mode") == "auto"
    # configs/device/cpu_sft.yaml and configs/attention/sdpa_sft.yaml
    assert get(cfg, "trainer.device") == "cpu"
    assert get(cfg, "engine.mixed_precision") == {
        "param_dtype": "fp32",
        "reduce_dtype": "fp32",
        "buffer_dtype": "fp32",
    }
    assert get(cfg, "model.enable_gradient_checkpointing") is False
    assert get(cfg, "data.num_workers") == 0
    assert get(cfg, "model.use_remove_padding") is False
    assert get(cfg, "model.override_config.attn_implementation") == "sdpa"
    assert "actor_rollout_ref" not in cfg and "critic" not in cfg  # verl's SFT config only


def test_secrets_never_printed_and_ppo_knobs_said_to_be_ignored(dry_run):
    result, _, _, _ = dry_run
    for value in SECRETS.values():
        assert value not in result.stdout + result.stderr
    assert "recipe: ignoring ACTOR_LR: not knobs of verl's SFT trainer" in result.stderr


def test_without_gpu_it_stops_after_the_preflight_with_one_line(
    tiny_model_dir, prepared_sft_dir, tmp_path
):
    env = recipe_env(tiny_model_dir, prepared_sft_dir, tmp_path / "runs", TRAIN_BATCH_SIZE="32")
    env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi
    result = launch_in_process(RECIPE, env)
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    assert "preflight: passed" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "recipe: preflight passed, but no NVIDIA GPU is visible here. To train on this CPU at toy "
        f"scale: DEVICE=cpu bash recipes/{RECIPE}.sh; DRY_RUN=1 prints the final config."
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("knobs", "line"),
    [
        ({"SFT_LR": "fast"}, "knobs: SFT_LR=fast is not a number > 0 (e.g. 1e-6)"),
        ({"MAX_LENGTH": "1e3"}, "knobs: MAX_LENGTH=1e3 is not an integer > 0"),
        (
            {"NNODES": "2"},
            "recipe: NNODES=2: the SFT recipe trains on one node (torchrun --standalone); set "
            "NDEVICES_PER_NODE for more devices",
        ),
    ],
)
def test_a_bad_knob_stops_it_with_one_line(knobs, line, tmp_path):
    env = recipe_env(Path("/x"), Path("/x"), tmp_path / "runs", DRY_RUN="1", **knobs)
    result = launch_in_process(RECIPE, env)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output[-3000:]
    assert output == line


# ---------------------------------------------------------------------------------------------
# The command it launches (a stand-in PYTHON records verl's entry point instead of running it)


def recording_python(path: Path, record: Path) -> Path:
    """A PYTHON that runs everything for real but verl's SFT entry point, which it records."""
    path.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "${1:-}" == "-m" && ( "${2:-}" == "torch.distributed.run" ||'
        ' "${2:-}" == "verl_gsm8k.sft_trainer" ) ]]; then\n'
        f'  {{ echo "metrics=${{VERL_FILE_LOGGER_PATH:-}}"; env | grep "^VERL_" | sort;'
        f' printf "arg=%s\\n" "$@"; }} > "{record}"\n'
        '  echo "fake verl ran"; exit "${FAKE_VERL_RC:-0}"\n'
        "fi\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    path.chmod(0o755)
    return path


def recorded(record: Path) -> tuple[list[str], dict[str, str], str]:
    lines = record.read_text().splitlines()
    args = [line.removeprefix("arg=") for line in lines if line.startswith("arg=")]
    env = dict(line.split("=", 1) for line in lines if line.startswith("VERL_"))
    return args, env, lines[0].removeprefix("metrics=")


CONFIG_ARGS = ["--config-path", str(ROOT / "configs"), "--config-name", "gsm8k_sft"]


def test_launch_on_a_gpu_machine_runs_torchrun_with_user_arguments_last(
    tiny_model_dir, prepared_sft_dir, tmp_path
):
    record = tmp_path / "launch.txt"
    python = recording_python(tmp_path / "python", record)
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [("NVIDIA H100 80GB HBM3", 81559)])
    env = recipe_env(
        tiny_model_dir,
        prepared_sft_dir,
        tmp_path / "runs",
        PYTHON=str(python),
        SKIP_PREFLIGHT="1",
        NDEVICES_PER_NODE="2",
    )
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    result = run_recipe(RECIPE, env, "trainer.total_epochs=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    args, verl_env, metrics = recorded(record)
    assert args[:11] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=2",
        "-m",
        "verl_gsm8k.sft_trainer",
        *CONFIG_ARGS,
    ]
    assert args[-1] == "trainer.total_epochs=1"
    assert "+device=cpu_sft" not in args and "VERL_PLATFORM" not in verl_env
    run_dir = tmp_path / "runs" / RECIPE
    assert Path(metrics).parent == run_dir / "metrics"
    assert re.fullmatch(r"metrics-\d{8}T\d{6}Z\.jsonl", Path(metrics).name)
    (console,) = (run_dir / "logs").glob("console-*.log")
    assert "fake verl ran" in console.read_text()
    assert f"bash scripts/merge.sh {run_dir} OUT_DIR" in result.stdout


def test_launch_on_the_cpu_loads_the_cpu_platform(tiny_model_dir, prepared_sft_dir, tmp_path):
    record = tmp_path / "launch.txt"
    python = recording_python(tmp_path / "python", record)
    env = recipe_env(
        tiny_model_dir,
        prepared_sft_dir,
        tmp_path / "runs",
        PYTHON=str(python),
        SKIP_PREFLIGHT="1",
        DEVICE="cpu",
    )
    env["PATH"] = "/usr/bin:/bin"
    result = run_recipe(RECIPE, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    args, verl_env, _ = recorded(record)
    assert args[:5] == ["-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                        "--nproc_per_node=1"]  # fmt: skip
    assert "+device=cpu_sft" in args and "+attention=sdpa_sft" in args
    assert verl_env["VERL_PLATFORM"] == "cpu" and verl_env["VERL_ENGINE_DEVICE"] == "cuda"
    assert set(verl_env["VERL_USE_EXTERNAL_MODULES"].split(",")) == {
        "verl_gsm8k.verl_plugins.checked_load",  # the SFT trainer's resume loads are checked too
        "verl_gsm8k.verl_plugins.cpu_platform",
        "verl_gsm8k.verl_plugins.attention_fallback",
    }


@pytest.mark.parametrize(
    ("knobs", "epochs"),
    [({}, "3"), ({"TOTAL_TRAINING_STEPS": "150"}, "150"), ({"TOTAL_TRAINING_STEPS": "150",
      "TOTAL_EPOCHS": "2"}, "2")],
)  # fmt: skip
def test_a_step_count_alone_brings_enough_epochs(knobs, epochs, tiny_model_dir, tmp_path):
    """verl's SFT loop also stops at total_epochs: given only a step count, the recipe allows as
    many epochs as steps. The dry run's config print runs in the launcher's own process (verl's
    entry point as `python -m` runs it), never under torchrun."""
    record = tmp_path / "launch.txt"
    python = recording_python(tmp_path / "python", record)
    env = recipe_env(
        tiny_model_dir,
        tmp_path / "data",
        tmp_path / "runs",
        PYTHON=str(python),
        SKIP_PREFLIGHT="1",
        DRY_RUN="1",
        **knobs,
    )
    result = launch_in_process(RECIPE, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not record.exists()  # neither torchrun nor a second Python started
    lines = result.stdout.splitlines()
    cfg = yaml.safe_load("\n".join(line for line in lines if not line.startswith("recipe:")))
    assert str(get(cfg, "trainer.total_epochs")) == epochs


def test_help_lists_usage():
    result = run_recipe(RECIPE, recipe_env(Path("/x"), Path("/x"), Path("/x")), "--help")
    assert result.returncode == 0
    assert f"bash recipes/{RECIPE}.sh" in result.stdout and "DRY_RUN=1" in result.stdout

"""recipes/learn_tiny.sh without training: its dry run against the installed verl (ALGO picks the
algorithm's config, the recipe's toy settings reach verl's keys, user arguments win), a model and
data set by hand replace the warm start and the toy task (nothing is built), and a bad ALGO stops
it with one line. Its training runs are tests/test_learn_cpu.py (slow).

It is not in helpers.RECIPES: with no MODEL_PATH its dry run would first build the warm start
(an SFT run), which the shared dry-run test must not wait for.
"""

from __future__ import annotations

import pytest
from helpers import ROOT, composed_config, get, launch_in_process, recipe_env

from verl_gsm8k.launch.knobs import LEARN_ALGOS, recipe_arguments

RECIPE = "learn_tiny"
TOY_SETTINGS = {
    "data.train_batch_size": 16,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    "actor_rollout_ref.rollout.n": 8,
    "data.max_prompt_length": 128,
    "data.max_response_length": 24,
    "actor_rollout_ref.actor.optim.lr": 3e-4,
    "trainer.total_training_steps": 20,
    "trainer.save_freq": 10,  # checkpoints at 10 and 20: the last to merge, both to sweep
    "trainer.test_freq": 5,
    "data.seed": 0,
    # the actor's learning rate decays to a tenth over the run (cosine)
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine",
    "actor_rollout_ref.actor.optim.min_lr_ratio": 0.1,
}


def dry_run(algo: str, tiny_model_dir, prepared_gsm8k_dir, tmp_path, *args: str):
    env = recipe_env(
        tiny_model_dir,
        prepared_gsm8k_dir,
        tmp_path / "runs",
        DRY_RUN="1",
        ALGO=algo,
        CACHE_DIR=str(tmp_path / "cache"),
    )
    result = launch_in_process(RECIPE, env, *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, composed_config(result.stdout)


@pytest.mark.parametrize(
    ("algo", "estimator"), [("ppo", "gae"), ("grpo", "grpo"), ("dapo", "grpo")]
)
def test_algo_picks_the_config_and_the_toy_settings_reach_verl(
    algo, estimator, tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    result, cfg = dry_run(algo, tiny_model_dir, prepared_gsm8k_dir, tmp_path)
    assert f"config: configs/gsm8k_{algo}.yaml" in result.stdout
    assert get(cfg, "algorithm.adv_estimator") == estimator
    for key, value in TOY_SETTINGS.items():
        assert get(cfg, key) == value, key
    if algo == "ppo":
        assert get(cfg, "critic.optim.lr") == 1e-3
    if algo == "dapo":  # the overlong buffer: a fifth of the toy's 24-token responses
        assert get(cfg, "reward.reward_kwargs.overlong_buffer_cfg.len") == 4
        assert get(cfg, "algorithm.filter_groups.enable") is True
    # the CPU by default, in float32 (configs/device/cpu.yaml)
    assert "device: cpu (DEVICE=auto)" in result.stdout
    assert get(cfg, "actor_rollout_ref.rollout.dtype") == "float32"
    assert get(cfg, "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype") == "fp32"
    # MODEL_PATH and DATA_DIR set by hand: no toy task, no warm start built
    assert get(cfg, "actor_rollout_ref.model.path") == str(tiny_model_dir)
    assert get(cfg, "data.train_files") == [str(prepared_gsm8k_dir / "train.parquet")]
    assert "warm start" not in result.stdout and "toy task" not in result.stdout
    assert not (tmp_path / "cache" / "learn-tiny").exists()
    assert get(cfg, "trainer.experiment_name").startswith(f"learn_tiny_{algo}_")


def test_the_hard_toy_task_has_sums_up_to_nine_in_a_cache_of_its_own(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    """TOY_TASK=hard: the toy task is built with sums up to 9 + 9 (100 sums, 4000 training
    questions) under learn-tiny/v2/hard/, apart from the easy task's cache; a model set by hand
    (no warm start built here: the benchmark builds it, the first SFT save in 0.30-0.45)."""
    import pyarrow.parquet as pq

    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                     TOY_TASK="hard", CACHE_DIR=str(tmp_path / "cache"))  # fmt: skip
    env.pop("DATA_DIR")
    result = launch_in_process(RECIPE, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "toy task (hard: sums up to 9 + 9" in result.stdout
    data = tmp_path / "cache" / "learn-tiny" / "v2" / "hard" / "seed0" / "data" / "rl"
    assert get(composed_config(result.stdout), "data.train_files") == [str(data / "train.parquet")]
    rows = pq.read_table(data / "test.parquet").to_pylist()
    answers = {row["reward_model"]["ground_truth"] for row in rows}
    assert answers == {str(n) for n in range(19)}  # 0 + 0 ... 9 + 9
    assert pq.read_metadata(data / "train.parquet").num_rows == 4000


def test_user_arguments_and_knobs_win(tiny_model_dir, prepared_gsm8k_dir, tmp_path):
    env = recipe_env(
        tiny_model_dir,
        prepared_gsm8k_dir,
        tmp_path / "runs",
        DRY_RUN="1",
        ACTOR_LR="1e-4",
        SEED="7",
        EXPERIMENT_NAME="mine",
    )
    result = launch_in_process(RECIPE, env, "trainer.test_freq=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cfg = composed_config(result.stdout)
    assert get(cfg, "actor_rollout_ref.actor.optim.lr") == 1e-4
    assert get(cfg, "data.seed") == 7
    assert get(cfg, "trainer.test_freq") == 2
    assert get(cfg, "trainer.experiment_name") == "mine"


@pytest.mark.parametrize(
    ("knob", "line"),
    [
        ("ALGO=reinforce", "knobs: ALGO=reinforce is not one of " + ", ".join(LEARN_ALGOS)),
        ("SEED=-1", "knobs: SEED=-1 is not an integer >= 0"),
        ("WARM_START_STEPS=0", "knobs: WARM_START_STEPS=0 is not an integer > 0"),
        ("TOY_TASK=medium", "knobs: TOY_TASK=medium is not one of easy, hard"),
        (
            "WARM_START_ACC=0.45-0.30",
            "knobs: WARM_START_ACC=0.45-0.30 is not last, or an accuracy band LOW-HIGH with "
            "0 <= LOW <= HIGH <= 1 (e.g. 0.30-0.45)",
        ),
    ],
)
def test_a_bad_knob_stops_it_before_anything_is_built(knob, line, tmp_path):
    name, value = knob.split("=")
    env = recipe_env(tmp_path / "none", tmp_path / "none", tmp_path / "runs", **{name: value})
    env.pop("MODEL_PATH")
    env.pop("DATA_DIR")
    env["CACHE_DIR"] = str(tmp_path / "cache")
    result = launch_in_process(RECIPE, env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()


def test_every_algorithm_config_is_an_algo_with_its_recipe_and_its_doc_row():
    """ALGO's names come from configs/ alone (a new algorithm's config is its ALGO); each has a
    recipe file of its own naming that config, and its row in docs/algorithms.md's table; the
    configs that are not an algorithm (base, LoRA, SFT) are not ALGOs."""
    configs = {p.stem.removeprefix("gsm8k_") for p in (ROOT / "configs").glob("gsm8k_*.yaml")}
    assert set(LEARN_ALGOS) == configs - {"base", "ppo_lora", "sft"}
    assert LEARN_ALGOS[:2] == ("ppo", "grpo")  # the default and the suite's second, listed first
    recipe_configs = {
        args[args.index("--config") + 1]
        for path in (ROOT / "recipes").glob("*_qwen2.5-*_gsm8k.sh")
        for args in [recipe_arguments(path)]
    }
    algorithms_doc = (ROOT / "docs" / "algorithms.md").read_text()
    for algo in LEARN_ALGOS:
        assert f"gsm8k_{algo}" in recipe_configs, algo  # its recipe file
        assert f"(`gsm8k_{algo}`)" in algorithms_doc, algo  # its row of the table

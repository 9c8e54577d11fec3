"""recipes/learn_tiny.sh without training (its training runs: tests/test_learn_cpu.py)."""

import pytest
from helpers import ROOT, composed_config, get, launch_in_process, recipe_env

from verl_gsm8k.launch.knobs import LEARN_ALGOS, recipe_arguments

RECIPE = "learn_tiny"
A = "actor_rollout_ref.actor."
TOY_SETTINGS = {
    "data.train_batch_size": 16, f"{A}ppo_mini_batch_size": 8, "actor_rollout_ref.rollout.n": 8,
    "data.max_prompt_length": 128, "data.max_response_length": 24, f"{A}optim.lr": 3e-4,
    "trainer.total_training_steps": 20, "trainer.test_freq": 5, "data.seed": 0,
    "trainer.save_freq": 10,  # checkpoints at 10 and 20: the last to merge, both to sweep
    f"{A}optim.lr_scheduler_type": "cosine", f"{A}optim.min_lr_ratio": 0.1,  # to a tenth
}  # fmt: skip


def dry_run(tmp_path, model, data, *args: str, **knobs: str):
    env = recipe_env(model, data, tmp_path / "runs", DRY_RUN="1", CACHE_DIR=str(tmp_path / "c"),
                     **knobs)  # fmt: skip
    result = launch_in_process(RECIPE, env, *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, composed_config(result.stdout)


@pytest.mark.parametrize(
    ("algo", "estimator"), [("ppo", "gae"), ("grpo", "grpo"), ("dapo", "grpo")]
)
def test_algo_picks_the_config_and_the_toy_settings_reach_verl(
    algo, estimator, tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    result, cfg = dry_run(tmp_path, tiny_model_dir, prepared_gsm8k_dir, ALGO=algo)
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
    assert get(cfg, f"{A}fsdp_config.mixed_precision.param_dtype") == "fp32"
    # MODEL_PATH and DATA_DIR set by hand: no toy task, no warm start built
    assert get(cfg, "actor_rollout_ref.model.path") == str(tiny_model_dir)
    assert get(cfg, "data.train_files") == [str(prepared_gsm8k_dir / "train.parquet")]
    assert "warm start" not in result.stdout and "toy task" not in result.stdout
    assert not (tmp_path / "c" / "learn-tiny").exists()
    assert get(cfg, "trainer.experiment_name").startswith(f"learn_tiny_{algo}_")


def test_the_products_task_hands_its_products_to_the_calculator_and_knobs_win(
    tmp_path,
):
    """TOY_TASK=products: its own cache, rows for verl's tool agent loop, the calculator's launch
    (tool config, longer prompts and responses, 10 steps, sampled validation); the knobs and the
    user's key=value win over the hooks' settings. The tiny model uses --tool-tokens: the prompts
    would not fit else."""
    import pyarrow.parquet as pq

    from verl_gsm8k.common.tiny_model import make_tiny_model
    from verl_gsm8k.tools import config_path

    model = make_tiny_model(tmp_path / "tiny-qwen2-tools", tools=True)
    result, cfg = dry_run(tmp_path, model, "", "trainer.test_freq=2",
                          "actor_rollout_ref.rollout.val_kwargs.n=2", TOY_TASK="products",
                          ACTOR_LR="1e-4", SEED="7", EXPERIMENT_NAME="mine")  # fmt: skip
    assert "toy task (products: two-digit products, with the calculator" in result.stdout
    data = tmp_path / "c" / "learn-tiny" / "v2" / "products" / "seed7" / "data" / "rl"
    assert get(cfg, "data.train_files") == [str(data / "train.parquet")]
    rows = pq.read_table(data / "test.parquet").to_pylist()
    assert {row["agent_name"] for row in rows} == {"tool_agent"} and len(rows) == 100
    rollout = "actor_rollout_ref.rollout."
    assert get(cfg, f"{rollout}multi_turn.tool_config_path") == str(config_path("calculator"))
    assert get(cfg, "data.max_prompt_length") == 256 and get(cfg, "data.max_response_length") == 80
    assert get(cfg, "trainer.total_training_steps") == 10
    assert get(cfg, f"{A}optim.lr") == 1e-4 and get(cfg, "data.seed") == 7
    assert get(cfg, "trainer.test_freq") == 2 and get(cfg, "trainer.experiment_name") == "mine"
    # validation samples, as training does (greedy, the warm start calls the tool every time)
    assert get(cfg, f"{rollout}val_kwargs.temperature") == 1.0
    assert get(cfg, f"{rollout}val_kwargs.n") == 2


def test_a_bad_knob_stops_it_before_anything_is_built(tmp_path):
    env = recipe_env(tmp_path / "none", tmp_path / "none", tmp_path / "runs", TOY_TASK="medium",
                     CACHE_DIR=str(tmp_path / "cache"))  # fmt: skip
    env.pop("MODEL_PATH")
    env.pop("DATA_DIR")
    result = launch_in_process(RECIPE, env)
    assert result.returncode == 2
    said = ["knobs: TOY_TASK=medium is not one of easy, products"]
    assert result.stderr.strip().splitlines() == said
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()


def test_every_algorithm_config_is_an_algo_with_its_recipe_and_its_doc_row():
    configs = {p.stem.removeprefix("gsm8k_") for p in (ROOT / "configs").glob("gsm8k_*.yaml")}
    assert set(LEARN_ALGOS) == configs - {"base", "ppo_lora", "sft"}
    assert LEARN_ALGOS[:2] == ("ppo", "grpo")  # the default and the suite's second, listed first
    recipe_configs = {args[args.index("--config") + 1]
                      for path in (ROOT / "recipes").glob("*_qwen2.5-*_gsm8k.sh")
                      for args in [recipe_arguments(path)]}  # fmt: skip
    algorithms_doc = (ROOT / "docs" / "algorithms.md").read_text()
    for algo in LEARN_ALGOS:
        assert f"gsm8k_{algo}" in recipe_configs, algo  # its recipe file
        assert f"(`gsm8k_{algo}`)" in algorithms_doc, algo  # its row of the table

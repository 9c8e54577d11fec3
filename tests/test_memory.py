"""The preflight's GPU memory per phase (verl_gsm8k/preflight/memory.py), held against verl 0.9.1's
own code: the engines verl really builds from our composed configs (which keep their states in
host memory for good, which offload between phases, in which dtype, how many trained
parameters), and verl's context switch (which states come back to the GPU for an update or a
forward pass). Then the recipes' figures on a 24 GB card, and every fix the preflight prints
composes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from helpers import QWEN25_05B, QWEN25_15B, ROOT, fake_nvidia_smi, recipe_env

from verl_gsm8k.launch.plan import bare_overrides
from verl_gsm8k.preflight import cli as preflight
from verl_gsm8k.preflight.memory import GIB, Engine, check_memory, engine_of
from verl_gsm8k.preflight.model import count_parameters

CARD_24GB = 24564 / 1024  # GiB of an RTX 4090 / L4-class card, as nvidia-smi lists it
# case -> (config, overrides); the roles verl builds for each (a LoRA actor is its own reference).
CASES = {
    "ppo": ("gsm8k_ppo", ["actor_rollout_ref.model.lora_rank=0"]),
    "ppo, actor offload_policy, critic param_offload": (
        "gsm8k_ppo",
        ["actor_rollout_ref.actor.fsdp_config.offload_policy=True",
         "critic.fsdp.param_offload=True"],
    ),  # fmt: skip
    "lora": ("gsm8k_ppo_lora", ["actor_rollout_ref.model.lora_rank=8"]),
    "lora, critic offloaded between phases": (
        "gsm8k_ppo_lora",
        ["actor_rollout_ref.model.lora_rank=8", "critic.fsdp.offload_policy=False",
         "critic.fsdp.param_offload=True", "critic.fsdp.optimizer_offload=True"],
    ),
}  # fmt: skip
ROLES = {"gsm8k_ppo": ("actor", "reference", "critic"), "gsm8k_ppo_lora": ("actor", "critic")}

# Builds each role's engine the way verl's workers do (engine_workers.py: TrainingWorker ->
# EngineRegistry.new -> initialize), on verl's CPU platform, and prints what verl decided.
BUILD_ENGINES = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch, verl
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine import EngineRegistry
    from verl_gsm8k.preflight.compose import compose
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    cases, roles, model = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    facts = {}
    for case, (config, overrides) in cases.items():
        paths = [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}"]
        cfg = compose(Path(sys.argv[4]), config, paths + overrides)
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        ref = omega_conf_to_dataclass(cfg.actor_rollout_ref.ref.fsdp_config)
        object.__setattr__(ref, "strategy", cfg.actor_rollout_ref.ref.strategy)  # as ActorConfig
        critic = omega_conf_to_dataclass(cfg.critic)
        model_cfg = lambda: omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
        built = {
            "actor": ("language_model", model_cfg(), actor.engine, actor.optim, actor.checkpoint),
            "reference": ("language_model", model_cfg(), ref, actor.optim, actor.checkpoint),
            "critic": ("value_model", critic.model, critic.engine, critic.optim, critic.checkpoint),
        }
        for role in roles[config]:
            kind, model_config, engine_config, optim, checkpoint = built[role]
            model_config.model_type = kind
            engine = EngineRegistry.new(
                model_type=kind, backend=engine_config.strategy, model_config=model_config,
                engine_config=engine_config, optimizer_config=optim, checkpoint_config=checkpoint,
            )
            engine.initialize()
            params = list(engine.module.parameters())
            facts[f"{case}/{role}"] = {
                "policy": engine._uses_fsdp2_cpu_offload_policy,
                "param_offload": engine.is_param_offload_enabled,
                "optimizer_offload": engine.is_optimizer_offload_enabled,
                "itemsize": sorted({p.dtype.itemsize for p in params}),
                "total": sum(p.numel() for p in params),
                "trainable": sum(p.numel() for p in params if p.requires_grad),
                "optimizer": engine.optimizer is not None,
            }
    print(json.dumps(facts))
    """
)


@pytest.fixture(scope="module")
def verl_engines(tiny_model_dir) -> dict:
    """What verl 0.9.1 builds for each case and role (a fresh interpreter, verl's CPU platform)."""
    env = dict(
        os.environ,
        VERL_PLATFORM="cpu",
        VERL_ENGINE_DEVICE="cuda",
        VERL_USE_EXTERNAL_MODULES="verl_gsm8k.verl_plugins.cpu_platform,"
        "verl_gsm8k.verl_plugins.attention_fallback",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="0",  # one rank: its store listens on a port the kernel picks, no race
        HF_HUB_OFFLINE="1",
    )
    args = [json.dumps(CASES), json.dumps(ROLES), str(tiny_model_dir), str(ROOT / "configs")]
    result = subprocess.run(
        [sys.executable, "-c", BUILD_ENGINES, *args],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def composed(config: str, overrides: list[str], model: str = "/models/m"):
    paths = [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}"]
    return preflight.compose(ROOT / "configs", config, paths + overrides)


@pytest.mark.parametrize("case", sorted(CASES))
def test_engines_are_placed_as_verl_builds_them(case, verl_engines, tiny_model_dir):
    from transformers import AutoConfig

    config, overrides = CASES[case]
    cfg = composed(config, overrides, str(tiny_model_dir))
    hf_config = AutoConfig.from_pretrained(tiny_model_dir)
    for role in ROLES[config]:
        real = verl_engines[f"{case}/{role}"]
        ours = engine_of(cfg, role, hf_config, n_gpus=1)
        where = f"{case}/{role}: {ours} vs verl's {real}"
        assert bool(ours.host) == real["policy"], where  # CPUOffloadPolicy: host memory for good
        assert ours.param_offload == real["param_offload"], where
        assert ours.optimizer_offload == real["optimizer_offload"], where
        (itemsize,) = real["itemsize"]  # one dtype: the LoRA base too is held in model_dtype
        assert round(ours.weights * GIB) == real["total"] * itemsize, where
        trained = real["trainable"] if real["optimizer"] else 0  # a reference has no optimizer
        assert round(ours.trained * GIB) == trained * itemsize, where
    if config == "gsm8k_ppo_lora":  # the critic's states stay in host memory in the recipe
        assert verl_engines[f"{case}/critic"]["policy"] is (case == "lora")


@pytest.mark.parametrize("param_offload", [False, True])
@pytest.mark.parametrize("optimizer_offload", [False, True])
def test_states_per_phase_follow_verls_context_switch(
    param_offload, optimizer_offload, monkeypatch
):
    """verl's BaseEngineCtx (engine/base.py ~315-328) decides which states an update or a
    forward pass brings to the GPU; a recording engine shows where each state is."""
    from verl.workers.engine import base

    monkeypatch.setattr(base, "get_device_name", lambda: "cuda")

    class Recording:  # FSDPEngine.to() moves the states whose flag is set (transformer_impl ~844)
        is_param_offload_enabled = param_offload
        is_optimizer_offload_enabled = optimizer_offload
        mode = None

        def __init__(self) -> None:
            self.where = {"model": "cuda", "optimizer": "cuda", "grad": "cuda"}

        def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True):
            for state, moved in (("model", model), ("optimizer", optimizer), ("grad", grad)):
                self.where[state] = device if moved else self.where[state]

    engine = Recording()
    # FSDPEngine.initialize (~226) offloads what the flags say, once the model is built
    engine.to("cpu", model=param_offload, optimizer=optimizer_offload, grad=param_offload)
    weights, trained = 10.0, 1.0  # GiB: every weight, and the trained ones (Adam: 2 moments)

    def on_gpu() -> float:  # weights and Adam moments wherever verl put them
        on = {state: where == "cuda" for state, where in engine.where.items()}
        return weights * on["model"] + 2 * trained * on["optimizer"]

    with base.BaseEngineCtx(engine, "train"):
        update = on_gpu() + trained * (engine.where["model"] == "cuda")  # grads beside weights
    with base.BaseEngineCtx(engine, "eval"):
        forward = on_gpu()
    resting = on_gpu()
    ours = Engine("critic", "", param_offload, optimizer_offload, weights, trained, 0.0, "fp32")
    assert (ours.update(), ours.forward(), ours.resting()) == (update, forward, resting)


def lora_recipe(tiny_model_dir, prepared_gsm8k_dir, tmp_path, *extra: str):
    """The LoRA recipe's composed config (its knob defaults and RECIPE_OVERRIDES)."""
    knobs = {"TRAIN_BATCH_SIZE": "64", "PPO_MINI_BATCH_SIZE": "32", "TRACE_SAMPLES": "0"}
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path / "runs", **knobs)
    overrides = bare_overrides("gsm8k_ppo_lora", env)
    overrides += ["actor_rollout_ref.model.lora_rank=32", *extra]
    return overrides, preflight.compose(ROOT / "configs", "gsm8k_ppo_lora", overrides)


def memory_lines(cfg, model: dict, card: float | None) -> preflight.Report:
    from transformers import Qwen2Config

    report = preflight.Report()
    check_memory(cfg, {"actor": Qwen2Config(**model)}, card, report)
    return report


def composes_with_every_fix(overrides: list[str], line: str) -> None:
    keys = line.split("; try ", 1)[1].split(", ")
    assert keys, line
    for key in keys:
        fixed = re.sub(r"=N\b.*$", "=0.3" if "utilization" in key else "=8192", key)
        preflight.compose(ROOT / "configs", "gsm8k_ppo_lora", overrides + [fixed])


PACKED = ["actor_rollout_ref.model.use_remove_padding=True",
          "critic.model.use_remove_padding=True"]  # fmt: skip
PADDED = [key.replace("True", "False") for key in PACKED]  # the sdpa overlay's
# flash-attn 2 (its varlen kernels, its cross entropy): what a GPU with a flash-attn wheel runs
PADDING_REMOVED = [*PACKED, *(f"{role}.override_config.attn_implementation=flash_attention_2"
                              for role in ("actor_rollout_ref.model", "critic.model"))]  # fmt: skip


def test_lora_recipe_fits_a_24gb_card(tiny_model_dir, prepared_gsm8k_dir, tmp_path):
    """With flash-attn (padding removal) the recipe fits with room: the old log-prob pass (the
    entropy over the vocabulary verl always computes there) holds the bf16 logits alone, 16384
    tokens x 151936 x 2 bytes = 4.6 GiB, since the compiled entropy keeps nothing logits-sized on
    CUDA (measured on an H100 by the GPU probe, docs/gpu.md; the estimate counted a 9.3 GiB fp32
    buffer before and warned at 22.2 GiB); the actor update is the heaviest phase."""
    overrides, cfg = lora_recipe(tiny_model_dir, prepared_gsm8k_dir, tmp_path, *PADDING_REMOVED)
    report = memory_lines(cfg, QWEN25_15B, CARD_24GB)
    phases = [line.split("memory: ", 1)[1].split(":")[0] for line in report.lines]
    assert phases == [
        "rollout", "old log-prob", "reference", "critic values", "critic update", "actor update"
    ]  # fmt: skip
    assert report.errors == 0 and report.warnings == 0, report.lines
    old_log_prob = report.lines[1]
    assert "memory: old log-prob: ~" in old_log_prob and "actor activations 4.7" in old_log_prob
    totals = [float(re.search(r": ~(\d+\.\d) GiB", line)[1]) for line in report.lines]
    assert max(totals) == totals[5] < 0.9 * 24, report.lines  # the actor update
    assert "vLLM asleep (context, CUDA graphs) 1.5" in report.lines[5]
    critic = report.lines[4]
    assert "critic states in host memory (offload_policy: CPUOffloadPolicy)" in critic
    assert "critic weights+grads+Adam" not in critic


def test_padded_micro_batches_do_not_fit_the_old_log_prob_pass(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    """Without flash-attn (the sdpa overlay) verl pads each micro-batch to its longest sequence
    (SDPA_PADDING_FACTOR over the 16384-token budget) and runs entropy_from_logits eagerly
    (bf16 logits, fp32 softmax, fp32 logsumexp copy and temporary: 14 bytes a logit): the
    recipe's log-prob budget does not fit a 24 GiB card; the fix lowers it."""
    from verl_gsm8k.preflight.memory import SDPA_PADDING_FACTOR

    overrides, cfg = lora_recipe(tiny_model_dir, prepared_gsm8k_dir, tmp_path, *PADDED)
    report = memory_lines(cfg, QWEN25_15B, CARD_24GB)
    errors = [line for line in report.lines if "[error]" in line]
    assert any("memory: old log-prob: ~" in line for line in errors), report.lines
    old = next(line for line in errors if "old log-prob" in line)
    acts = float(re.search(r"actor activations (\d+\.\d)", old).group(1))
    tokens = 16384 * SDPA_PADDING_FACTOR
    assert acts == pytest.approx(tokens * (151936 * 14 + 1536 * 2) / GIB, abs=0.05)
    assert "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=N" in old
    composes_with_every_fix(overrides, old)


def test_critic_offloaded_between_phases_is_stopped_at_its_update(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    """The recipe's former layout: param_offload + optimizer_offload bring the 1.5B critic's
    fp32 weights, gradients and both Adam moments back to the GPU for every update."""
    from transformers import Qwen2Config
    from verl.utils.torch_dtypes import PrecisionType
    from verl.workers.config import FSDPEngineConfig

    old = ["critic.fsdp.offload_policy=False", "critic.fsdp.param_offload=True",
           "critic.fsdp.optimizer_offload=True"]  # fmt: skip
    overrides, cfg = lora_recipe(
        tiny_model_dir, prepared_gsm8k_dir, tmp_path, *old, *PADDING_REMOVED
    )
    report = memory_lines(cfg, QWEN25_15B, CARD_24GB)
    (line,) = [ln for ln in report.lines if "[error]" in ln]
    assert "memory: critic update: ~" in line and "of 24 GiB per GPU" in line
    assert "does not fit; try critic.fsdp.offload_policy=True" in line
    # weights + gradients + two Adam moments in verl's default model_dtype
    itemsize = PrecisionType.to_dtype(FSDPEngineConfig().model_dtype).itemsize
    hf = Qwen2Config(**QWEN25_15B)
    critic_params = count_parameters(hf) + hf.hidden_size + 1  # value head, tied LM head
    states = float(re.search(r"critic weights\+Adam (\d+\.\d)", line).group(1))
    assert states == pytest.approx(critic_params * itemsize * 3 / GIB, abs=0.05)
    # the gradients, and Adam's multi-tensor step beside them: sqrt(exp_avg_sq), trained-sized
    peak = float(re.search(r"critic activations or gradients\+Adam step (\d+\.\d)", line)[1])
    assert peak >= critic_params * itemsize * 2 / GIB - 0.05
    total = float(re.search(r"critic update: ~(\d+\.\d) GiB", line).group(1))
    assert total > CARD_24GB
    composes_with_every_fix(overrides, line)


def test_a_tight_rollout_warns_with_fixes_that_compose(
    tiny_model_dir, prepared_gsm8k_dir, tmp_path
):
    overrides, cfg = lora_recipe(
        tiny_model_dir, prepared_gsm8k_dir, tmp_path,
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.9", *PADDING_REMOVED,
    )  # fmt: skip
    report = memory_lines(cfg, QWEN25_15B, CARD_24GB)
    (line,) = [ln for ln in report.lines if "[warn]" in ln and "rollout:" in ln]
    assert "memory: rollout: ~" in line and "vLLM 0.9 x 24 = 21.6" in line
    assert "try actor_rollout_ref.rollout.gpu_memory_utilization=N" in line
    composes_with_every_fix(overrides, line)


def test_check_gpus_prints_every_phase_against_the_card(tmp_path, monkeypatch):
    """Through the preflight's gpu check and a listed card (fake nvidia-smi); without one the
    figures are printed as notes, vLLM's share as a share."""
    from transformers import Qwen2Config

    one_gpu = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"]
    cfg = composed("gsm8k_ppo", ["data.train_batch_size=128", *one_gpu])
    hf = {"actor": Qwen2Config(**QWEN25_05B)}
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [("NVIDIA H100 80GB HBM3", 81559)])
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    report = preflight.Report()
    preflight.check_gpus(cfg, hf, report)
    memory = [line for line in report.lines if "memory:" in line]
    assert len(memory) == 6 and all("[ok]" in line and "of 80 GiB" in line for line in memory)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    report = preflight.Report()
    preflight.check_gpus(cfg, hf, report)
    rollout = next(line for line in report.lines if "memory: rollout" in line)
    assert "[note]" in rollout and "+ vLLM's 0.4 of the card per GPU" in rollout

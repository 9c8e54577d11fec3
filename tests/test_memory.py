"""The preflight's GPU memory per phase and TOKEN_BUDGET=auto, held against verl's own
engines and context switch."""

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from helpers import (
    QWEN25_05B,
    QWEN25_15B,
    ROOT,
    capture,
    composed_config,
    fake_nvidia_smi,
    get,
    gpu_recipe_overrides,
    launch_in_process,
    recipe_env,
)

from verl_gsm8k.common.qwen25 import qwen25_config
from verl_gsm8k.launch.plan import bare_overrides
from verl_gsm8k.preflight import cli as preflight
from verl_gsm8k.preflight import memory as mem
from verl_gsm8k.preflight.compose import compose
from verl_gsm8k.preflight.model import count_parameters

CARD_24GB = 24564 / 1024  # GiB of an RTX 4090 / L4-class card, as nvidia-smi lists it
# case -> (config, overrides); the roles verl builds for each (a LoRA actor is its own reference).
CASES = {
    "ppo": ("gsm8k_ppo", ["actor_rollout_ref.model.lora_rank=0"]),
    "ppo, actor offload_policy, critic param_offload": ("gsm8k_ppo", [
        "actor_rollout_ref.actor.fsdp_config.offload_policy=True",
        "critic.fsdp.param_offload=True"]),
    "lora": ("gsm8k_ppo_lora", ["actor_rollout_ref.model.lora_rank=8"]),
    "lora, critic offloaded between phases": ("gsm8k_ppo_lora", [
        "actor_rollout_ref.model.lora_rank=8", "critic.fsdp.offload_policy=False",
        "critic.fsdp.param_offload=True", "critic.fsdp.optimizer_offload=True"]),
}  # fmt: skip
ROLES = {"gsm8k_ppo": ("actor", "reference", "critic"), "gsm8k_ppo_lora": ("actor", "critic")}
# Each role's engine built as verl's workers build it, on verl's CPU platform; its choices as JSON.
BUILD_ENGINES = """
import json, sys
from pathlib import Path
import torch
from verl.utils.config import omega_conf_to_dataclass as dataclass
from verl.workers.engine import EngineRegistry
from verl_gsm8k.preflight.compose import compose
torch.distributed.init_process_group("gloo", rank=0, world_size=1)
cases, roles, model = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
facts = {}
for case, (config, overrides) in cases.items():
    paths = [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}"]
    cfg = compose(Path(sys.argv[4]), config, paths + overrides)
    actor, critic = dataclass(cfg.actor_rollout_ref.actor), dataclass(cfg.critic)
    ref = dataclass(cfg.actor_rollout_ref.ref.fsdp_config)
    object.__setattr__(ref, "strategy", cfg.actor_rollout_ref.ref.strategy)  # as ActorConfig
    built = {"actor": ("language_model", actor.engine, actor),
             "reference": ("language_model", ref, actor),
             "critic": ("value_model", critic.engine, critic)}
    for role in roles[config]:
        kind, engine_config, owner = built[role]
        model_config = (critic.model if role == "critic"
                        else dataclass(cfg.actor_rollout_ref.model))
        model_config.model_type = kind
        engine = EngineRegistry.new(model_type=kind, backend=engine_config.strategy,
            model_config=model_config, engine_config=engine_config,
            optimizer_config=owner.optim, checkpoint_config=owner.checkpoint)
        engine.initialize()
        params = list(engine.module.parameters())
        facts[f"{case}/{role}"] = {"policy": engine._uses_fsdp2_cpu_offload_policy,
            "param_offload": engine.is_param_offload_enabled,
            "optimizer_offload": engine.is_optimizer_offload_enabled,
            "itemsize": sorted({p.dtype.itemsize for p in params}),
            "total": sum(p.numel() for p in params),
            "trainable": sum(p.numel() for p in params if p.requires_grad),
            "optimizer": engine.optimizer is not None}
print(json.dumps(facts))
"""


@pytest.fixture(scope="module")
def verl_engines(tiny_model_dir) -> dict:
    env = dict(os.environ, VERL_PLATFORM="cpu", VERL_ENGINE_DEVICE="cuda", HF_HUB_OFFLINE="1",
               VERL_USE_EXTERNAL_MODULES="verl_gsm8k.verl_plugins.cpu_platform,"
               "verl_gsm8k.verl_plugins.attention_fallback", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="0")  # fmt: skip  # one rank: the kernel picks its store's port
    args = [json.dumps(CASES), json.dumps(ROLES), str(tiny_model_dir), str(ROOT / "configs")]
    result = capture([sys.executable, "-c", BUILD_ENGINES, *args], 0, env=env)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_engines_are_placed_as_verl_builds_them(verl_engines, tiny_model_dir):
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(tiny_model_dir)
    model = [f"{key}.path={tiny_model_dir}" for key in ("actor_rollout_ref.model", "critic.model")]
    for case, (config, overrides) in CASES.items():
        cfg = compose(ROOT / "configs", config, model + overrides)
        for role in ROLES[config]:
            real = verl_engines[f"{case}/{role}"]
            ours = mem.engine_of(cfg, role, hf_config, n_gpus=1)
            where = f"{case}/{role}: {ours} vs verl's {real}"
            assert bool(ours.host) == real["policy"], where  # CPUOffloadPolicy: host for good
            assert ours.param_offload == real["param_offload"], where
            assert ours.optimizer_offload == real["optimizer_offload"], where
            (itemsize,) = real["itemsize"]  # one dtype: the LoRA base too is in model_dtype
            assert round(ours.weights * mem.GIB) == real["total"] * itemsize, where
            trained = real["trainable"] if real["optimizer"] else 0  # no optimizer: the reference
            assert round(ours.trained * mem.GIB) == trained * itemsize, where
    lora = [verl_engines[f"{c}/critic"]["policy"] for c in CASES if c.startswith("lora")]
    assert lora == [True, False]  # the LoRA recipe's critic keeps its states in host memory


@pytest.mark.parametrize("param_offload", [False, True])
@pytest.mark.parametrize("optimizer_offload", [False, True])
def test_states_follow_verls_context_switch(param_offload, optimizer_offload, monkeypatch):
    from verl.workers.engine import base

    monkeypatch.setattr(base, "get_device_name", lambda: "cuda")

    class Recording:  # FSDPEngine.to() moves the states whose flag is set (transformer_impl ~844)
        is_param_offload_enabled, is_optimizer_offload_enabled = param_offload, optimizer_offload
        mode = None

        def __init__(self) -> None:
            self.where = {"model": "cuda", "optimizer": "cuda", "grad": "cuda"}

        def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True):
            for state, moved in (("model", model), ("optimizer", optimizer), ("grad", grad)):
                self.where[state] = device if moved else self.where[state]

    engine = Recording()
    engine.to("cpu", model=param_offload, optimizer=optimizer_offload, grad=param_offload)
    weights, trained = 10.0, 1.0  # GiB: every weight, and the trained ones (Adam: 2 moments)

    def on_gpu() -> float:
        on = {state: where == "cuda" for state, where in engine.where.items()}
        return weights * on["model"] + 2 * trained * on["optimizer"]

    with base.BaseEngineCtx(engine, "train"):
        update = on_gpu() + trained * (engine.where["model"] == "cuda")  # grads beside weights
    with base.BaseEngineCtx(engine, "eval"):
        forward = on_gpu()
    ours = mem.Engine("critic", "", param_offload, optimizer_offload, weights, trained)
    assert (ours.update(), ours.forward(), ours.resting()) == (update, forward, on_gpu())


PACKED = ["actor_rollout_ref.model.use_remove_padding=True", "critic.model.use_remove_padding=True"]
PADDED = [key.replace("True", "False") for key in PACKED]  # the sdpa overlay's
# flash-attn 2 (its varlen kernels, its cross entropy): what a GPU with a flash-attn wheel runs
FLASH = [*PACKED, *(f"{role}.override_config.attn_implementation=flash_attention_2"
                    for role in ("actor_rollout_ref.model", "critic.model"))]  # fmt: skip


@pytest.fixture(scope="module")
def lora(tiny_model_dir, prepared_gsm8k_dir, tmp_path_factory) -> list[str]:
    """The LoRA recipe's overrides (its knob defaults and own keys)."""
    knobs = {"TRACE_SAMPLES": "0", "TRAIN_BATCH_SIZE": "64", "PPO_MINI_BATCH_SIZE": "32"}
    env = recipe_env(tiny_model_dir, prepared_gsm8k_dir, tmp_path_factory.mktemp("r"), **knobs)
    return [*bare_overrides("gsm8k_ppo_lora", env), "actor_rollout_ref.model.lora_rank=32"]


def lora_recipe_lines(lora: list[str], *extra: str):
    """The LoRA recipe's memory lines for Qwen2.5-1.5B on a 24 GB card."""
    from transformers import Qwen2Config

    overrides, report = [*lora, *extra], preflight.Report()
    cfg = compose(ROOT / "configs", "gsm8k_ppo_lora", overrides)
    mem.check_memory(cfg, {"actor": Qwen2Config(**QWEN25_15B)}, CARD_24GB, report)
    return overrides, report


def composes_with_every_fix(overrides: list[str], line: str) -> None:
    for key in line.split("; try ", 1)[1].split(", "):
        fixed = re.sub(r"=N\b.*$", "=0.3" if "utilization" in key else "=8192", key)
        compose(ROOT / "configs", "gsm8k_ppo_lora", overrides + [fixed])


def test_lora_recipe_fits_a_24gb_card(lora):
    _, report = lora_recipe_lines(lora, *FLASH)
    phases = [line.split("memory: ", 1)[1].split(":")[0] for line in report.lines]
    assert phases == ["rollout", "old log-prob", "reference", "critic values", "critic update",
                      "actor update"]  # fmt: skip
    assert report.errors == 0 and report.warnings == 0, report.lines
    assert "actor activations 4.7" in report.lines[1]
    totals = [float(re.search(r": ~(\d+\.\d) GiB", line)[1]) for line in report.lines]
    assert max(totals) == totals[5] < 0.9 * 24, report.lines  # the actor update
    assert "vLLM asleep (context, CUDA graphs) 1.5" in report.lines[5]
    assert "critic states in host memory (offload_policy: CPUOffloadPolicy)" in report.lines[4]


def test_padded_micro_batches_do_not_fit_the_old_log_prob_pass(lora):
    overrides, report = lora_recipe_lines(lora, *PADDED)
    old = next(line for line in report.lines if "[error] memory: old log-prob: ~" in line)
    acts = float(re.search(r"actor activations (\d+\.\d)", old)[1])
    logits = 16384 * mem.SDPA_PADDING_FACTOR * (151936 * 14 + 1536 * 2)
    assert acts == pytest.approx(logits / mem.GIB, abs=0.05)
    assert "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=N" in old
    composes_with_every_fix(overrides, old)


def test_a_critic_offloaded_between_phases_is_stopped_at_its_update_and_vllm_warned(lora):
    from transformers import Qwen2Config

    old = ["critic.fsdp.offload_policy=False", "critic.fsdp.param_offload=True",
           "critic.fsdp.optimizer_offload=True",
           "actor_rollout_ref.rollout.gpu_memory_utilization=0.9"]  # fmt: skip
    overrides, report = lora_recipe_lines(lora, *old, *FLASH)
    (line,) = [ln for ln in report.lines if "[error]" in ln]
    assert "memory: critic update: ~" in line and "of 24 GiB per GPU" in line
    assert "does not fit; try critic.fsdp.offload_policy=True" in line
    hf = Qwen2Config(**QWEN25_15B)
    critic = (count_parameters(hf) + hf.hidden_size + 1) * 4 / mem.GIB  # fp32, value head, tied
    assert float(re.search(r"critic weights\+Adam (\d+\.\d)", line)[1]) == pytest.approx(
        3 * critic, abs=0.05)  # fmt: skip
    # the gradients, and Adam's multi-tensor step beside them: sqrt(exp_avg_sq), trained-sized
    assert float(re.search(r"gradients\+Adam step (\d+\.\d)", line)[1]) >= 2 * critic - 0.05
    composes_with_every_fix(overrides, line)
    (rollout,) = [ln for ln in report.lines if "[warn]" in ln and "rollout:" in ln]
    assert "vLLM 0.9 x 24 = 21.6" in rollout
    assert "try actor_rollout_ref.rollout.gpu_memory_utilization=N" in rollout
    composes_with_every_fix(overrides, rollout)


def test_check_gpus_prints_every_phase_against_the_card(tmp_path, monkeypatch):
    """A listed card (fake nvidia-smi): a line per phase; without one, notes."""
    from transformers import Qwen2Config

    cfg = compose(ROOT / "configs", "gsm8k_ppo", [
        "actor_rollout_ref.model.path=/m", "critic.model.path=/m", "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"])  # fmt: skip
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


def test_choose_writes_the_largest_budget_that_fits(tmp_path):
    extra = ["actor_rollout_ref.model.path=/m", "critic.model.path=/m", "+attention=sdpa_packed"]
    extra += ["trainer.n_gpus_per_node=1", "trainer.nnodes=1"]
    recipe = gpu_recipe_overrides("ppo_qwen2.5-0.5b_gsm8k")
    cfg = compose(ROOT / "configs", "gsm8k_ppo", [*recipe, *extra])
    hf, card = {"actor": qwen25_config("0.5B")}, CARD_24GB
    out, report = tmp_path / "budget", preflight.Report()
    chosen = mem.choose_budget(cfg, hf, card, out, report)
    assert out.read_text().split() == [f"{key}=8192" for key in mem.BUDGET_KEYS]
    assert all(int(get(chosen, key)) == 8192 for key in mem.BUDGET_KEYS)
    for cfg_at, fits in ((chosen, True), (mem.with_budget(cfg, 16384), False)):
        top = max(p.gib(card) for p in mem.estimate_phases(cfg_at, hf))
        assert (top <= mem.MEMORY_WARN_FRACTION * card) is fits
    (line,) = report.lines
    assert "[ok] budget: the recipe's 16384 tokens per micro-batch need ~" in line
    assert "using 8192" in line and "TOKEN_BUDGET=recipe keeps 16384" in line
    # on an 80 GB card the recipe's budget stands: nothing written, nothing said
    out80, report80 = tmp_path / "budget80", preflight.Report()
    assert mem.choose_budget(cfg, hf, 81559 / 1024, out80, report80) is cfg
    assert out80.read_text() == "" and report80.lines == []
    report4 = preflight.Report()  # a 4 GiB card: no budget fits, the recipe's is kept and said
    assert mem.choose_budget(cfg, hf, 4.0, out80, report4) is cfg and out80.read_text() == ""
    assert report4.lines[0].endswith("and no budget down to 1024 fits: kept"), report4.lines


@pytest.fixture(scope="module")
def qwen_shaped_model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model's tokenizer beside Qwen2.5-0.5B's config.json (shapes only)."""
    model = tmp_path_factory.mktemp("qwen-0.5b-shape") / "model"
    shutil.copytree(tiny_model_dir, model)
    for weights in model.glob("*.safetensors"):
        weights.unlink()
    config = qwen25_config("0.5B")
    config.architectures = ["Qwen2ForCausalLM"]
    config.to_json_file(model / "config.json")
    return model


@pytest.mark.slow
def test_the_launch_runs_at_the_budget_that_fits_the_card(qwen_shaped_model, prepared_gsm8k_dir,
                                                          tmp_path):  # fmt: skip
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [("NVIDIA GeForce RTX 4090", 24564)])

    def dry_run(*args: str, **knobs: str):
        # no checkpoint, no best one kept: the disk check would read this machine's free space
        env = recipe_env(qwen_shaped_model, prepared_gsm8k_dir, tmp_path / "runs", DRY_RUN="1",
                         SAVE_FREQ="-1", KEEP_BEST="0")  # fmt: skip
        env.update(knobs, PATH=f"{bin_dir}:{env['PATH']}")
        return launch_in_process("ppo_qwen2.5-0.5b_gsm8k", env, *args)

    picked = dry_run()  # ATTENTION=auto: packed rows under sdpa on this GPU without flash-attn 2
    assert "attention: sdpa, padding removal on" in picked.stdout, picked.stdout[-3000:]
    assert picked.returncode == 0, picked.stdout[-3000:] + picked.stderr[-3000:]
    assert "preflight: [ok] budget: the recipe's 16384 tokens" in picked.stdout
    cfg = composed_config(picked.stdout)
    assert all(get(cfg, key) == 8192 for key in mem.BUDGET_KEYS)
    # the user's own budget key wins: the preflight checks it and stops, as without the knob
    own = dry_run("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384")
    assert own.returncode == 1 and "budget:" not in own.stdout, own.stdout[-3000:]
    assert "memory: actor update: ~" in own.stdout and "does not fit" in own.stdout
    kept = dry_run(TOKEN_BUDGET="recipe")
    assert kept.returncode == 1 and "budget:" not in kept.stdout, kept.stdout[-3000:]

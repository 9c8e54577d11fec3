"""Prove a verl 0.9.1 launch is valid before a GPU is spent; runs anywhere, GPU or not.

    python -m verl_gsm8k.preflight [--trainer sft] [--config-name NAME] -- key=value ...

Exit status: 0 passed (warnings allowed), 1 an error, 2 bad usage.
"""

import argparse
import importlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_gsm8k.common.run_dir import TRACE_DIR
from verl_gsm8k.ppo_trainer import MODE
from verl_gsm8k.preflight import checkpoints, device, inputs, memory
from verl_gsm8k.preflight.algorithm import check_algorithm
from verl_gsm8k.preflight.batch import batch_split_problem
from verl_gsm8k.preflight.compose import LegacyKeys, compose_checked, split_override
from verl_gsm8k.preflight.compose import legacy_key_problems as legacy
from verl_gsm8k.preflight.lines import Report, one_line
from verl_gsm8k.preflight.model import load_model, offline_if_hub_unreachable, resolve_model
from verl_gsm8k.preflight.sft import run_sft

DEFAULT_CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
CONFIG_NAMES = {"ppo": "gsm8k_ppo", "sft": "gsm8k_sft"}  # --trainer -> default --config-name
PLUGIN = "verl_gsm8k.verl_plugins.register_trainer"  # registers the trainer of MODE in verl
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
LORA, FSDP = "LoRA is set on the model", "the critic's FSDP settings are critic.fsdp"
# Keys verl 0.9.1 ignores or rejects: the key to use ("" to remove it) and why
# (docs/verl-0.9.1-keys.md).
LEGACY_KEYS: LegacyKeys = {
    "custom_reward_function.": ("reward.custom_reward_function.",
                                "main_ppo ignores it and runs the built-in scorer"),
    f"{A}.lora.rank": ("actor_rollout_ref.model.lora_rank", LORA),
    f"{A}.lora.alpha": ("actor_rollout_ref.model.lora_alpha", LORA),
    f"{A}.lora.": ("actor_rollout_ref.model.", LORA),
    "critic.model.fsdp_config.": ("critic.fsdp.", FSDP),
    "critic.fsdp_config.": ("critic.fsdp.", FSDP),
    "reward_model.reward_manager": ("reward.reward_manager.name", "main_ppo reads reward.*"),
    "reward_model.reward_kwargs.": ("reward.reward_kwargs.", "main_ppo never reads it (the dapo "
                                    "manager runs without its overlong penalty)"),
    "reward_model.": ("reward.reward_model.", "main_ppo reads reward.*"),
    f"{A}.fsdp_config.strategy": (f"{A}.strategy", "overwritten by it"),
    "actor_rollout_ref.ref.fsdp_config.strategy": (f"{A}.strategy", "the reference follows it"),
    "critic.fsdp.strategy": ("critic.strategy", "overwritten by it"),
    f"{R}.val_kwargs.do_sample": (f"{R}.val_kwargs.temperature", "read by neither trainer: "
                                  "validation is greedy when val_kwargs.temperature is 0"),
}  # fmt: skip
V1_IGNORED_KEYS: LegacyKeys = {  # read by verl's legacy trainer only
    "trainer.balance_batch": ("", "the v1 trainer balances every batch"),
    "critic.ppo_max_token_len_per_gpu": ("critic.ppo_infer_max_token_len_per_gpu",
                                         "the v1 trainer sets both critic budgets from it"),
}  # fmt: skip
COSTLY_KEYS = {  # keys that work, at a cost nothing needs: a warning
    f"{A}.calculate_entropy": "both trainers log actor/entropy without it; True adds a "
    "full-vocabulary entropy pass with gradients to every update",
}
CLIP = f"{A}.clip_ratio"
VLLM_MAX_LORA_RANK = 512  # the largest of vllm.config.lora.MaxLoRARanks


def check_legacy_keys(overrides: list[str], report: Report) -> bool:
    """Keys wrong whichever trainer runs; True if none."""
    keys = [split_override(o)[0] for o in overrides]
    problems = legacy(keys, LEGACY_KEYS)
    if CLIP in keys and not {f"{CLIP}_low", f"{CLIP}_high"} & set(keys):
        problems.append(f"'{CLIP}' alone changes nothing (clip_ratio_low and _high default to "
                        f"0.2 and win); set {CLIP}_low and {CLIP}_high")  # fmt: skip
    for key, value in map(split_override, overrides):
        if key in COSTLY_KEYS and value.strip().lower() == "true":
            report.warn("keys", f"'{key}=True': {COSTLY_KEYS[key]}")
    return report.verdict("keys", problems)


def check_trainer_keys(cfg: Any, overrides: list[str], report: Report, clean: bool) -> None:
    keys, trainer = [split_override(o)[0] for o in overrides], "v1 trainer"
    if not cfg.trainer.get("use_v1", True):
        trainer = "legacy trainer (trainer.use_v1=false)"
    else:
        kind = "ignored by verl's v1 trainer (trainer.use_v1=true, the default)"
        clean = report.verdict("keys", legacy(keys, V1_IGNORED_KEYS, cfg, kind)) and clean
        if "trainer.esi_redundant_time" in keys:
            report.warn("keys", "'trainer.esi_redundant_time' is read only by verl's legacy "
                        "trainer; the recipes save on SIGTERM instead (STOP_GRACE_S)")  # fmt: skip
    if clean:
        report.ok("keys", f"{len(keys)} overrides, no legacy key and none the {trainer} ignores")


def check_config(config_dir: Path, config_name: str, overrides: list[str], report: Report):
    """Compose and validate with verl's own code; the config, or None."""
    cfg = compose_checked(config_dir, config_name, overrides, report)
    if cfg is None:
        return None
    import verl
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    trainer, n = cfg.trainer, cfg.actor_rollout_ref.rollout.n
    sizes = {"trainer.n_gpus_per_node": trainer.n_gpus_per_node, "trainer.nnodes": trainer.nnodes,
             f"{R}.n": n}  # fmt: skip
    small = [f"{key}={value}" for key, value in sizes.items() if not value or value < 1]
    if small:
        report.error("config", f"{', '.join(small)}: must be at least 1")
        return None
    gpus = trainer.n_gpus_per_node * trainer.nnodes
    critic, ref = need_critic(cfg), need_reference_policy(cfg)
    try:
        validate_config(vllm_lora_checked(cfg, report), use_reference_policy=ref, use_critic=critic)
    except Exception as exc:
        report.error("config", f"verl validate_config: {one_line(exc)}")
        return cfg
    batch, mini = cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    problems = [f"train_batch_size x rollout.n = {batch * n} responses must be divisible by the "
                f"{gpus} GPUs"] if batch * n % gpus else []  # fmt: skip
    if mini <= batch and mini * n % gpus:
        problems.append(f"ppo_mini_batch_size x rollout.n = {mini * n} must be divisible by the "
                        f"{gpus} GPUs")  # fmt: skip
    split = batch_split_problem(batch, mini, "data.train_batch_size", f"{A}.ppo_mini_batch_size")
    roles = ["actor", "rollout"] + ["reference"] * ref + ["critic"] * critic
    report.verdict("config", problems + [split] * bool(split), f"composes against verl "
                   f"{verl.__version__} ({config_name}); verl's checks pass for {gpus} GPU(s); "
                   f"roles: {', '.join(roles)}")  # fmt: skip
    return cfg


def vllm_lora_checked(cfg: Any, report: Report) -> Any:
    """The LoRA rank and load format vLLM needs; without vLLM, ``cfg`` rankless."""
    import importlib.util

    from omegaconf import OmegaConf

    rank, rollout = device.lora_rank(cfg.actor_rollout_ref.model), cfg.actor_rollout_ref.rollout
    if rank <= 0 or rollout.name != "vllm":
        return cfg
    if rank > VLLM_MAX_LORA_RANK:
        report.error("config", f"LoRA rank {rank} is above vLLM's maximum {VLLM_MAX_LORA_RANK}")
    if rollout.load_format != "safetensors":
        report.error("config", f"LoRA with vLLM needs {R}.load_format=safetensors")
    if importlib.util.find_spec("vllm") is not None:
        return cfg
    report.note("config", f"vLLM not installed here: LoRA rank {rank} checked against its list")
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    copy.actor_rollout_ref.model.lora_rank = copy.actor_rollout_ref.model.lora.rank = 0
    return copy


def check_trainer(cfg: Any, report: Report) -> None:
    block = cfg.get("gsm8k_trace") or {}
    samples = int(block.get("samples", 0) or 0)
    mode = str(cfg.trainer.get("v1", {}).get("trainer_mode", "sync"))
    if mode != MODE:
        if samples > 0:
            report.warn("trace", f"gsm8k_trace.samples={samples} but trainer.v1.trainer_mode="
                        f"{mode}: nothing is traced (it needs {MODE})")  # fmt: skip
        return
    if PLUGIN not in device.external_modules():
        report.error("trace", f"trainer.v1.trainer_mode={MODE} needs {PLUGIN} in "
                     "VERL_USE_EXTERNAL_MODULES (the recipes add it)")  # fmt: skip
        return
    if cfg.trainer.get("use_v1", True):
        importlib.import_module(PLUGIN)  # it registers the trainer when verl's v1 is imported
        from verl.trainer.ppo.v1 import get_trainer_cls

        name = get_trainer_cls(MODE).__name__
    else:  # what the plugin builds in place of verl's RayPPOTrainer
        from verl_gsm8k.ppo_trainer.legacy import GuardedLegacyTrainer

        name = GuardedLegacyTrainer.__name__
    where = block.get("dir") or f"{cfg.trainer.default_local_dir}/{TRACE_DIR}"
    report.ok("trace", f"{name} selected, gsm8k_trace.samples=0: nothing traced" if samples <= 0
              else f"{samples} responses per step (whole prompt groups of rollout.n="
              f"{cfg.actor_rollout_ref.rollout.n}) -> {where}/<step>.jsonl")  # fmt: skip


def check_models(cfg: Any, report: Report, critic: bool) -> tuple[Any, dict[str, Any]] | None:
    """(the first tokenizer, {role: HF config}) as verl loads them."""
    total = cfg.data.max_prompt_length + cfg.data.max_response_length
    need = (total, f"max_prompt_length + max_response_length = {total}")
    roles = [("actor", cfg.actor_rollout_ref.model), ("critic", cfg.critic.model)]
    loaded, hf_configs = {}, {}
    for role, model_cfg in roles[: 1 + critic]:
        local = resolve_model(role, str(model_cfg.path), report)
        if loaded.get(local):  # the critic usually starts from the actor's
            report.ok("model", f"{role}: same model as checked above ({local})")
        elif local is not None and local not in loaded:
            loaded[local] = load_model(role, model_cfg, local, need, report)
        if loaded.get(local) is not None:
            hf_configs[role] = loaded[local].hf_config
    first = next((hf for hf in loaded.values() if hf is not None), None)
    return (first.tokenizer, hf_configs) if first else None


def check_gpus(cfg: Any, hf_configs: dict | None, report: Report, fit_budget: Any = None) -> None:
    """The GPUs the run gets, then each phase's memory at the budget that fits."""
    if os.environ.get("RAY_ADDRESS"):
        check_ray_cluster(cfg, os.environ["RAY_ADDRESS"], report)
        card = (device.visible_gpus() or [("", None)])[0][1]
    else:
        card = device.check_gpu_count(cfg.trainer.n_gpus_per_node, report)
    if hf_configs and "actor" in hf_configs:
        if fit_budget is not None and card is not None:
            cfg = memory.choose_budget(cfg, hf_configs, card, fit_budget, report)
        memory.check_memory(cfg, hf_configs, card, report)


def check_ray_cluster(cfg: Any, address: str, report: Report) -> None:
    """verl packs each node's workers onto one node: nnodes nodes with enough."""
    nodes, why = device.ray_cluster_gpus(address)
    if nodes is None:
        report.warn("gpu", f"the Ray cluster at RAY_ADDRESS={address} did not answer ({why}): "
                    "its GPUs are not checked")  # fmt: skip
        return
    per_node, nnodes = cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes
    kinds, gpus = sorted({k for node in nodes for k in node["kind"]}), sum(n["gpus"] for n in nodes)
    said = f"Ray cluster at {address}: {len(nodes)} node(s), {gpus:g} GPU(s)"
    said += f" ({', '.join(kinds)})" if kinds else ""
    enough = sum(node["gpus"] >= per_node for node in nodes)
    if enough < nnodes:
        report.error("gpu", f"{said}; trainer.nnodes={nnodes} x trainer.n_gpus_per_node="
                     f"{per_node} needs {nnodes} node(s) with {per_node} GPU(s) each, the "
                     f"cluster has {enough}")  # fmt: skip
    else:
        report.ok("gpu", f"{said}; this run uses {nnodes} node(s) x {per_node} GPU(s)")


def run(config_name: str, config_dir: Path, overrides: list[str], fit_budget: Path | None = None,
        chosen: Mapping[str, str] | None = None) -> Report:  # fmt: skip
    report = Report()
    clean = check_legacy_keys(overrides, report)
    offline_if_hub_unreachable()  # before verl imports huggingface_hub, which reads it once
    cfg = check_config(config_dir, config_name, overrides, report)
    if cfg is None:
        return report
    from verl.trainer.ppo.utils import need_critic

    critic = need_critic(cfg)
    check_trainer_keys(cfg, overrides, report, clean)
    device.check_device(cfg, critic, report)
    device.check_lora(cfg, critic, report)
    check_trainer(cfg, report)
    checkpoints.check_async_save(cfg, report)
    tokenizer, hf_configs = check_models(cfg, report, critic) or (None, None)
    where = checkpoints.check_run_dir(cfg, report)
    if where and hf_configs:
        checkpoints.check_disk(cfg, hf_configs, where, report)
    reward_keys = inputs.check_reward(cfg, report, inputs.check_data(cfg, tokenizer, report))
    check_algorithm(cfg, report, reward_keys, chosen)
    check_gpus(cfg, hf_configs, report, fit_budget)
    return report


def preflight(trainer: str, config_name: str, overrides: list[str],
              config_dir: Path = DEFAULT_CONFIG_DIR, fit_budget: Path | None = None,
              chosen: Mapping[str, str] | None = None) -> int:  # fmt: skip
    """A launch's preflight: its lines, then passed (0) or FAILED (1)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    start = time.monotonic()
    if trainer == "sft":
        report = run_sft(config_name, config_dir, overrides)
    else:
        report = run(config_name, config_dir, overrides, fit_budget, chosen)
    took = f"in {time.monotonic() - start:.1f} s"
    if report.errors:
        print(f"preflight: FAILED with {report.errors} error(s), {report.warnings} warning(s) "
              f"{took}", flush=True)  # fmt: skip
        return 1
    print(f"preflight: passed ({report.warnings} warning(s)) {took}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser("python -m verl_gsm8k.preflight",
                                     description=__doc__.split("\n\n")[0],
                                     epilog="After --: the overrides verl would get.")  # fmt: skip
    parser.add_argument("--trainer", choices=list(CONFIG_NAMES), default="ppo",
                        help="the verl trainer the launch runs (default ppo)")  # fmt: skip
    parser.add_argument("--config-name", help="config in --config-dir (default gsm8k_<trainer>)")
    parser.add_argument("--config-dir", type=Path, default=DEFAULT_CONFIG_DIR,
                        help="the configs' folder (default: the repo's configs/)")  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="Hydra overrides key=value (after --)")
    args = parser.parse_args(argv)
    chosen = {split_override(item)[0]: item for item in args.overrides}
    name = args.config_name or CONFIG_NAMES[args.trainer]
    return preflight(args.trainer, name, args.overrides, args.config_dir.resolve(), None, chosen)

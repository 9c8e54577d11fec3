"""Prove a verl 0.9.1 launch is valid before a GPU is spent. Runs anywhere, GPU or not.

    python -m verl_gsm8k.preflight [--config-name gsm8k_ppo] -- key=value key=value ...
    python -m verl_gsm8k.preflight --trainer sft [--config-name gsm8k_sft] -- key=value ...

Every recipe runs it on its final override list. Each check reports one line (docs/guide.md,
"Preflight"): keys, config, device, lora, trace, model, run dir, checkpoint, data, reward,
algorithm, gpu, memory (and budget, for TOKEN_BUDGET=auto). With --trainer sft it checks a
launch of verl's SFT trainer (sft.py). Exit status: 0 passed (warnings allowed), 1 at least one
error, 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_gsm8k.common.run_dir import TRACE_DIR
from verl_gsm8k.ppo_trainer import MODE
from verl_gsm8k.preflight import budget
from verl_gsm8k.preflight.algorithm import check_algorithm
from verl_gsm8k.preflight.batch import batch_split_problem
from verl_gsm8k.preflight.checkpoints import check_async_save, check_disk, check_run_dir
from verl_gsm8k.preflight.compose import (
    LegacyKeys,
    compose,
    compose_checked,
    legacy_key_problems,
    split_override,
)
from verl_gsm8k.preflight.device import (
    check_device,
    check_gpu_count,
    check_lora,
    lora_rank,
    ray_cluster_gpus,
    visible_gpus,
)
from verl_gsm8k.preflight.inputs import check_data, check_reward
from verl_gsm8k.preflight.lines import Report, one_line
from verl_gsm8k.preflight.memory import check_memory
from verl_gsm8k.preflight.model import load_model, offline_if_hub_unreachable, resolve_model
from verl_gsm8k.preflight.sft import run_sft

DEFAULT_CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
CONFIG_NAMES = {"ppo": "gsm8k_ppo", "sft": "gsm8k_sft"}  # --trainer -> default --config-name
PLUGIN = "verl_gsm8k.verl_plugins.register_trainer"  # registers the trainer of MODE in verl

# Keys the 2025 tutorials use that verl 0.9.1 ignores (they compose, nothing reads them) or
# rejects: the key to use instead ("" to remove it), and why (docs/verl-0.9.1-keys.md).
LEGACY_KEYS: LegacyKeys = {
    "custom_reward_function.": (
        "reward.custom_reward_function.",
        "composes but main_ppo ignores it and runs the built-in scorer",
    ),
    "actor_rollout_ref.actor.lora.rank": (
        "actor_rollout_ref.model.lora_rank",
        "LoRA is configured on the model, not the actor",
    ),
    "actor_rollout_ref.actor.lora.alpha": (
        "actor_rollout_ref.model.lora_alpha",
        "LoRA is configured on the model, not the actor",
    ),
    "actor_rollout_ref.actor.lora.": (
        "actor_rollout_ref.model.",
        "LoRA is configured on the model (lora_rank, lora_alpha, target_modules)",
    ),
    "critic.model.fsdp_config.": ("critic.fsdp.", "the critic's FSDP settings moved"),
    "critic.fsdp_config.": ("critic.fsdp.", "the critic's FSDP settings are under critic.fsdp"),
    "reward_model.reward_manager": (
        "reward.reward_manager.name",
        "main_ppo reads the reward manager from reward.reward_manager",
    ),
    "reward_model.reward_kwargs.": (
        "reward.reward_kwargs.",
        "composes, but main_ppo never reads "
        "it (only fully_async_main copies it over, migrate_legacy_"
        "reward_impl): verl's dapo reward manager runs without its "
        "overlong penalty",
    ),
    "reward_model.": ("reward.reward_model.", "main_ppo reads reward settings from reward.*"),
    "actor_rollout_ref.actor.fsdp_config.strategy": (
        "actor_rollout_ref.actor.strategy",
        "overwritten by actor_rollout_ref.actor.strategy when the config is built",
    ),
    "actor_rollout_ref.ref.fsdp_config.strategy": (
        "actor_rollout_ref.actor.strategy",
        "the reference follows actor_rollout_ref.actor.strategy",
    ),
    "critic.fsdp.strategy": ("critic.strategy", "overwritten by critic.strategy"),
    "actor_rollout_ref.rollout.val_kwargs.do_sample": (
        "actor_rollout_ref.rollout.val_kwargs.temperature",
        "read by neither trainer (the legacy one passes it on, its agent loop ignores it: "
        "experimental/agent_loop/agent_loop.py ~604): validation is greedy when "
        "val_kwargs.temperature is 0",
    ),
}
# Keys the default v1 trainer ignores and verl's legacy trainer (trainer.use_v1=false) reads.
V1_IGNORED_KEYS: LegacyKeys = {
    "trainer.balance_batch": (
        "",
        "the v1 trainer balances every batch (trainer/ppo/v1/"
        "trainer_base.py ~581); only the legacy trainer reads it "
        "(trainer/ppo/ray_trainer.py ~1549)",
    ),
    "critic.ppo_max_token_len_per_gpu": (
        "critic.ppo_infer_max_token_len_per_gpu",
        "the v1 trainer sets both critic token budgets from ppo_infer_max_token_len_per_gpu "
        "(trainer/ppo/v1/trainer_base.py ~267); only the legacy trainer reads it, for the "
        "critic's updates (trainer/ppo/ray_trainer.py ~811)",
    ),
}
# Keys that work but cost without need: key -> why (a warning).
COSTLY_KEYS = {
    "actor_rollout_ref.actor.calculate_entropy": (
        "both trainers log actor/entropy without it (the entropy of the old-log-prob pass: "
        "trainer/ppo/v1/trainer_base.py ~1651-1687, trainer/ppo/ray_trainer.py ~1300, ~1597); "
        "True adds a full-vocabulary entropy pass with gradients to every update (memory, time)"
    ),
}
CLIP_ALONE = "actor_rollout_ref.actor.clip_ratio"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks


def check_keys(keys: list[str], table: LegacyKeys, report: Report) -> bool:
    """The table's keys refused, each with the key to use; True when none was found."""
    problems = legacy_key_problems(keys, table)
    for problem in problems:
        report.error("keys", problem)
    return not problems


def check_legacy_keys(overrides: list[str], report: Report) -> bool:
    """Keys wrong whichever trainer runs (before composing: some stop it); True if none."""
    keys = [split_override(o)[0] for o in overrides]
    clean = check_keys(keys, LEGACY_KEYS, report)
    if CLIP_ALONE in keys and not {f"{CLIP_ALONE}_low", f"{CLIP_ALONE}_high"} & set(keys):
        report.error(
            "keys",
            f"'{CLIP_ALONE}' alone changes nothing in verl 0.9.1 (clip_ratio_low/"
            f"high default to 0.2 and take precedence); set {CLIP_ALONE}_low and "
            f"{CLIP_ALONE}_high",
        )
        clean = False
    for key, value in map(split_override, overrides):
        if key in COSTLY_KEYS and value.strip().lower() == "true":
            report.warn("keys", f"'{key}=True': {COSTLY_KEYS[key]}")
    return clean


def check_trainer_keys(cfg: Any, overrides: list[str], report: Report, clean: bool) -> None:
    """The keys the trainer that runs (trainer.use_v1) ignores, then the keys' verdict."""
    keys = [split_override(o)[0] for o in overrides]
    trainer = "legacy trainer (trainer.use_v1=false)"
    if cfg.trainer.get("use_v1", True):
        trainer, kind = (
            "v1 trainer",
            "ignored by verl's v1 trainer (trainer.use_v1=true, the default)",
        )
        for problem in legacy_key_problems(keys, V1_IGNORED_KEYS, cfg, kind):
            report.error("keys", problem)
            clean = False
        if "trainer.esi_redundant_time" in keys:
            report.warn(
                "keys",
                "'trainer.esi_redundant_time' is read only by verl's legacy trainer "
                "(trainer/ppo/ray_trainer.py ~1693): the v1 trainer never saves ahead of "
                "a capacity block's end; the recipes save on SIGTERM instead "
                "(STOP_GRACE_S, docs/reliability.md)",
            )
    if clean:
        report.ok("keys", f"{len(keys)} overrides, no legacy key and none the {trainer} ignores")


def check_config(config_dir: Path, config_name: str, overrides: list[str], report: Report):
    """Compose and validate with verl's own code; the config, or None where it does not
    compose or verl, and every check after this one, would divide by zero."""
    cfg = compose_checked(config_dir, config_name, overrides, report)
    if cfg is None:
        return None
    import verl
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    sizes = {
        "trainer.n_gpus_per_node": cfg.trainer.n_gpus_per_node,
        "trainer.nnodes": cfg.trainer.nnodes,
        "actor_rollout_ref.rollout.n": cfg.actor_rollout_ref.rollout.n,
    }
    small = [f"{key}={value}" for key, value in sizes.items() if not value or value < 1]
    if small:
        report.error("config", f"{', '.join(small)}: must be at least 1")
        return None
    n_gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    critic, reference = need_critic(cfg), need_reference_policy(cfg)
    try:
        validate_config(
            _without_vllm_lora_check(cfg, report), use_reference_policy=reference, use_critic=critic
        )
    except Exception as exc:
        report.error("config", f"verl validate_config: {one_line(exc)}")
        return cfg
    if check_batch_shape(cfg, n_gpus, report):
        roles = ["actor", "rollout"] + ["reference"] * reference + ["critic"] * critic
        report.ok(
            "config",
            f"composes against verl {verl.__version__} ({config_name}) and "
            f"validate_config passes for {n_gpus} GPU(s); roles: {', '.join(roles)}",
        )
    return cfg


def check_batch_shape(cfg: Any, n_gpus: int, report: Report) -> bool:
    """What validate_config skips with use_dynamic_bsz: every batch splits evenly over the GPUs,
    and into whole mini-batches (verl asserts it at the first update)."""
    n, batch = cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size
    mini = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    problems = []
    if (batch * n) % n_gpus:
        problems.append(
            f"train_batch_size x rollout.n = {batch * n} responses must be divisible "
            f"by the {n_gpus} GPUs (verl splits every batch evenly across them)"
        )
    if mini > batch:
        problems.append(f"ppo_mini_batch_size {mini} > train_batch_size {batch}")
    elif (mini * n) % n_gpus:
        problems.append(
            f"ppo_mini_batch_size x rollout.n = {mini * n} must be divisible by the {n_gpus} GPUs"
        )
    else:
        split = batch_split_problem(
            batch, mini, "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"
        )
        problems += [split] if split else []
    for problem in problems:
        report.error("config", problem)
    return not problems


def _without_vllm_lora_check(cfg: Any, report: Report) -> Any:
    """validate_config imports vLLM to check a LoRA rank; where vLLM is absent, check it here."""
    from omegaconf import OmegaConf

    rank = lora_rank(cfg.actor_rollout_ref.model)
    if rank <= 0 or cfg.actor_rollout_ref.rollout.name != "vllm":
        return cfg
    if rank > max(VLLM_LORA_RANKS):
        report.error("config", f"LoRA rank {rank} is above vLLM's maximum {max(VLLM_LORA_RANKS)}")
    load_format = cfg.actor_rollout_ref.rollout.load_format
    if load_format != "safetensors":
        report.error(
            "config",
            "LoRA with vLLM needs actor_rollout_ref.rollout.load_format="
            f"safetensors (got {load_format})",
        )
    if importlib.util.find_spec("vllm") is not None:
        return cfg
    report.note("config", f"vLLM not installed here: LoRA rank {rank} checked against vLLM's list")
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    copy.actor_rollout_ref.model.lora_rank = copy.actor_rollout_ref.model.lora.rank = 0
    return copy


def check_trainer(cfg: Any, report: Report) -> None:
    """The recipes' trainer (trainer.v1.trainer_mode=gsm8k: the guard and the per-token trace,
    on verl's v1 or legacy trainer) is registered, and what it traces."""
    block = cfg.get("gsm8k_trace") or {}
    samples = int(block.get("samples", 0) or 0)
    mode = str(cfg.trainer.get("v1", {}).get("trainer_mode", "sync"))
    if mode != MODE:
        if samples > 0:
            report.warn(
                "trace",
                f"gsm8k_trace.samples={samples} but trainer.v1.trainer_mode="
                f"{mode}: nothing is traced (the trace needs trainer.v1.trainer_mode="
                f"{MODE}, which the recipes set)",
            )
        return
    if PLUGIN not in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(","):
        report.error(
            "trace",
            f"trainer.v1.trainer_mode={MODE} needs {PLUGIN} in VERL_USE_"
            "EXTERNAL_MODULES (it registers the trainer in verl's TaskRunner); the "
            "recipes add it to every PPO launch",
        )
        return
    if cfg.trainer.get("use_v1", True):
        importlib.import_module(PLUGIN)  # it registers the trainer when verl's v1 is imported
        from verl.trainer.ppo.v1 import get_trainer_cls

        name = get_trainer_cls(MODE).__name__
    else:  # what the plugin builds in place of verl's RayPPOTrainer
        from verl_gsm8k.ppo_trainer.legacy import GuardedLegacyTrainer

        name = GuardedLegacyTrainer.__name__
    if samples <= 0:
        report.ok("trace", f"{name} selected, gsm8k_trace.samples=0: nothing traced")
        return
    where = block.get("dir") or f"{cfg.trainer.default_local_dir}/{TRACE_DIR}"
    report.ok(
        "trace",
        f"{samples} responses per step (whole prompt groups of rollout.n="
        f"{cfg.actor_rollout_ref.rollout.n}) -> {where}/<step>.jsonl",
    )


def check_models(cfg: Any, report: Report) -> tuple[Any, dict[str, Any]] | None:
    """verl loads each model's config and tokenizer: (the first tokenizer, {role: HF config})."""
    from verl.trainer.ppo.utils import need_critic

    need = cfg.data.max_prompt_length + cfg.data.max_response_length
    need = (need, f"max_prompt_length + max_response_length = {need}")
    roles = [("actor", cfg.actor_rollout_ref.model)] + [("critic", cfg.critic.model)] * need_critic(
        cfg
    )
    loaded: dict[str, Any] = {}
    hf_configs: dict[str, Any] = {}
    for role, model_cfg in roles:
        local = resolve_model(role, str(model_cfg.path), report)
        if local in loaded:  # the critic usually starts from the actor's weights
            report.ok("model", f"{role}: same model as checked above ({local})")
        elif local is not None:
            loaded[local] = load_model(role, model_cfg, local, need, report)
        if local is not None and loaded[local] is not None:
            hf_configs[role] = loaded[local].hf_config
    first = next((hf for hf in loaded.values() if hf is not None), None)
    return (first.tokenizer, hf_configs) if first and hf_configs else None


def check_gpus(
    cfg: Any, hf_configs: dict | None, report: Report, fit_budget: Path | None = None
) -> None:
    """The GPUs the run gets: a Ray cluster's (RAY_ADDRESS: the launching node may have none) or
    this node's; then the memory of each phase against this node's card, at a budget that fits it
    when ``fit_budget`` asks for one (budget.py)."""
    if os.environ.get("RAY_ADDRESS"):
        check_ray_cluster(cfg, os.environ["RAY_ADDRESS"], report)
        card = (visible_gpus() or [("", None)])[0][1]
    else:
        card = check_gpu_count(cfg.trainer.n_gpus_per_node, report)
    if hf_configs and "actor" in hf_configs:
        if fit_budget is not None and card is not None:
            cfg = budget.choose(cfg, hf_configs, card, fit_budget, report)
        check_memory(cfg, hf_configs, card, report)


def check_ray_cluster(cfg: Any, address: str, report: Report) -> None:
    """verl packs each node's share of workers onto one node (STRICT_PACK placement groups):
    it needs trainer.nnodes nodes with trainer.n_gpus_per_node GPUs each."""
    nodes, why = ray_cluster_gpus(address)
    if nodes is None:
        report.warn(
            "gpu",
            f"the Ray cluster at RAY_ADDRESS={address} did not answer ({why}): its "
            "GPUs are not checked",
        )
        return
    per_node, nnodes = cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes
    kinds = sorted({kind for node in nodes for kind in node["kind"]})
    summary = (
        f"Ray cluster at {address}: {len(nodes)} node(s), {sum(n['gpus'] for n in nodes):g} GPU(s)"
    )
    summary += f" ({', '.join(kinds)})" if kinds else ""
    enough = sum(node["gpus"] >= per_node for node in nodes)
    if enough < nnodes:
        report.error(
            "gpu",
            f"{summary}; trainer.nnodes={nnodes} x trainer.n_gpus_per_node="
            f"{per_node} needs {nnodes} node(s) with {per_node} GPU(s) each, the cluster "
            f"has {enough}",
        )
    else:
        report.ok("gpu", f"{summary}; this run uses {nnodes} node(s) x {per_node} GPU(s)")


def run(
    config_name: str,
    config_dir: Path,
    overrides: list[str],
    fit_budget: Path | None = None,
    chosen: Mapping[str, str] | None = None,
) -> Report:
    """The PPO preflight's checks in order; ``chosen`` (verl key -> the knob or key=value that
    set it) and ``fit_budget``: as preflight()'s."""
    report = Report()
    clean = check_legacy_keys(overrides, report)
    offline_if_hub_unreachable()  # before verl imports huggingface_hub, which reads it once
    cfg = check_config(config_dir, config_name, overrides, report)
    if cfg is None:
        return report
    from verl.trainer.ppo.utils import need_critic

    check_trainer_keys(cfg, overrides, report, clean)
    check_device(cfg, need_critic(cfg), report)
    check_lora(cfg, need_critic(cfg), report)
    check_trainer(cfg, report)
    check_async_save(cfg, report)
    tokenizer, hf_configs = check_models(cfg, report) or (None, None)
    where = check_run_dir(cfg, report)
    if where and hf_configs:
        check_disk(cfg, hf_configs, where, report)
    reward_keys = check_reward(cfg, report, check_data(cfg, tokenizer, report))
    check_algorithm(cfg, report, reward_keys, chosen)
    check_gpus(cfg, hf_configs, report, fit_budget)
    return report


def preflight(
    trainer: str,
    config_name: str,
    overrides: list[str],
    config_dir: Path = DEFAULT_CONFIG_DIR,
    dump: Path | None = None,
    fit_budget: Path | None = None,
    chosen: Mapping[str, str] | None = None,
) -> int:
    """The preflight of ``overrides`` (every one of a launch, in verl's order): its lines, then
    passed or FAILED; 0 or 1. ``chosen``: the verl keys the user set, warned where they do
    nothing; ``fit_budget``: a file for TOKEN_BUDGET=auto's overrides (budget.py); ``dump``: the
    composed config as JSON."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    start = time.monotonic()
    if trainer == "sft":
        report = run_sft(config_name, config_dir, overrides)
    else:
        report = run(config_name, config_dir, overrides, fit_budget, chosen)
    if dump is not None and not report.errors:
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(compose(config_dir, config_name, overrides), resolve=False)
        dump.write_text(json.dumps(cfg, indent=1))
    took = f"{time.monotonic() - start:.1f} s"
    if report.errors:
        print(
            f"preflight: FAILED with {report.errors} error(s), {report.warnings} warning(s) in "
            f"{took}",
            flush=True,
        )
        return 1
    print(f"preflight: passed ({report.warnings} warning(s)) in {took}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.preflight",
        description=__doc__.split("\n\n")[0],
        epilog="Everything after -- is a Hydra override list, exactly as verl's entry point "
        "(main_ppo, or sft_trainer with --trainer sft) would get it.",
    )
    parser.add_argument(
        "--trainer",
        choices=list(CONFIG_NAMES),
        default="ppo",
        help="the verl trainer the launch runs: ppo (main_ppo; default) or sft",
    )
    parser.add_argument(
        "--config-name",
        help="config file (without .yaml) in --config-dir "
        "(default gsm8k_ppo, or gsm8k_sft with --trainer sft)",
    )
    parser.add_argument(
        "--config-dir",
        type=Path,
        default=DEFAULT_CONFIG_DIR,
        help="the folder of the recipe configs (default: the repo's configs/)",
    )
    parser.add_argument(
        "--dump-config",
        type=Path,
        metavar="FILE",
        help="also write the composed (unresolved) config as JSON to FILE",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides key=value (after --)")
    args = parser.parse_args(argv)
    chosen = {split_override(item)[0]: item for item in args.overrides}
    return preflight(
        args.trainer,
        args.config_name or CONFIG_NAMES[args.trainer],
        args.overrides,
        args.config_dir.resolve(),
        args.dump_config,
        None,
        chosen,
    )

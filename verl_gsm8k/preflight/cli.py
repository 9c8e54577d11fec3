"""Prove a verl 0.9.1 launch is valid before a GPU is spent. Runs anywhere, GPU or not.

    python -m verl_gsm8k.preflight [--config-name gsm8k_ppo] -- key=value key=value ...
    python -m verl_gsm8k.preflight --trainer sft [--config-name gsm8k_sft] -- key=value ...

Every recipe runs it on its final override list. Checks, each reported on one line (data and
reward live in verl_gsm8k/preflight/inputs.py, device and LoRA in
verl_gsm8k/preflight/device.py, composing in compose.py, the model's whereabouts in model.py, the
lines it prints in verl_gsm8k/preflight/lines.py):
  keys     legacy keys that verl 0.9.1 silently ignores or rejects, and keys the trainer that
           runs (trainer.use_v1) ignores, each with the key to use instead;
  config   the overrides compose against the INSTALLED verl config (unknown key -> closest match)
           and verl's own validate_config passes for the requested GPU count;
  device   where it trains (GPU, or the CPU platform) and with which attention and padding, and
           why (verl_gsm8k/common/attention.py: flash-attn 2, else sdpa with padding
           removal on a GPU, sdpa padded on the CPU; flash-attn 4 only by ATTENTION=fa4);
  lora     the LoRA layouts verl 0.9.1 cannot train (LoRA critic; LoRA actor + critic in v1);
  model    verl loads the actor/critic model config and tokenizer (local dir, HF cache, or a
           reachable hub), the chat template exists, prompt+response fit the context;
  data     train/val files exist, have verl's RLHFDataset columns, enough rows for a batch, and
           how many prompts exceed max_prompt_length;
  reward   verl's own loader imports the reward and it scores a right and a wrong answer correctly;
  algorithm  what the advantage estimator and the loss need (group size, critic or none, KL in
           the reward or in the loss, the trainer that reads ReMax's baseline and DAPO's dynamic
           sampling): verl_gsm8k/preflight/algorithm.py, docs/algorithms.md;
  gpu      the GPUs the run gets: with RAY_ADDRESS the Ray cluster's (ray.nodes(), any node may
           launch, a CPU-only head too), otherwise this node's (nvidia-smi);
  memory   GPU memory of each phase of a step (rollout, old log-prob with its entropy, reference,
           critic values, critic and actor update) with each model's states where verl keeps
           them (memory.py, activations.py), against the card when known.
With --trainer sft it checks a launch of verl's SFT trainer instead (verl_gsm8k/preflight/sft.py).
Exit status: 0 passed (warnings allowed), 1 at least one error, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from verl_gsm8k.preflight import budget
from verl_gsm8k.preflight.algorithm import check_algorithm
from verl_gsm8k.preflight.batch import batch_split_problem
from verl_gsm8k.preflight.checkpoints import check_async_save, check_disk
from verl_gsm8k.preflight.compose import (
    LegacyKeys,
    compose,
    compose_error,
    legacy_key_problems,
    split_override,
)
from verl_gsm8k.preflight.device import (
    check_device,
    check_lora,
    lora_rank,
    ray_cluster_gpus,
    visible_gpus,
)
from verl_gsm8k.preflight.inputs import check_data, check_reward
from verl_gsm8k.preflight.lines import Report, one_line
from verl_gsm8k.preflight.memory import check_memory
from verl_gsm8k.preflight.model import (
    count_parameters,
    offline_if_hub_unreachable,
    resolve_model,
)
from verl_gsm8k.preflight.sft import run_sft
from verl_gsm8k.preflight.trainer_choice import check_trainer

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG_DIR = ROOT / "configs"
CONFIG_NAMES = {"ppo": "gsm8k_ppo", "sft": "gsm8k_sft"}  # --trainer -> default --config-name

# Keys the 2025 tutorials use that verl 0.9.1 ignores (they compose, nothing reads them) or
# rejects. prefix -> (replacement prefix, why). A replacement of "" means "remove it".
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
        "composes, but main_ppo never reads it (only fully_async_main copies it over, "
        "migrate_legacy_reward_impl): verl's dapo reward manager runs without its overlong "
        "penalty",
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
# Keys the default v1 trainer (trainer.use_v1=true) ignores and verl's legacy trainer
# (trainer.use_v1=false, configs/gsm8k_ppo_lora.yaml) reads: refused only where v1 runs.
V1_IGNORED_KEYS: LegacyKeys = {
    "trainer.balance_batch": (
        "",
        "the v1 trainer balances every batch (trainer/ppo/v1/trainer_base.py ~581); only the "
        "legacy trainer reads it (trainer/ppo/ray_trainer.py ~1549)",
    ),
    "critic.ppo_max_token_len_per_gpu": (
        "critic.ppo_infer_max_token_len_per_gpu",
        "the v1 trainer sets both critic token budgets from ppo_infer_max_token_len_per_gpu "
        "(trainer/ppo/v1/trainer_base.py ~267); only the legacy trainer reads it, for the "
        "critic's updates (trainer/ppo/ray_trainer.py ~811)",
    ),
}
# Keys that work but cost without need: key -> why (a warning).
COSTLY_KEYS: dict[str, str] = {
    "actor_rollout_ref.actor.calculate_entropy": (
        "both trainers log actor/entropy without it (the entropy of the old-log-prob pass: "
        "trainer/ppo/v1/trainer_base.py ~1651-1687, trainer/ppo/ray_trainer.py ~1300, ~1597); "
        "True adds a full-vocabulary entropy pass with gradients to every update (memory, time)"
    ),
}
CLIP_ALONE = "actor_rollout_ref.actor.clip_ratio"
# vLLM accepts these LoRA ranks (vllm.config.lora.MaxLoRARanks, also verl's fallback list).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


# ---------------------------------------------------------------------------- keys
def check_legacy_keys(overrides: list[str], report: Report) -> bool:
    """Keys wrong whichever trainer runs (before composing: some stop the composition). True
    when none was found."""
    keys = [split_override(o)[0] for o in overrides]
    found = False
    for problem in legacy_key_problems(keys, LEGACY_KEYS):
        report.error("keys", problem)
        found = True
    if CLIP_ALONE in keys and not {f"{CLIP_ALONE}_low", f"{CLIP_ALONE}_high"} & set(keys):
        report.error(
            "keys",
            f"'{CLIP_ALONE}' alone changes nothing in verl 0.9.1 (clip_ratio_low/high default to "
            f"0.2 and take precedence); set {CLIP_ALONE}_low and {CLIP_ALONE}_high",
        )
        found = True
    for override in overrides:
        key, value = split_override(override)
        if key in COSTLY_KEYS and value.strip().lower() == "true":
            report.warn("keys", f"'{key}=True': {COSTLY_KEYS[key]}")
    return not found


def check_trainer_keys(cfg, overrides: list[str], report: Report, clean: bool) -> None:
    """The keys the trainer that runs (trainer.use_v1) ignores, then the keys' verdict."""
    keys = [split_override(o)[0] for o in overrides]
    v1 = bool(cfg.trainer.get("use_v1", True))
    trainer = "v1 trainer" if v1 else "legacy trainer (trainer.use_v1=false)"
    if v1:
        kind = "ignored by verl's v1 trainer (trainer.use_v1=true, the default)"
        for problem in legacy_key_problems(keys, V1_IGNORED_KEYS, cfg, kind):
            report.error("keys", problem)
            clean = False
        if "trainer.esi_redundant_time" in keys:
            report.warn(
                "keys",
                "'trainer.esi_redundant_time' is read only by verl's legacy trainer "
                "(trainer/ppo/ray_trainer.py ~1693): the v1 trainer never saves ahead of a "
                "capacity block's end; the recipes save on SIGTERM instead (STOP_GRACE_S, "
                "docs/reliability.md)",
            )
    if clean:
        report.ok("keys", f"{len(keys)} overrides, no legacy key and none the {trainer} ignores")


# ---------------------------------------------------------------------------- config
def check_config(config_dir: Path, config_name: str, overrides: list[str], report: Report):
    """Compose and validate with verl's own code; return the config or None."""
    try:
        cfg = compose(config_dir, config_name, overrides)
    except Exception as exc:  # Hydra raises several types; all mean "does not compose"
        report.error("config", compose_error(exc, config_dir, config_name, overrides))
        return None
    import verl
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    n_gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    sizes = {
        "trainer.n_gpus_per_node": cfg.trainer.n_gpus_per_node,
        "trainer.nnodes": cfg.trainer.nnodes,
        "actor_rollout_ref.rollout.n": cfg.actor_rollout_ref.rollout.n,
    }
    small = [f"{key}={value}" for key, value in sizes.items() if not value or value < 1]
    if small:  # verl, and the checks after this one, divide by them
        report.error("config", f"{', '.join(small)}: must be at least 1")
        return None
    checked = _without_vllm_lora_check(cfg, report)
    try:
        validate_config(
            checked,
            use_reference_policy=need_reference_policy(cfg),
            use_critic=need_critic(cfg),
        )
    except Exception as exc:
        report.error("config", f"verl validate_config: {one_line(exc)}")
        return cfg
    if not check_batch_shape(cfg, n_gpus, report):
        return cfg
    roles = ["actor", "rollout"]
    roles += ["reference"] if need_reference_policy(cfg) else []
    roles += ["critic"] if need_critic(cfg) else []
    report.ok(
        "config",
        f"composes against verl {verl.__version__} ({config_name}) and validate_config passes "
        f"for {n_gpus} GPU(s); roles: {', '.join(roles)}",
    )
    return cfg


def check_batch_shape(cfg, n_gpus: int, report: Report) -> bool:
    """What validate_config skips with use_dynamic_bsz: every batch must split evenly over GPUs,
    and into mini-batches (verl asserts it at the first update)."""
    n = cfg.actor_rollout_ref.rollout.n
    batch = cfg.data.train_batch_size
    mini = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    problems = []
    if (batch * n) % n_gpus:
        problems.append(
            f"train_batch_size x rollout.n = {batch * n} responses must be divisible by the "
            f"{n_gpus} GPUs (verl splits every batch evenly across them)"
        )
    if mini > batch:
        problems.append(f"ppo_mini_batch_size {mini} > train_batch_size {batch}")
    else:
        if (mini * n) % n_gpus:
            problems.append(
                f"ppo_mini_batch_size x rollout.n = {mini * n} must be divisible by the "
                f"{n_gpus} GPUs"
            )
        split = batch_split_problem(
            batch, mini, "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"
        )
        problems += [split] if split else []
    for problem in problems:
        report.error("config", problem)
    return not problems


def _without_vllm_lora_check(cfg, report: Report):
    """validate_config imports vLLM to check a LoRA rank; where vLLM is absent, check it here."""
    import importlib.util

    from omegaconf import OmegaConf

    rank = lora_rank(cfg.actor_rollout_ref.model)
    if rank <= 0 or cfg.actor_rollout_ref.rollout.name != "vllm":
        return cfg
    if rank > max(VLLM_LORA_RANKS):
        report.error("config", f"LoRA rank {rank} is above vLLM's maximum {max(VLLM_LORA_RANKS)}")
    if cfg.actor_rollout_ref.rollout.load_format != "safetensors":
        report.error(
            "config",
            "LoRA with vLLM needs actor_rollout_ref.rollout.load_format=safetensors "
            f"(got {cfg.actor_rollout_ref.rollout.load_format})",
        )
    if importlib.util.find_spec("vllm") is not None:
        return cfg
    report.note("config", f"vLLM not installed here: LoRA rank {rank} checked against vLLM's list")
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    copy.actor_rollout_ref.model.lora_rank = 0
    copy.actor_rollout_ref.model.lora.rank = 0
    return copy


# ---------------------------------------------------------------------------- model
def check_models(cfg, report: Report):
    """Let verl itself load the model config and tokenizer; return (tokenizer of the first model
    loaded, {role: its HF config}) or None."""
    from verl.trainer.ppo.utils import need_critic
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    roles = [("actor", cfg.actor_rollout_ref.model)]
    if need_critic(cfg):
        roles.append(("critic", cfg.critic.model))
    tokenizer = None
    hf_configs: dict = {}
    checked: dict[str, object] = {}
    for role, model_cfg in roles:
        local = resolve_model(role, str(model_cfg.path), report)
        if local is None:
            continue
        if local in checked:  # the critic usually starts from the actor's weights
            report.ok("model", f"{role}: same model as checked above ({local})")
            hf_configs[role] = checked[local]
            continue
        model_cfg = model_cfg.copy()
        model_cfg.path = local
        try:
            hf = omega_conf_to_dataclass(model_cfg, dataclass_type=HFModelConfig)
        except Exception as exc:
            report.error("model", f"verl cannot load the {role} model at {local}: {one_line(exc)}")
            continue
        problems = []
        if not getattr(hf.tokenizer, "chat_template", None):
            problems.append("its tokenizer has no chat template (prompts are chat messages)")
        context = getattr(hf.hf_config, "max_position_embeddings", None)
        needed = cfg.data.max_prompt_length + cfg.data.max_response_length
        if context is not None and needed > context:
            problems.append(
                f"max_prompt_length + max_response_length = {needed} > context {context}"
            )
        for problem in problems:
            report.error("model", f"{role} model {model_cfg.path}: {problem}")
        if not problems:
            params = count_parameters(hf.hf_config)
            report.ok(
                "model",
                f"{role}: verl loads {hf.hf_config.model_type} ({params / 1e9:.2f}B params, "
                f"context {context}) and its chat-template tokenizer from {local}",
            )
        checked[local] = hf_configs[role] = hf.hf_config
        tokenizer = tokenizer or hf.tokenizer
    return (tokenizer, hf_configs) if hf_configs else None


# ---------------------------------------------------------------------------- gpu
def check_gpus(
    cfg, hf_configs: dict | None, report: Report, fit_budget: Path | None = None
) -> None:
    """The GPUs the run gets: a Ray cluster's (RAY_ADDRESS set: the launching node may have none,
    as a KubeRay head or a `ray job submit` entrypoint) or this node's (nvidia-smi); then the
    memory of each phase (memory.py) against this node's card when it has one, at a budget that
    fits it when ``fit_budget`` asks for one (budget.py)."""
    gpus = visible_gpus()
    card = gpus[0][1] if gpus else None
    address = os.environ.get("RAY_ADDRESS", "")
    wanted = cfg.trainer.n_gpus_per_node
    if address:
        check_ray_cluster(cfg, address, report)
    elif not gpus:
        report.note("gpu", "no NVIDIA GPU visible here: GPU count not checked")
    elif len(gpus) < wanted:
        report.error(
            "gpu", f"trainer.n_gpus_per_node={wanted} but this node has {len(gpus)} GPU(s)"
        )
    else:
        memory = f"{card:.0f} GiB" if card is not None else "memory not reported"
        report.ok("gpu", f"{len(gpus)} x {gpus[0][0]} ({memory}); this node uses {wanted}")
    if hf_configs and "actor" in hf_configs:
        if fit_budget is not None and card is not None:
            cfg = budget.choose(cfg, hf_configs, card, fit_budget, report)
        check_memory(cfg, hf_configs, card, report)


def check_ray_cluster(cfg, address: str, report: Report) -> None:
    """Enough GPUs in the Ray cluster: verl packs each node's share of workers onto one node
    (STRICT_PACK placement groups, single_controller/ray/base.py ~131), so it needs
    trainer.nnodes nodes with trainer.n_gpus_per_node GPUs each."""
    nodes, why = ray_cluster_gpus(address)
    if nodes is None:
        report.warn(
            "gpu", f"the Ray cluster at RAY_ADDRESS={address} did not answer ({why}): its GPUs "
            "are not checked"
        )  # fmt: skip
        return
    per_node, nnodes = cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes
    kinds = sorted({kind for node in nodes for kind in node["kind"]})
    total = sum(node["gpus"] for node in nodes)
    summary = f"Ray cluster at {address}: {len(nodes)} node(s), {total:g} GPU(s)"
    summary += f" ({', '.join(kinds)})" if kinds else ""
    enough = [node for node in nodes if node["gpus"] >= per_node]
    if len(enough) < nnodes:
        report.error(
            "gpu",
            f"{summary}; trainer.nnodes={nnodes} x trainer.n_gpus_per_node={per_node} needs "
            f"{nnodes} node(s) with {per_node} GPU(s) each, the cluster has {len(enough)}",
        )
    else:
        report.ok("gpu", f"{summary}; this run uses {nnodes} node(s) x {per_node} GPU(s)")


# ---------------------------------------------------------------------------- main
def run(
    config_name: str,
    config_dir: Path,
    overrides: list[str],
    dump: Path | None,
    fit_budget: Path | None = None,
    chosen: Mapping[str, str] | None = None,
) -> Report:
    report = Report()
    clean = check_legacy_keys(overrides, report)
    offline_if_hub_unreachable()
    cfg = check_config(config_dir, config_name, overrides, report)
    if cfg is None:
        return report
    check_trainer_keys(cfg, overrides, report, clean)
    if dump is not None:
        from omegaconf import OmegaConf

        dump.write_text(json.dumps(OmegaConf.to_container(cfg, resolve=False), indent=1))
    from verl.trainer.ppo.utils import need_critic

    check_device(cfg, need_critic(cfg), report)
    check_lora(cfg, need_critic(cfg), report)
    check_trainer(cfg, report)
    check_async_save(cfg, report)
    loaded = check_models(cfg, report)
    tokenizer, hf_configs = loaded if loaded else (None, None)
    if hf_configs:
        check_disk(cfg, hf_configs, report)
    first_prompt = check_data(cfg, tokenizer, report)
    reward_keys = check_reward(cfg, report, first_prompt)
    check_algorithm(cfg, report, reward_keys, chosen)
    check_gpus(cfg, hf_configs, report, fit_budget)
    return report


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
        help="which verl trainer the launch runs: ppo (main_ppo: the checks above; default) or "
        "sft (sft_trainer: keys, config, device, model, data, gpu; verl_gsm8k/preflight/sft.py)",
    )
    parser.add_argument(
        "--config-name",
        default=None,
        help="config file (without .yaml) in --config-dir (default gsm8k_ppo, or gsm8k_sft with "
        "--trainer sft)",
    )
    parser.add_argument(
        "--config-dir",
        type=Path,
        default=DEFAULT_CONFIG_DIR,
        help="directory holding the recipe configs (default: the repo's configs/)",
    )
    parser.add_argument(
        "--dump-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the composed (unresolved) config as JSON to FILE",
    )
    parser.add_argument(
        "--fit-budget",
        type=Path,
        default=None,
        metavar="FILE",
        help="ppo only: where the micro-batch token budgets would pass 90 %% of this node's card, "
        "check at the largest power-of-two budget that fits and write its overrides to FILE, one "
        "per line (empty FILE: the recipe's budgets stand); TOKEN_BUDGET=auto in the launcher",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides key=value (after --)")
    args = parser.parse_args(argv)
    if args.trainer == "sft" and args.fit_budget is not None:
        parser.error("--fit-budget is for --trainer ppo (the PPO/GRPO micro-batch budgets)")
    config_name = args.config_name or CONFIG_NAMES[args.trainer]
    chosen = {split_override(item)[0]: item for item in args.overrides}
    return preflight(args.trainer, config_name, args.overrides, args.config_dir.resolve(),
                     args.dump_config, args.fit_budget, chosen)  # fmt: skip


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
    passed or FAILED; 0 or 1. ``chosen``: the verl keys the user set (key -> the knob or the
    key=value that set it), warned where they do nothing; ``fit_budget``: as --fit-budget."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    start = time.monotonic()
    if trainer == "sft":
        report = run_sft(config_name, config_dir, overrides, dump)
    else:
        report = run(config_name, config_dir, overrides, dump, fit_budget, chosen)
    elapsed = time.monotonic() - start
    if report.errors:
        print(
            f"preflight: FAILED with {report.errors} error(s), {report.warnings} warning(s) "
            f"in {elapsed:.1f} s",
            flush=True,
        )
        return 1
    print(f"preflight: passed ({report.warnings} warning(s)) in {elapsed:.1f} s", flush=True)
    return 0

"""Prove a launch of verl's SFT trainer is valid before a GPU is spent. Runs anywhere, GPU or not.

    python -m verl_gsm8k.preflight --trainer sft [--config-name gsm8k_sft] -- key=value ...

recipes/sft_qwen2.5-0.5b_gsm8k.sh runs it on its final override list (the PPO recipes run cli.py's
checks; both use compose.py, model.py, device.py and lines.py). Checks, each on one line:
  keys     keys of verl's older SFT trainer (fsdp_sft_trainer.py, what tutorials use) that the
           engine trainer of 0.9.1 does not read, with the key to use instead;
  config   the overrides compose against the INSTALLED verl config (unknown key -> closest match),
           verl's own config classes accept the engine, optimizer and checkpoint sections, the
           batch splits over the GPUs (and into micro-batches, or an example fits a token budget),
           and the checkpoint holds what scripts/merge.sh merges;
  device   where it trains (GPU, or the CPU platform) and with which attention;
  model    verl's HFModelConfig loads the model config and tokenizer (local dir, HF cache, or a
           reachable hub), the chat template exists, max_length fits the context;
  data     train/val files exist, hold a messages column of chat turns with an assistant turn to
           learn, at least one batch; steps per epoch and in total (and whether TOTAL_EPOCHS would
           end the run before TOTAL_TRAINING_STEPS); how many examples exceed max_length;
  gpu      with nvidia-smi: GPU count and a memory estimate against the request.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from verl_gsm8k.preflight.compose import (
    LegacyKeys,
    compose,
    compose_error,
    legacy_key_problems,
    split_override,
)
from verl_gsm8k.preflight.device import (
    TRAINED_BYTES_PER_PARAM,
    attention_choice,
    attention_path,
    cpu_platform_missing,
    model_attention,
    visible_gpus,
)
from verl_gsm8k.preflight.inputs import as_list, read_rows
from verl_gsm8k.preflight.lines import Report, one_line
from verl_gsm8k.preflight.memory import MEMORY_WARN_FRACTION
from verl_gsm8k.preflight.model import count_parameters, offline_if_hub_unreachable, resolve_model

OLD_TRAINER = "verl's older SFT trainer (fsdp_sft_trainer.py)"
# Keys of the older trainer's sft_trainer.yaml -> the engine trainer's (sft_trainer_engine.yaml).
SFT_LEGACY_KEYS: LegacyKeys = {
    "model.partial_pretrain": ("model.path", f"the model path key of {OLD_TRAINER}"),
    "model.strategy": ("engine.strategy", "the FSDP version moved to the engine section"),
    "model.fsdp_config.cpu_offload": (
        "engine.param_offload",
        "offloading is set on the engine (also engine.optimizer_offload)",
    ),
    "model.fsdp_config.offload_params": (
        "engine.param_offload",
        "offloading is set on the engine (also engine.optimizer_offload)",
    ),
    "model.fsdp_config.": ("engine.", "FSDP settings moved to the engine section"),
    "data.prompt_key": ("", "the engine trainer reads chat transcripts (data.messages_key)"),
    "data.response_key": ("", "the engine trainer reads chat transcripts (data.messages_key)"),
    "data.prompt_dict_keys": ("", "the engine trainer reads chat transcripts (data.messages_key)"),
    "data.response_dict_keys": (
        "",
        "the engine trainer reads chat transcripts (data.messages_key)",
    ),
    "data.multiturn.messages_key": ("data.messages_key", "multi-turn is the only format now"),
    "data.multiturn.": ("data.", "multi-turn is the only format now (data.messages_key, ...)"),
    "data.micro_batch_size": (
        "data.micro_batch_size_per_gpu",
        "micro-batches are sized per GPU (or by tokens: data.use_dynamic_bsz)",
    ),
    "data.chat_template": ("model.custom_chat_template", "the chat template moved to the model"),
    "optim.warmup_steps_ratio": ("optim.lr_warmup_steps_ratio", "renamed"),
    "optim.lr_scheduler": ("optim.lr_scheduler_type", "renamed"),
    "ulysses_sequence_parallel_size": (
        "engine.ulysses_sequence_parallel_size",
        "sequence parallelism is set on the engine",
    ),
    "use_remove_padding": ("model.use_remove_padding", "padding removal is set on the model"),
    "trainer.checkpoint.": ("checkpoint.", "the checkpoint section is top-level"),
}
ROLES = ("system", "user", "assistant", "tool")


# ---------------------------------------------------------------------------- keys
def check_sft_keys(overrides: list[str], report: Report) -> None:
    keys = [split_override(o)[0] for o in overrides]
    problems = legacy_key_problems(keys, SFT_LEGACY_KEYS)
    for problem in problems:
        report.error("keys", problem)
    if not problems:
        report.ok("keys", f"{len(keys)} overrides, no key of {OLD_TRAINER}")


# ---------------------------------------------------------------------------- config
def check_sft_config(config_dir: Path, config_name: str, overrides: list[str], report: Report):
    """Compose, and let verl's own config classes read the sections the trainer builds first."""
    try:
        cfg = compose(config_dir, config_name, overrides)
    except Exception as exc:  # Hydra raises several types; all mean "does not compose"
        report.error("config", compose_error(exc, config_dir, config_name, overrides))
        return None
    import verl
    from verl.utils.config import omega_conf_to_dataclass

    for section in ("engine", "optim", "checkpoint"):
        try:
            omega_conf_to_dataclass(cfg[section])
        except Exception as exc:
            report.error("config", f"verl does not accept the {section} section: {one_line(exc)}")
            return None
    n_gpus = cfg.trainer.n_gpus_per_node
    if not n_gpus or n_gpus < 1:
        report.error("config", f"trainer.n_gpus_per_node={n_gpus}: must be at least 1")
        return None
    problems = batch_problems(cfg, n_gpus)
    if cfg.engine.strategy == "fsdp" and cfg.trainer.device == "cpu":
        problems.append(
            "engine.strategy=fsdp (FSDP1) fails on a CPU ('module has CPU parameters ... "
            "sync_module_states'): use engine.strategy=fsdp2"
        )
    for problem in problems:
        report.error("config", problem)
    if "model" not in cfg.checkpoint.save_contents:
        report.warn(
            "config",
            f"checkpoint.save_contents={list(cfg.checkpoint.save_contents)} lacks 'model': "
            "scripts/merge.sh has no weights to merge",
        )
    if problems:
        return cfg
    budget = (
        f"micro-batches of up to {cfg.data.max_token_len_per_gpu} tokens"
        if cfg.data.use_dynamic_bsz
        else f"micro-batches of {cfg.data.micro_batch_size_per_gpu} examples"
    )
    report.ok(
        "config",
        f"composes against verl {verl.__version__} ({config_name}): {cfg.engine.strategy}, "
        f"{cfg.optim.optimizer} lr {cfg.optim.lr:g} ({cfg.optim.lr_scheduler_type}), batch "
        f"{cfg.data.train_batch_size} over {n_gpus} GPU(s) in {budget}",
    )
    return cfg


def batch_problems(cfg: Any, n_gpus: int) -> list[str]:
    """What verl divides without checking: the batch over the GPUs, then into micro-batches."""
    batch, data = cfg.data.train_batch_size, cfg.data
    if batch % n_gpus:
        return [
            f"data.train_batch_size={batch} must be divisible by the {n_gpus} GPUs (each takes "
            f"batch // {n_gpus}: verl would silently train on fewer examples per step)"
        ]
    if data.use_dynamic_bsz:
        if data.max_length > data.max_token_len_per_gpu:
            return [
                f"data.max_length={data.max_length} > data.max_token_len_per_gpu="
                f"{data.max_token_len_per_gpu}: a longest example would fit no micro-batch "
                "(verl asserts it in the first step)"
            ]
        return []
    micro = data.micro_batch_size_per_gpu
    if not micro or (batch // n_gpus) % micro:
        return [
            f"data.train_batch_size={batch} over {n_gpus} GPU(s) does not split into "
            f"micro-batches of data.micro_batch_size_per_gpu={micro} (verl asserts it)"
        ]
    return []


# ---------------------------------------------------------------------------- device
def check_sft_device(cfg: Any, report: Report) -> None:
    missing = cpu_platform_missing(cfg.trainer.device)
    if missing:
        report.error("device", missing)
        return
    choice = attention_choice(cfg.trainer.device, report)
    if choice is None:
        return
    asked = model_attention(cfg.model, choice, report, "model", suffix="_sft")
    if asked is None:
        return
    attn, padding_removal = asked
    device = cfg.trainer.device
    where = "the CPU (verl's cpu platform, gloo)" if device == "cpu" else f"the GPU ({device})"
    mixed = cfg.engine.get("mixed_precision") or {}
    dtype = str(mixed.get("param_dtype", cfg.engine.dtype))
    if cfg.trainer.device == "cpu" and dtype not in ("fp32", "float32"):
        report.note(
            "device",
            f"parameters computed in {dtype} on a CPU: without native bf16 (AVX2 only) that is "
            "~10x slower than fp32 (configs/device/cpu_sft.yaml sets fp32)",
        )
    path = attention_path(attn, padding_removal, choice)
    report.ok("device", f"trains on {where}; attention: {path}")


# ---------------------------------------------------------------------------- model
def check_sft_model(cfg: Any, report: Report):
    """verl's own HFModelConfig loads the model config and tokenizer: (tokenizer, hf_config)."""
    from verl.utils.config import omega_conf_to_dataclass

    local = resolve_model("model", str(cfg.model.path), report)
    if local is None:
        return None
    model_cfg = cfg.model.copy()
    model_cfg.path = local
    try:
        hf = omega_conf_to_dataclass(model_cfg)
    except Exception as exc:
        report.error("model", f"verl cannot load the model at {local}: {one_line(exc)}")
        return None
    problems = []
    if not getattr(hf.tokenizer, "chat_template", None):
        problems.append("its tokenizer has no chat template (the examples are chat messages)")
    context = getattr(hf.hf_config, "max_position_embeddings", None)
    if context is not None and cfg.data.max_length > context:
        problems.append(f"data.max_length={cfg.data.max_length} > its context {context}")
    for problem in problems:
        report.error("model", f"{cfg.model.path}: {problem}")
    if problems:
        return None
    params = count_parameters(hf.hf_config)
    report.ok(
        "model",
        f"verl loads {hf.hf_config.model_type} ({params / 1e9:.2f}B params, context {context}) "
        f"and its chat-template tokenizer from {local}",
    )
    return hf.tokenizer, hf.hf_config


# ---------------------------------------------------------------------------- data
def messages_problem(messages: Any) -> str | None:
    """Why one row's messages are not a conversation verl's MultiTurnSFTDataset learns from."""
    if not isinstance(messages, list) or not messages:
        return "is not a non-empty list of chat messages [{role, content}]"
    for turn, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return f"turn {turn} is not a message with a text 'content'"
        if message.get("role") not in ROLES:
            return f"turn {turn} has role {message.get('role')!r} (not one of {', '.join(ROLES)})"
    if not any(m["role"] == "assistant" for m in messages):
        return "has no assistant turn: the loss is computed on assistant turns only"
    return None


def read_conversations(path: Path, key: str, split: str, report: Report) -> list | None:
    """The messages of every row of one file, or None after reporting the first problem."""
    if not path.is_file():
        report.error("data", f"{split} file {path} does not exist (python -m data_prep.sft)")
        return None
    try:
        table = read_rows(path)
    except Exception as exc:
        report.error("data", f"{split} file {path} cannot be read: {one_line(exc)}")
        return None
    if key not in table.column_names:
        report.error(
            "data",
            f"{split} file {path}: no column '{key}' (data.messages_key; have "
            f"{', '.join(table.column_names)}): prepare it with python -m data_prep.sft",
        )
        return None
    conversations = table.column(key).to_pylist()
    for row, messages in enumerate(conversations, start=1):
        problem = messages_problem(messages)
        if problem:
            report.error("data", f"{split} file {path}: row {row}: column '{key}' {problem}")
            return None
    return conversations


def check_sft_data(cfg: Any, tokenizer, report: Report) -> None:
    """Check the train/val files, their lengths, and the schedule they give."""
    n_gpus = cfg.trainer.n_gpus_per_node
    splits = [
        ("train", as_list(cfg.data.train_files), cfg.data.get("train_max_samples", -1)),
        ("val", as_list(cfg.data.val_files), cfg.data.get("val_max_samples", -1)),
    ]
    for split, files, max_samples in splits:
        rows: list = []
        for name in files:
            path = Path(os.path.expanduser(name))
            conversations = read_conversations(path, cfg.data.messages_key, split, report)
            if conversations is None:
                continue
            if tokenizer is not None:
                check_lengths(cfg, tokenizer, conversations, path, report)
            rows += conversations
        total = min(len(rows), max_samples) if max_samples and max_samples > 0 else len(rows)
        if not rows:
            continue
        if split == "train":
            check_schedule(cfg, total, n_gpus, report)
        elif total < cfg.data.train_batch_size:
            report.warn(
                "data",
                f"val: {total} rows < train_batch_size {cfg.data.train_batch_size}: verl's "
                "validation loader drops the incomplete batch, so val/loss would be nan",
            )
        else:
            report.ok("data", f"val: {total} rows, validation loss every {cfg.trainer.test_freq}")


def check_schedule(cfg: Any, rows: int, n_gpus: int, report: Report) -> None:
    """Steps as verl's loader makes them: each GPU takes rows // n_gpus, in whole batches."""
    batch = cfg.data.train_batch_size
    steps_per_epoch = (rows // n_gpus) // max(batch // n_gpus, 1)
    if steps_per_epoch == 0:
        report.error("data", f"train: {rows} rows < train_batch_size {batch}: not one full batch")
        return
    epochs = cfg.trainer.total_epochs
    by_epochs = steps_per_epoch * epochs
    wanted = cfg.trainer.total_training_steps
    if wanted and wanted > by_epochs:
        report.error(
            "data",
            f"train: total_training_steps={wanted} but {epochs} epoch(s) of {steps_per_epoch} "
            f"steps end verl's SFT loop at step {by_epochs}, without a final checkpoint; raise "
            f"TOTAL_EPOCHS to at least {-(-wanted // steps_per_epoch)} (trainer.total_epochs)",
        )
        return
    total = wanted or by_epochs
    report.ok(
        "data",
        f"train: {rows} rows -> {steps_per_epoch} steps/epoch; this run: {total} steps "
        f"(checkpoint every {cfg.trainer.save_freq} and at the end)",
    )


def check_lengths(cfg: Any, tokenizer, conversations: list, path: Path, report: Report) -> None:
    """Tokens per example as verl's dataset renders it (the whole conversation, chat template)."""
    limit = cfg.data.max_length
    texts = [tokenizer.apply_chat_template(m, tokenize=False) for m in conversations]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    too_long = sum(n > limit for n in lengths)
    longest = max(lengths)
    if too_long and cfg.data.truncation == "error":
        report.error(
            "data",
            f"{path.name}: {too_long} of {len(lengths)} examples exceed max_length {limit} "
            f"(longest {longest} tokens) and data.truncation=error stops training at the first; "
            "raise MAX_LENGTH",
        )
    elif too_long:
        report.warn(
            "data",
            f"{path.name}: {too_long} of {len(lengths)} examples exceed max_length {limit} and "
            f"are cut ({cfg.data.truncation}; longest {longest} tokens)",
        )
    else:
        report.ok("data", f"{path.name}: longest example {longest} tokens <= {limit}")


# ---------------------------------------------------------------------------- gpu
def check_sft_gpus(cfg: Any, hf_config, report: Report) -> None:
    gpus = visible_gpus()
    if not gpus:
        report.note("gpu", "no NVIDIA GPU visible here: GPU count and memory not checked")
        return
    wanted = cfg.trainer.n_gpus_per_node
    name, gib = gpus[0]
    if len(gpus) < wanted:
        report.error(
            "gpu", f"trainer.n_gpus_per_node={wanted} but this node has {len(gpus)} GPU(s)"
        )
    elif gib is None:
        report.ok("gpu", f"{len(gpus)} x {name} (memory not reported); this run uses {wanted}")
    else:
        report.ok("gpu", f"{len(gpus)} x {name} ({gib:.0f} GiB); this run uses {wanted}")
    if hf_config is None or gib is None:
        return
    states = count_parameters(hf_config) * TRAINED_BYTES_PER_PARAM / wanted / 1024**3
    summary = (
        f"estimated {states:.1f} GiB of {gib:.0f} GiB per GPU for weights, gradients and Adam "
        "(16 B/param, sharded); activations come on top (data.max_token_len_per_gpu)"
    )
    if states > MEMORY_WARN_FRACTION * gib:
        report.warn("gpu", f"{summary}: unlikely to fit; engine.optimizer_offload=True helps")
    else:
        report.ok("gpu", summary)


# ---------------------------------------------------------------------------- main
def run_sft(config_name: str, config_dir: Path, overrides: list[str], dump: Path | None) -> Report:
    report = Report()
    check_sft_keys(overrides, report)
    offline_if_hub_unreachable()
    cfg = check_sft_config(config_dir, config_name, overrides, report)
    if cfg is None:
        return report
    if dump is not None:
        from omegaconf import OmegaConf

        dump.write_text(json.dumps(OmegaConf.to_container(cfg, resolve=False), indent=1))
    check_sft_device(cfg, report)
    loaded = check_sft_model(cfg, report)
    tokenizer, hf_config = loaded if loaded else (None, None)
    check_sft_data(cfg, tokenizer, report)
    check_sft_gpus(cfg, hf_config, report)
    return report

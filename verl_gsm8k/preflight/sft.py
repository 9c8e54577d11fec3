"""The preflight of a launch of verl's SFT trainer (``--trainer sft``)."""

from pathlib import Path
from typing import Any

from verl_gsm8k.preflight import inputs, model
from verl_gsm8k.preflight.checkpoints import check_run_dir
from verl_gsm8k.preflight.compose import LegacyKeys, compose_checked, split_override
from verl_gsm8k.preflight.compose import legacy_key_problems as legacy
from verl_gsm8k.preflight.device import check_device, check_gpu_count
from verl_gsm8k.preflight.lines import Report, one_line
from verl_gsm8k.preflight.memory import GIB, MEMORY_WARN_FRACTION

OLD = "verl's older SFT trainer (fsdp_sft_trainer.py)"
CHAT = "the engine trainer reads chat transcripts (data.messages_key)"
FSDP, MT = "FSDP settings are the engine's", "multi-turn is the only format"
# Keys of the older trainer's sft_trainer.yaml -> the engine trainer's (sft_trainer_engine.yaml).
SFT_LEGACY_KEYS: LegacyKeys = {
    "model.partial_pretrain": ("model.path", f"the model path key of {OLD}"),
    "model.strategy": ("engine.strategy", FSDP),
    "model.fsdp_config.cpu_offload": ("engine.param_offload", FSDP),
    "model.fsdp_config.offload_params": ("engine.param_offload", FSDP),
    "model.fsdp_config.": ("engine.", FSDP),
    **{f"data.{key}": ("", CHAT) for key in
       ("prompt_key", "response_key", "prompt_dict_keys", "response_dict_keys")},
    "data.multiturn.messages_key": ("data.messages_key", MT),
    "data.multiturn.": ("data.", MT),
    "data.micro_batch_size": ("data.micro_batch_size_per_gpu", "micro-batches are per GPU"),
    "data.chat_template": ("model.custom_chat_template", "the chat template is the model's"),
    "optim.warmup_steps_ratio": ("optim.lr_warmup_steps_ratio", "renamed"),
    "optim.lr_scheduler": ("optim.lr_scheduler_type", "renamed"),
    "ulysses_sequence_parallel_size": ("engine.ulysses_sequence_parallel_size", "the engine's"),
    "use_remove_padding": ("model.use_remove_padding", "padding removal is the model's"),
    "trainer.checkpoint.": ("checkpoint.", "the checkpoint section is top-level"),
}  # fmt: skip
ROLES = ("system", "user", "assistant", "tool")
TRAINED_BYTES_PER_PARAM = 16  # fp32 weights 4 + fp32 gradients 4 + Adam's two moments 8


def check_sft_config(config_dir: Path, config_name: str, overrides: list[str], report: Report):
    """Compose, let verl's config classes read it, split the batch as verl does."""
    from verl.utils.config import omega_conf_to_dataclass

    cfg = compose_checked(config_dir, config_name, overrides, report)
    if cfg is None:
        return None
    for section in ("engine", "optim", "checkpoint"):
        try:
            omega_conf_to_dataclass(cfg[section])
        except Exception as exc:
            report.error("config", f"verl does not accept the {section} section: {one_line(exc)}")
            return None
    data, batch, gpus = cfg.data, cfg.data.train_batch_size, cfg.trainer.n_gpus_per_node
    if not gpus or gpus < 1:
        report.error("config", f"trainer.n_gpus_per_node={gpus}: must be at least 1")
        return None
    problems = [f"data.train_batch_size={batch} must be divisible by the {gpus} GPUs (verl "
                "would train on fewer examples)"] if batch % gpus else []  # fmt: skip
    if data.use_dynamic_bsz and data.max_length > data.max_token_len_per_gpu:
        problems.append(f"data.max_length={data.max_length} > data.max_token_len_per_gpu="
                        f"{data.max_token_len_per_gpu}: the longest cannot fit")  # fmt: skip
    micro = data.micro_batch_size_per_gpu
    if not data.use_dynamic_bsz and (not micro or batch // gpus % micro):
        problems.append(f"data.train_batch_size={batch} over {gpus} GPU(s) does not split into "
                        f"micro-batches of data.micro_batch_size_per_gpu={micro}")  # fmt: skip
    if cfg.engine.strategy == "fsdp" and cfg.trainer.device == "cpu":
        problems.append("engine.strategy=fsdp (FSDP1) fails on a CPU: use engine.strategy=fsdp2")
    if "model" not in cfg.checkpoint.save_contents:
        report.warn("config", "checkpoint.save_contents lacks 'model': merge.sh has nothing to "
                    "merge")  # fmt: skip
    report.verdict("config", problems, f"composes against verl's SFT config ({config_name}): "
                   f"{cfg.engine.strategy}, batch {batch} over {gpus} GPU(s)")  # fmt: skip
    return cfg


def messages_problem(messages: Any) -> str | None:
    """Why one row is not a conversation verl's MultiTurnSFTDataset learns from."""
    if not isinstance(messages, list) or not messages:
        return "is not a non-empty list of chat messages [{role, content}]"
    for turn, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return f"turn {turn} is not a message with a text 'content'"
        if message.get("role") not in ROLES:
            return f"turn {turn} has role {message.get('role')!r}, not one of {', '.join(ROLES)}"
    if not any(m["role"] == "assistant" for m in messages):
        return "has no assistant turn (the loss is on assistant turns)"
    return None


def check_sft_data(cfg: Any, tokenizer: Any, report: Report) -> None:
    key, data = cfg.data.messages_key, cfg.data

    def read(split: str, path: Path, table: Any) -> int | None:
        if key not in table.column_names:
            have = ", ".join(table.column_names)
            report.error("data", f"{split} file {path}: no column '{key}' (data.messages_key; "
                         f"have {have}): python -m data_prep.sft")  # fmt: skip
            return None
        rows = table.column(key).to_pylist()
        for row, problem in enumerate(map(messages_problem, rows), start=1):
            if problem:
                report.error("data", f"{split} file {path}: row {row}: column '{key}' {problem}")
                return None
        if tokenizer is not None and rows:
            fate = None if data.truncation == "error" else f"cut ({data.truncation})"
            tools = data.tools_key  # verl renders each row's tools block too
            tools = table.column(tools).to_pylist() if tools in table.column_names else None
            inputs.check_lengths(cfg, tokenizer, rows, path, "max_length", fate, report, tools)
        return len(rows)

    rows = inputs.check_files(cfg, read, "data_prep.sft", report)
    if rows["train"]:
        inputs.check_schedule(cfg, rows["train"], cfg.trainer.n_gpus_per_node, report, strict=True)
    if 0 < rows["val"] < data.train_batch_size:
        report.warn("data", f"val: {rows['val']} rows < train_batch_size {data.train_batch_size}:"
                    " verl drops the incomplete batch, so val/loss would be nan")  # fmt: skip
    elif rows["val"]:
        report.ok("data", f"val: {rows['val']} rows")


def run_sft(config_name: str, config_dir: Path, overrides: list[str]) -> Report:
    report = Report()
    keys = [split_override(override)[0] for override in overrides]
    report.verdict("keys", legacy(keys, SFT_LEGACY_KEYS), f"{len(keys)} overrides, no key of {OLD}")
    model.offline_if_hub_unreachable()  # before verl imports huggingface_hub
    cfg = check_sft_config(config_dir, config_name, overrides, report)
    if cfg is None:
        return report
    check_device(cfg, False, report, model=cfg.model, who="model")
    dtype = str((cfg.engine.get("mixed_precision") or {}).get("param_dtype", cfg.engine.dtype))
    if cfg.trainer.device == "cpu" and dtype not in ("fp32", "float32"):
        report.note("device", f"{dtype} on a CPU without native bf16 is ~10x slower than fp32")
    local = model.resolve_model("model", str(cfg.model.path), report)
    need = (cfg.data.max_length, f"data.max_length={cfg.data.max_length}")
    hf = model.load_model("model", cfg.model, local, need, report) if local else None
    check_run_dir(cfg, report)
    check_sft_data(cfg, hf.tokenizer if hf else None, report)
    wanted = cfg.trainer.n_gpus_per_node
    card = check_gpu_count(wanted, report)
    if hf is not None and card is not None:
        states = model.count_parameters(hf.hf_config) * TRAINED_BYTES_PER_PARAM / wanted / GIB
        line = (f"~{states:.1f} of {card:.0f} GiB per GPU for weights, gradients and Adam (16 "
                "bytes a parameter, sharded), activations on top")  # fmt: skip
        if states > MEMORY_WARN_FRACTION * card:
            report.warn("gpu", f"{line}: unlikely to fit; engine.optimizer_offload=True helps")
        else:
            report.ok("gpu", line)
    return report

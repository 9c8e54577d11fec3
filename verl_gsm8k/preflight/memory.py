"""GPU memory per phase of a PPO step (docs/gpu.md), and TOKEN_BUDGET=auto: the largest
power-of-two budget under the recipe's at which every phase fits."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.preflight.device import attention, lora_rank
from verl_gsm8k.preflight.model import count_parameters

GIB = 1024**3
MEMORY_WARN_FRACTION = 0.9  # above this share of the card a warning; above the card an error
UNITS_IN_FLIGHT = 2  # FSDP units gathered besides the root: the one computing, the prefetched
VLLM_ASLEEP_GIB = (0.5, 1.0)  # asleep, vLLM keeps its CUDA context and its graphs (estimates)
SDPA_PADDING_FACTOR = 2.0  # a padded micro-batch over its real tokens (1.5-2x at GSM8K lengths)
FP32 = 4
HIDDEN_TENSORS = 3  # hidden-sized tensors beside the logits (final norm in and out, its grad)
VALUE_TENSORS = (3, 4)  # a critic layer's forward: intermediate-sized, hidden-sized tensors


def logprob_pass(c: Any, tokens: int, compute: int, entropy: bool, rmpad: bool,
                 compiled: bool = False) -> int:  # fmt: skip
    if entropy and not (compiled and rmpad):
        per_logit = compute + 2 * FP32 + (FP32 if compute < FP32 else 0)
    else:
        per_logit = compute * (1 if rmpad or entropy else 2)
    return tokens * (c.vocab_size * per_logit + c.hidden_size * compute)


def value_pass(c: Any, tokens: int, compute: int) -> int:
    mlp, hidden = VALUE_TENSORS
    return tokens * (mlp * c.intermediate_size + hidden * c.hidden_size) * compute


def update_pass(c: Any, tokens: int, compute: int, lm_head: bool, rmpad: bool,
                flash_ce: bool = False) -> int:  # fmt: skip
    saved = tokens * c.hidden_size * (c.num_hidden_layers + HIDDEN_TENSORS) * compute
    if not lm_head:
        return saved
    flash = rmpad and flash_ce
    per_logit = compute if flash else FP32 + (compute if compute < FP32 else 3 * compute)
    return saved + tokens * c.vocab_size * per_logit


def embedding_backward(c: Any, grad_bytes: int, trained: bool) -> int:
    tied = trained and getattr(c, "tie_word_embeddings", False)
    return 2 * c.vocab_size * c.hidden_size * grad_bytes if tied else 0


def adam_step(trained: float, largest: float, foreach: bool) -> float:
    """Adam's step temporaries: CUDA's foreach step, or the CPU's per tensor."""
    return trained if foreach else 2 * largest


def dtype_bytes(name: str | None, default: int) -> int:
    from verl.utils.torch_dtypes import PrecisionType

    return default if name is None else PrecisionType.to_dtype(name).itemsize


def lora_parameters(c: Any, rank: int, target_modules: Any) -> int:
    h, heads = c.hidden_size, c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or h // heads
    kv_heads = getattr(c, "num_key_value_heads", heads)
    q, kv, mlp = h + heads * head_dim, h + kv_heads * head_dim, h + c.intermediate_size
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    sizes = dict(zip(names, (q, kv, kv, q, mlp, mlp, mlp), strict=True))
    if isinstance(target_modules, str):
        target_modules = list(sizes) if target_modules == "all-linear" else [target_modules]
    names = {str(name) for name in target_modules or []}
    return rank * sum(n for name, n in sizes.items() if name in names) * c.num_hidden_layers


@dataclass(frozen=True)
class Engine:
    """One FSDP engine's states per GPU (GiB)."""

    role: str
    host: str  # why its states never leave host memory ("" when they do)
    param_offload: bool
    optimizer_offload: bool
    weights: float  # every weight, in model_dtype
    trained: float  # the trained weights (all, or a LoRA model's adapters), in model_dtype
    working: float = 0.0  # units gathered to compute, unsharded, in the compute dtype
    dtype: str = "fp32"  # model_dtype
    compute_bytes: int = 2  # FSDP's mixed_precision.param_dtype
    compiled: bool = True  # use_torch_compile: the entropy compiled on packed rows
    weight_bytes: int = 4

    def resting(self) -> float:  # while another engine or vLLM works
        moments = 2 * self.trained * (not self.optimizer_offload)
        return 0.0 if self.host else self.weights * (not self.param_offload) + moments

    def forward(self) -> float:  # in its own forward pass, the working copy aside
        return 0.0 if self.host else self.weights + 2 * self.trained * (not self.optimizer_offload)

    def update(self) -> float:  # weights, gradients, Adam moments
        return 0.0 if self.host else self.weights + 3 * self.trained


def engine_of(cfg: Any, role: str, c: Any, n_gpus: int) -> Engine:
    from verl.utils.config import omega_conf_to_dataclass

    arr = cfg.actor_rollout_ref
    node, strategy, model = {
        "actor": (arr.actor.fsdp_config, arr.actor.strategy, arr.model),
        "reference": (arr.ref.fsdp_config, arr.ref.strategy, arr.model),
        "critic": (cfg.critic.fsdp, cfg.critic.strategy, cfg.critic.model),
    }[role]
    e = omega_conf_to_dataclass(node)
    policy = strategy == "fsdp2" and e.offload_policy
    host = "forward_only: FSDP's CPU offload" if e.forward_only else ""
    host = host or ("offload_policy: CPUOffloadPolicy" if policy else "")
    vocab_h, tied = c.vocab_size * c.hidden_size, getattr(c, "tie_word_embeddings", False)
    params = count_parameters(c)
    root = vocab_h * (1 if tied else 2)
    layer = (params - root) / c.num_hidden_layers
    if role == "critic":  # a token classifier: the backbone and a 1-wide head, no LM head
        params += c.hidden_size + 1 - vocab_h * (not tied)
    rank = lora_rank(model) if role != "critic" else 0
    adapters = lora_parameters(c, rank, model.get("target_modules")) if rank else 0
    weight = dtype_bytes(e.model_dtype, 4)
    compute = dtype_bytes((e.mixed_precision or {}).get("param_dtype"), 2)
    per_gpu = weight / n_gpus / GIB
    return Engine(role, host, bool(e.param_offload) and not host,
                  bool(e.optimizer_offload) and not host, (params + adapters) * per_gpu,
                  0 if e.forward_only else (adapters or params) * per_gpu,
                  (root + UNITS_IN_FLIGHT * layer) * compute / GIB, str(e.model_dtype), compute,
                  bool(e.use_torch_compile), weight)  # fmt: skip


@dataclass
class Phase:
    name: str
    parts: list[tuple[str, float]]  # (what, GiB per GPU)
    vllm_share: float  # share of the card vLLM holds in this phase
    notes: list[str]  # what is kept off the GPU, and why

    def gib(self, card: float) -> float:
        return sum(v for _, v in self.parts) + self.vllm_share * card

    def describe(self, card: float | None) -> str:
        shown = [f"{what} {v:.1f}" for what, v in self.parts if v >= 0.05]
        if self.vllm_share and card:
            shown.insert(0, f"vLLM {self.vllm_share:g} x {card:.0f} = {self.vllm_share * card:.1f}")
        return "; ".join([", ".join(shown) or "nothing resident", *self.notes])


def model_of(cfg: Any, role: str) -> Any:
    return cfg.critic.model if role == "critic" else cfg.actor_rollout_ref.model


def micro_batch_tokens(cfg: Any, role: str, update: bool, n_gpus: int) -> int:
    arr, critic = cfg.actor_rollout_ref, cfg.critic
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    owner = critic if role == "critic" else arr.actor
    prompts = (owner.ppo_mini_batch_size if update else cfg.data.train_batch_size) * arr.rollout.n
    if role == "critic":  # the legacy trainer reads the update budget, v1 the infer one
        legacy = update and not cfg.trainer.get("use_v1", True)
        budget = (critic.ppo_max_token_len_per_gpu if legacy else None) or critic.get(
            "ppo_infer_max_token_len_per_gpu", 32768)  # fmt: skip
        dynamic, micro = critic.use_dynamic_bsz, critic.ppo_micro_batch_size_per_gpu
    elif update:
        dynamic, budget = arr.actor.use_dynamic_bsz, arr.actor.ppo_max_token_len_per_gpu
        micro = arr.actor.ppo_micro_batch_size_per_gpu
    else:  # log-probs of the actor (old, or as the LoRA reference) or of the reference
        node = arr.ref if role == "reference" else arr.rollout
        dynamic = node.get("log_prob_use_dynamic_bsz", arr.actor.use_dynamic_bsz)
        budget, micro = node.log_prob_max_token_len_per_gpu, node.log_prob_micro_batch_size_per_gpu
    padding = 1.0 if model_of(cfg, role).get("use_remove_padding") else SDPA_PADDING_FACTOR
    tokens = budget * padding if dynamic else int(micro or 1) * seq
    return min(int(tokens), -(-prompts // n_gpus) * seq)


def activations(cfg: Any, role: str, c: Any, update: bool, n_gpus: int, e: Engine,
                entropy: bool) -> float:  # fmt: skip
    tokens, model = micro_batch_tokens(cfg, role, update, n_gpus), model_of(cfg, role)
    rmpad, compute = bool(model.get("use_remove_padding", False)), e.compute_bytes
    if update:  # flash-attn's cross entropy: packed rows with the flash_attn package (fa2)
        flash_ce = rmpad and attention(model) == "flash_attention_2"
        return update_pass(c, tokens, compute, role != "critic", rmpad, flash_ce) / GIB
    if role == "critic":
        return value_pass(c, tokens, compute) / GIB
    return logprob_pass(c, tokens, compute, entropy, rmpad, e.compiled) / GIB


def update_peak(e: Engine, c: Any, lora: bool, acts: float, step: float | None = None) -> float:
    if e.host:
        return acts
    embedding = embedding_backward(c, e.weight_bytes, e.role != "critic" and not lora) / GIB
    step = adam_step(e.trained, 0.0, foreach=True) if step is None else step
    return max(acts, e.trained + step, e.trained + embedding)


def estimate_phases(cfg: Any, hf_configs: dict[str, Any]) -> list[Phase]:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    n_gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    rollout = cfg.actor_rollout_ref.rollout
    lora, ref = lora_rank(cfg.actor_rollout_ref.model) > 0, need_reference_policy(cfg)
    models = dict(actor=hf_configs["actor"], reference=hf_configs["actor"],
                  critic=hf_configs.get("critic", hf_configs["actor"]))  # fmt: skip
    roles = ["actor"] + ["critic"] * need_critic(cfg) + ["reference"] * (ref and not lora)
    engines = {role: engine_of(cfg, role, models[role], n_gpus) for role in roles}
    asleep = VLLM_ASLEEP_GIB[0] + VLLM_ASLEEP_GIB[1] * (not rollout.get("enforce_eager", False))
    sleeps = bool(rollout.free_cache_engine)

    def phase(name: str, role: str | None, update: bool = False, label: str = "") -> Phase:
        parts, notes = [], []
        if role is not None:
            e, label = engines[role], label or role
            acts = activations(cfg, role, models[role], update, n_gpus, e, name == "old log-prob")
            if update:  # weights + Adam moments; the peak holds the gradients
                peak = update_peak(e, models[role], lora, acts)
                parts = [(f"{label} weights+Adam", e.update() - (0.0 if e.host else e.trained)),
                         (f"{label} working copy", e.working),
                         (f"{label} activations or gradients+Adam step", peak)]  # fmt: skip
            else:
                parts = [(f"{label} states", e.forward()), (f"{label} working copy", e.working),
                         (f"{label} activations", acts)]  # fmt: skip
            notes += [f"{label} states in host memory ({e.host})"] if e.host else []
            parts += [("vLLM asleep (context, CUDA graphs)", asleep)] if sleeps else []
        for other, e in engines.items():
            flags = [k for k in ("param_offload", "optimizer_offload") if getattr(e, k)]
            parts += [(f"{other} resting", e.resting())] if other != role else []
            if other != role and e.resting() == 0:
                notes.append(f"{other} in host memory ({e.host or ', '.join(flags)})")
        share = 0.0 if role is not None and sleeps else rollout.gpu_memory_utilization
        return Phase(name, parts, share, notes)

    phases = [phase("rollout", None), phase("old log-prob", "actor")]
    if ref:  # a LoRA actor without its adapter is the reference
        phases.append(phase("reference", "actor", label="actor without adapter") if lora
                      else phase("reference", "reference"))  # fmt: skip
    if "critic" in engines:
        phases += [phase("critic values", "critic"), phase("critic update", "critic", True)]
    return [*phases, phase("actor update", "actor", True)]


OFFLOAD_KEYS = {"actor": "actor_rollout_ref.actor.fsdp_config", "critic": "critic.fsdp"}


def fixes(phase: Phase, cfg: Any) -> list[str]:
    """Overrides that lower ``phase``."""
    if phase.name == "rollout":
        roles = [what.split()[0] for what, v in phase.parts if v > 0]
        return ["actor_rollout_ref.rollout.gpu_memory_utilization=N (ROLLOUT_GPU_MEM_UTIL)"] + [
            f"{OFFLOAD_KEYS[role]}.{key}=True" for role in roles if role in OFFLOAD_KEYS
            for key in ("param_offload", "optimizer_offload")]  # fmt: skip
    role = "actor" if phase.name == "old log-prob" else phase.name.split()[0]
    if role == "critic":  # the budget micro_batch_tokens reads
        v1 = cfg.trainer.get("use_v1", True) or phase.name == "critic values"
        key = f"critic.ppo_{'infer_' if v1 else ''}max_token_len_per_gpu"
    elif phase.name == "actor update":
        key = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    else:
        actor = lora_rank(cfg.actor_rollout_ref.model) > 0 or phase.name == "old log-prob"
        key = f"actor_rollout_ref.{'rollout' if actor else 'ref'}.log_prob_max_token_len_per_gpu"
    offload = [f"{OFFLOAD_KEYS[role]}.offload_policy=True"] if role in OFFLOAD_KEYS else []
    return [*offload, f"{key}=N"]


def check_memory(cfg: Any, hf_configs: dict[str, Any], card: float | None, report: Any) -> None:
    for phase in estimate_phases(cfg, hf_configs):
        total = phase.gib(card or 0.0)
        if card is None:
            share = f" + vLLM's {phase.vllm_share:g} of the card" if phase.vllm_share else ""
            report.note("memory", f"{phase.name}: ~{total:.1f} GiB{share} per GPU ("
                        f"{phase.describe(None)}); the card is not known here")  # fmt: skip
            continue
        line = f"{phase.name}: ~{total:.1f} GiB of {card:.0f} GiB per GPU ({phase.describe(card)})"
        fix = f"try {', '.join(fixes(phase, cfg))}"
        if total > card:
            report.error("memory", f"{line}: does not fit; {fix}")
        elif total > MEMORY_WARN_FRACTION * card:
            report.warn("memory", f"{line}: above {MEMORY_WARN_FRACTION:.0%} of the card; {fix}")
        else:
            report.ok("memory", line)


BUDGET_KEYS = ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
               "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
               "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
               "critic.ppo_max_token_len_per_gpu",
               "critic.ppo_infer_max_token_len_per_gpu")  # fmt: skip
SMALLEST_BUDGET = 1024  # below this a GSM8K prompt and its answer (768 tokens) barely fit


def with_budget(cfg: Any, budget: int) -> Any:
    from omegaconf import OmegaConf

    cfg = cfg.copy()
    for key in BUDGET_KEYS:
        OmegaConf.update(cfg, key, budget, force_add=True)
    return cfg


def heaviest(cfg: Any, hf_configs: dict[str, Any], card: float) -> Phase:
    return max(estimate_phases(cfg, hf_configs), key=lambda p: p.gib(card))


def choose_budget(cfg: Any, hf_configs: dict, card: float, out: Path, report: Any) -> Any:
    """Write the fitting budget's overrides to ``out`` (or nothing); ``cfg`` at it."""
    write_atomic(out, "")
    if not cfg.actor_rollout_ref.actor.get("use_dynamic_bsz", False):
        return cfg  # micro-batches counted in sequences: the budgets do not apply
    top, limit = heaviest(cfg, hf_configs, card), MEMORY_WARN_FRACTION * card
    if top.gib(card) <= limit:
        return cfg
    recipe = int(cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu)
    need = (f"the recipe's {recipe} tokens per micro-batch need ~{top.gib(card):.1f} GiB "
            f"({top.name}) of this {card:.0f} GiB card")  # fmt: skip
    budget = recipe // 2
    while budget >= SMALLEST_BUDGET and heaviest(with_budget(cfg, budget), hf_configs,
                                                 card).gib(card) > limit:  # fmt: skip
        budget //= 2
    if budget < SMALLEST_BUDGET:
        report.note("budget", f"{need}, and no budget down to {SMALLEST_BUDGET} fits: kept")
        return cfg
    report.ok("budget", f"{need}: using {budget}, the largest power of two that fits "
              f"(TOKEN_BUDGET=recipe keeps {recipe})")  # fmt: skip
    write_atomic(out, "".join(f"{key}={budget}\n" for key in BUDGET_KEYS))
    return with_budget(cfg, budget)

"""GPU memory per phase of a PPO step, each model's states where verl 0.9.1 keeps them
(verl/workers/engine/fsdp/transformer_impl.py, verl/workers/engine/base.py; docs/gpu.md):

* host memory for good: a ``forward_only`` engine (the reference) and, with FSDP2,
  ``offload_policy`` (CPUOffloadPolicy; the optimizer steps on the CPU);
* ``param_offload``/``optimizer_offload`` park states in host memory only between phases: an
  update brings weights, gradients and (with optimizer_offload) Adam's moments back, a forward
  pass the weights;
* otherwise weights and Adam moments stay on the GPU; gradients exist during an update only.
Weights and moments are in ``model_dtype``; FSDP gathers units in the compute dtype. vLLM holds
``gpu_memory_utilization`` of the card while it generates; asleep, its context and CUDA graphs.
A pass's activations (activations.py) are counted for its largest micro-batch. CUDA contexts and
fragmentation are not counted: the margin below the card is for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl_gsm8k.preflight import activations as act
from verl_gsm8k.preflight.device import attention as model_attention
from verl_gsm8k.preflight.device import lora_rank
from verl_gsm8k.preflight.model import count_parameters

GIB = 1024**3
MEMORY_WARN_FRACTION = 0.9  # above this share of the card a warning; above the card an error
UNITS_IN_FLIGHT = 2  # FSDP units gathered besides the root: the one computing, the one prefetched
# A sleeping vLLM keeps its CUDA context and, unless enforce_eager, its captured CUDA graphs
# (estimates, not measured: docs/gpu.md).
VLLM_ASLEEP_CONTEXT_GIB = 0.5
VLLM_ASLEEP_GRAPHS_GIB = 1.0
# Without padding removal a dynamic micro-batch is padded to its longest sequence: the upper end
# of 1.5-2x at GSM8K lengths over the budget, which counts real tokens (docs/gpu.md).
SDPA_PADDING_FACTOR = 2.0


def dtype_bytes(name: str | None, default: int) -> int:
    """Bytes per element of a verl precision name (fp32, bf16, ...); ``default`` for None."""
    from verl.utils.torch_dtypes import PrecisionType

    return default if name is None else PrecisionType.to_dtype(name).itemsize


def lora_parameters(hf_config: Any, rank: int, target_modules: Any) -> int:
    """Adapter parameters PEFT adds: rank x (in + out) per targeted linear layer."""
    h, inter = hf_config.hidden_size, hf_config.intermediate_size
    heads = hf_config.num_attention_heads
    kv = getattr(hf_config, "num_key_value_heads", heads)
    head_dim = getattr(hf_config, "head_dim", None) or h // heads
    sizes = {
        "q_proj": h + heads * head_dim,
        "k_proj": h + kv * head_dim,
        "v_proj": h + kv * head_dim,
        "o_proj": heads * head_dim + h,
        "gate_proj": h + inter,
        "up_proj": h + inter,
        "down_proj": inter + h,
    }
    if isinstance(target_modules, str):
        target_modules = list(sizes) if target_modules == "all-linear" else [target_modules]
    names = {str(name) for name in target_modules or []}
    return rank * sum(n for name, n in sizes.items() if name in names) * hf_config.num_hidden_layers


@dataclass(frozen=True)
class Engine:
    """One FSDP engine's states per GPU (GiB) and where verl keeps them."""

    role: str
    host: str  # why its states never leave host memory ("" when they do)
    param_offload: bool
    optimizer_offload: bool
    weights: float  # every weight, in model_dtype
    trained: float  # the trained weights (all, or a LoRA model's adapters), in model_dtype
    working: float = 0.0  # units gathered to compute, unsharded, in the compute dtype
    dtype: str = "fp32"  # model_dtype
    compute_bytes: int = 2  # FSDP's mixed_precision.param_dtype
    compiled: bool = True  # use_torch_compile: verl compiles the entropy with padding removal
    weight_bytes: int = 4  # model_dtype's (weights, gradients, Adam moments)

    def resting(self) -> float:
        """On the GPU while another engine or vLLM works."""
        moments = 2 * self.trained * (not self.optimizer_offload)
        return 0.0 if self.host else self.weights * (not self.param_offload) + moments

    def forward(self) -> float:
        """On the GPU in its own forward pass (eval_mode), the working copy aside."""
        return 0.0 if self.host else self.weights + 2 * self.trained * (not self.optimizer_offload)

    def update(self) -> float:
        """On the GPU in its update (train_mode): weights, gradients, Adam moments."""
        return 0.0 if self.host else self.weights + 3 * self.trained


def engine_of(cfg: Any, role: str, hf_config: Any, n_gpus: int) -> Engine:
    """The engine verl builds for ``role`` (actor, reference, critic) from the composed config:
    verl's FSDPEngineConfig, its strategy the role's (as verl's role configs set it)."""
    from verl.utils.config import omega_conf_to_dataclass

    arr = cfg.actor_rollout_ref
    node, strategy, model = {
        "actor": (arr.actor.fsdp_config, arr.actor.strategy, arr.model),
        "reference": (arr.ref.fsdp_config, arr.ref.strategy, arr.model),
        "critic": (cfg.critic.fsdp, cfg.critic.strategy, cfg.critic.model),
    }[role]
    engine = omega_conf_to_dataclass(node)
    host = (
        "forward_only: FSDP's CPU offload"
        if engine.forward_only
        else "offload_policy: CPUOffloadPolicy"
        if strategy == "fsdp2" and engine.offload_policy
        else ""
    )
    vocab_h = hf_config.vocab_size * hf_config.hidden_size
    tied = getattr(hf_config, "tie_word_embeddings", False)
    params = all_params = count_parameters(hf_config)
    if role == "critic":  # a token classifier: the backbone and a 1-wide head, no LM head
        params += hf_config.hidden_size + 1 - vocab_h * (not tied)
    rank = lora_rank(model) if role != "critic" else 0
    adapters = lora_parameters(hf_config, rank, model.get("target_modules")) if rank else 0
    weight = dtype_bytes(engine.model_dtype, 4)
    compute = dtype_bytes((engine.mixed_precision or {}).get("param_dtype"), 2)
    root = vocab_h * (1 if tied else 2)
    layer = (all_params - root) / hf_config.num_hidden_layers
    return Engine(
        role,
        host,
        bool(engine.param_offload) and not host,
        bool(engine.optimizer_offload) and not host,
        weights=(params + adapters) * weight / n_gpus / GIB,
        trained=0 if engine.forward_only else (adapters or params) * weight / n_gpus / GIB,
        working=(root + UNITS_IN_FLIGHT * layer) * compute / GIB,
        dtype=str(engine.model_dtype),
        compute_bytes=compute,
        compiled=bool(engine.use_torch_compile),
        weight_bytes=weight,
    )


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


def remove_padding(cfg: Any, role: str) -> bool:
    """Whether ``role`` runs packed rows (padding removal) rather than padded micro-batches."""
    return bool(model_of(cfg, role).get("use_remove_padding", False))


def attention(cfg: Any, role: str) -> str:
    return model_attention(model_of(cfg, role))


def micro_batch_tokens(cfg: Any, role: str, update: bool, n_gpus: int) -> int:
    """Tokens of the largest micro-batch a pass computes, every response at max length."""
    arr = cfg.actor_rollout_ref
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    owner = cfg.critic if role == "critic" else arr.actor
    prompts = (owner.ppo_mini_batch_size if update else cfg.data.train_batch_size) * arr.rollout.n
    if role == "critic":
        dynamic, micro = cfg.critic.use_dynamic_bsz, cfg.critic.ppo_micro_batch_size_per_gpu
        legacy = update and not cfg.trainer.get("use_v1", True)  # it reads the update budget
        budget = cfg.critic.ppo_max_token_len_per_gpu if legacy else None
        budget = budget or cfg.critic.get("ppo_infer_max_token_len_per_gpu", 32768)
    elif update:
        dynamic, budget = arr.actor.use_dynamic_bsz, arr.actor.ppo_max_token_len_per_gpu
        micro = arr.actor.ppo_micro_batch_size_per_gpu
    else:  # log-probs of the actor (old, or as the LoRA reference) or of the reference
        node = arr.ref if role == "reference" else arr.rollout
        dynamic = node.get("log_prob_use_dynamic_bsz", arr.actor.use_dynamic_bsz)
        budget, micro = node.log_prob_max_token_len_per_gpu, node.log_prob_micro_batch_size_per_gpu
    per_gpu = -(-prompts // n_gpus) * seq
    if dynamic:  # the budget counts real tokens; padded to the longest sequence without rmpad
        return min(
            int(budget * (1.0 if remove_padding(cfg, role) else SDPA_PADDING_FACTOR)), per_gpu
        )
    return min(int(micro or 1) * seq, per_gpu)


def activations(
    cfg: Any, role: str, hf_config: Any, update: bool, n_gpus: int, e: Engine, entropy: bool
) -> float:
    """GiB a pass of ``role``'s largest micro-batch holds beyond the states (activations.py)."""
    tokens = micro_batch_tokens(cfg, role, update, n_gpus)
    rmpad, compute = remove_padding(cfg, role), e.compute_bytes
    if update:  # flash-attn's cross entropy: packed rows with the flash_attn package (fa2)
        flash_ce = rmpad and attention(cfg, role) == "flash_attention_2"
        return act.update_pass(hf_config, tokens, compute, role != "critic", rmpad, flash_ce) / GIB
    if role == "critic":
        return act.value_pass(hf_config, tokens, compute) / GIB
    return act.logprob_pass(hf_config, tokens, compute, entropy, rmpad, e.compiled) / GIB


def update_peak(
    e: Engine, hf_config: Any, lora: bool, acts: float, step: float | None = None
) -> float:
    """GiB beyond weights and Adam moments at an update's peak: its backward's activations, or
    the complete gradients with Adam's step (``step``, GiB; CUDA's multi-tensor one by default)
    or a tied embedding's summed gradient."""
    if e.host:
        return acts
    embedding = act.embedding_backward(hf_config, e.weight_bytes, e.role != "critic" and not lora)
    step = act.adam_step(e.trained, 0.0, foreach=True) if step is None else step
    return max(acts, e.trained + step, e.trained + embedding / GIB)


def estimate_phases(cfg: Any, hf_configs: dict[str, Any]) -> list[Phase]:
    """Per-GPU memory of each phase of a PPO step (``hf_configs``: role -> model config; the
    critic's defaults to the actor's)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    n_gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    arr = cfg.actor_rollout_ref
    lora = lora_rank(arr.model) > 0
    models = {
        "actor": hf_configs["actor"],
        "reference": hf_configs["actor"],
        "critic": hf_configs.get("critic", hf_configs["actor"]),
    }
    roles = ["actor"] + ["critic"] * need_critic(cfg)
    roles += ["reference"] * (need_reference_policy(cfg) and not lora)  # LoRA: the bare actor
    engines = {role: engine_of(cfg, role, models[role], n_gpus) for role in roles}
    sleeps = bool(arr.rollout.free_cache_engine)
    graphs = 0.0 if arr.rollout.get("enforce_eager", False) else VLLM_ASLEEP_GRAPHS_GIB
    asleep = VLLM_ASLEEP_CONTEXT_GIB + graphs

    def phase(name: str, role: str | None, update: bool = False, label: str = "") -> Phase:
        parts, notes = [], []
        if role is not None:
            e, label = engines[role], label or role
            acts = activations(cfg, role, models[role], update, n_gpus, e, name == "old log-prob")
            if update:  # weights + Adam moments; the peak holds the gradients
                parts = [
                    (f"{label} weights+Adam", e.update() - (0.0 if e.host else e.trained)),
                    (f"{label} working copy", e.working),
                    (
                        f"{label} activations or gradients+Adam step",
                        update_peak(e, models[role], lora, acts),
                    ),
                ]
            else:
                parts = [
                    (f"{label} states", e.forward()),
                    (f"{label} working copy", e.working),
                    (f"{label} activations", acts),
                ]
            notes += [f"{label} states in host memory ({e.host})"] if e.host else []
            parts += [("vLLM asleep (context, CUDA graphs)", asleep)] if sleeps else []
        for other, e in engines.items():
            if other != role:
                parts.append((f"{other} resting", e.resting()))
                flags = [k for k in ("param_offload", "optimizer_offload") if getattr(e, k)]
                if e.resting() == 0:
                    notes.append(f"{other} in host memory ({e.host or ', '.join(flags)})")
        share = 0.0 if role is not None and sleeps else arr.rollout.gpu_memory_utilization
        return Phase(name, parts, share, notes)

    phases = [phase("rollout", None), phase("old log-prob", "actor")]
    if need_reference_policy(cfg):
        role, label = ("actor", "actor without adapter") if lora else ("reference", "")
        phases.append(phase("reference", role, label=label))
    if "critic" in engines:
        phases += [phase("critic values", "critic"), phase("critic update", "critic", True)]
    return [*phases, phase("actor update", "actor", True)]


# The settings that lower a phase, printed as overrides (each composes: tests/test_memory.py).
OFFLOAD_KEYS = {"actor": "actor_rollout_ref.actor.fsdp_config", "critic": "critic.fsdp"}


def budget_key(cfg: Any, phase: str) -> str:
    """The token budget of the largest micro-batch of ``phase`` (micro_batch_tokens)."""
    if phase.startswith("critic"):
        v1 = cfg.trainer.get("use_v1", True) or phase == "critic values"
        return f"critic.{'ppo_infer_max_token_len_per_gpu' if v1 else 'ppo_max_token_len_per_gpu'}"
    if phase == "actor update":
        return "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    actor = lora_rank(cfg.actor_rollout_ref.model) > 0 or phase == "old log-prob"
    return f"actor_rollout_ref.{'rollout' if actor else 'ref'}.log_prob_max_token_len_per_gpu"


def fixes(phase: Phase, cfg: Any) -> list[str]:
    """Overrides that lower ``phase`` (values to choose shown as N)."""
    if phase.name == "rollout":
        roles = [what.split()[0] for what, v in phase.parts if v > 0]
        return ["actor_rollout_ref.rollout.gpu_memory_utilization=N (ROLLOUT_GPU_MEM_UTIL)"] + [
            f"{OFFLOAD_KEYS[role]}.{key}=True"
            for role in roles
            if role in OFFLOAD_KEYS
            for key in ("param_offload", "optimizer_offload")
        ]
    role = "actor" if phase.name == "old log-prob" else phase.name.split()[0]
    keys = [f"{OFFLOAD_KEYS[role]}.offload_policy=True"] if role in OFFLOAD_KEYS else []
    return [*keys, f"{budget_key(cfg, phase.name)}=N"]


def check_memory(cfg: Any, hf_configs: dict[str, Any], card: float | None, report: Any) -> None:
    """One line per phase; a phase above the card stops the launch, above 90 % of it warns.
    ``card``: GiB of one GPU, None when not known here (the figures are then notes)."""
    for phase in estimate_phases(cfg, hf_configs):
        if card is None:
            share = f" + vLLM's {phase.vllm_share:g} of the card" if phase.vllm_share else ""
            what = f"{phase.name}: ~{phase.gib(0.0):.1f} GiB{share} per GPU"
            report.note(
                "memory", f"{what} ({phase.describe(None)}); the card's memory is not known here"
            )
            continue
        total = phase.gib(card)
        line = f"{phase.name}: ~{total:.1f} GiB of {card:.0f} GiB per GPU ({phase.describe(card)})"
        if total > card:
            report.error("memory", f"{line}: does not fit; try {', '.join(fixes(phase, cfg))}")
        elif total > MEMORY_WARN_FRACTION * card:
            tight = f"above {MEMORY_WARN_FRACTION:.0%} of the card (CUDA contexts, fragmentation)"
            report.warn("memory", f"{line}: {tight}; try {', '.join(fixes(phase, cfg))}")
        else:
            report.ok("memory", line)

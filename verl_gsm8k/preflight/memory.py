"""GPU memory per phase of a PPO step, with each model's states where verl 0.9.1 keeps them.

What verl does with the offload settings (verl/workers/engine/fsdp/transformer_impl.py,
verl/workers/engine/base.py), which the estimate follows:

* ``forward_only`` engines (the reference; ``ref/dp_ref.yaml`` sets it) and, with FSDP2,
  ``offload_policy: true`` get ``CPUOffloadPolicy`` (~458-463; FSDP1: ``CPUOffload`` for
  ``forward_only`` only, ~432): sharded weights, gradients and Adam moments live in host memory
  for good and the optimizer steps on the CPU. The GPU holds the units FSDP gathers to compute.
  Such an engine's ``param_offload``/``optimizer_offload`` are switched off (~460).
* ``param_offload`` / ``optimizer_offload`` move states to host memory only *between* phases:
  entering an update (``train_mode``) brings weights, gradients and, with
  ``optimizer_offload``, the Adam moments back (``BaseEngineCtx._context_switch``, base.py
  ~315-328); entering a forward pass (``eval_mode``) brings the weights back.
* Neither: weights and Adam moments stay on the GPU all the time; gradients exist during the
  update only (zeroed, i.e. freed, when it ends).
* Weights are built in ``model_dtype`` (``fp32`` by default, reference included: ~258-264); a
  LoRA model's frozen base is held in that dtype too, its adapters cast to it (~370-380); Adam
  keeps two moments in the weights' dtype. FSDP computes in ``mixed_precision.param_dtype``
  (bf16 by default, ~391-399), so each unit it gathers is an unsharded copy in that dtype.
* vLLM holds ``gpu_memory_utilization`` of the card while it generates and, with
  ``free_cache_engine`` (sleep mode), gives it back while the models train.

* vLLM asleep still holds its CUDA context and, unless ``enforce_eager``, its captured CUDA
  graphs (verl's rollout.yaml: "cudagraph in inference engine can not be offloaded during update
  policy"): VLLM_ASLEEP_* below.

Phases, in the order of a step: rollout (vLLM awake), old log-prob (the actor's log-probs of
the rollout, with the entropy verl always computes there: v1 trainer_base.py ~1653, legacy
ray_trainer.py ~1300), reference (its log-probs; with a LoRA actor, the actor without its
adapter), critic values, critic update, actor update. Each adds what the phase's engine brings
to the GPU to what every other engine keeps there. What a pass holds beyond the states
(activations.py) is counted for its largest micro-batch; without padding removal (the sdpa
overlay) a dynamic micro-batch is padded to its longest sequence, SDPA_PADDING_FACTOR. An
update peaks either early in its backward (activations) or once the gradients are complete (Adam
step, a tied embedding's summed gradient); the phase shows the larger. CUDA contexts of the
training processes and allocator fragmentation are not counted, which is what the margin below
the card is for. Measured against torch's tensor-bytes tracker: tests/test_memory_measured.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl_gsm8k.preflight import activations as act
from verl_gsm8k.preflight.device import lora_rank
from verl_gsm8k.preflight.model import count_parameters

GIB = 1024**3
# Above this share of the card an estimate warns; above the card it stops the launch.
MEMORY_WARN_FRACTION = 0.9
# Units FSDP has gathered at once besides the root (embeddings, head): the one computing and the
# one prefetched.
UNITS_IN_FLIGHT = 2
# A sleeping vLLM (free_cache_engine) frees its weights and KV cache, not its CUDA context nor
# its captured CUDA graphs (verl's rollout/rollout.yaml, cudagraph_capture_sizes' comment: the
# graphs cannot be offloaded). The context: a CUDA context with cuBLAS/NCCL workspaces; the
# graphs: vLLM's default capture sizes for a small model. Estimates, not measured (docs/gpu.md,
# "Memory per phase, measured on the CPU": what the estimate counts and cannot see).
VLLM_ASLEEP_CONTEXT_GIB = 0.5
VLLM_ASLEEP_GRAPHS_GIB = 1.0  # 0 with enforce_eager (no graphs)
# Without padding removal (sdpa, no flash-attn) a micro-batch is padded to its longest
# sequence: tokens computed over the dynamic budget, which counts real tokens. About 1.5-2x at
# GSM8K lengths (an estimate, not measured: docs/gpu.md, "Memory per phase, measured on the
# CPU"); the upper end, since the preflight decides whether a run fits.
SDPA_PADDING_FACTOR = 2.0


def dtype_bytes(name: str | None, default: int) -> int:
    """Bytes per element of a verl precision name (fp32, bf16, ...); ``default`` for None."""
    if name is None:
        return default
    from verl.utils.torch_dtypes import PrecisionType

    return PrecisionType.to_dtype(name).itemsize


def layer_linears(hf_config: Any) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of one decoder layer (Qwen2/Llama shapes)."""
    h = hf_config.hidden_size
    heads = hf_config.num_attention_heads
    kv = getattr(hf_config, "num_key_value_heads", heads)
    head_dim = getattr(hf_config, "head_dim", None) or h // heads
    inter = hf_config.intermediate_size
    return {
        "q_proj": (h, heads * head_dim),
        "k_proj": (h, kv * head_dim),
        "v_proj": (h, kv * head_dim),
        "o_proj": (heads * head_dim, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }


def lora_parameters(hf_config: Any, rank: int, target_modules: Any) -> int:
    """Adapter parameters PEFT adds: rank x (in + out) per targeted linear layer."""
    linears = layer_linears(hf_config)
    if isinstance(target_modules, str):
        names = list(linears) if target_modules == "all-linear" else [target_modules]
    else:
        names = [str(name) for name in target_modules or []]
    per_layer = sum(rank * (i + o) for name, (i, o) in linears.items() if name in names)
    return per_layer * hf_config.num_hidden_layers


@dataclass(frozen=True)
class Engine:
    """One FSDP engine's states per GPU (GiB) and where verl keeps them."""

    role: str
    host: str  # why its states never leave host memory ("" when they do)
    param_offload: bool
    optimizer_offload: bool
    weights: float  # every weight, in model_dtype
    trained: float  # the trained weights (all, or a LoRA model's adapters), in model_dtype
    working: float  # units gathered to compute, unsharded, in the compute dtype
    dtype: str  # model_dtype, for the line
    compute_bytes: int = 2  # bytes of the compute dtype (FSDP's mixed_precision.param_dtype)
    compiled: bool = True  # use_torch_compile: verl compiles the entropy with padding removal
    weight_bytes: int = 4  # bytes of model_dtype (weights, gradients, Adam moments)

    def resting(self) -> float:
        """On the GPU while another engine or vLLM works."""
        if self.host:
            return 0.0
        weights = 0.0 if self.param_offload else self.weights
        return weights + (0.0 if self.optimizer_offload else 2 * self.trained)

    def forward(self) -> float:
        """States on the GPU during its own forward pass (eval_mode), working copy aside."""
        if self.host:
            return 0.0
        return self.weights + (0.0 if self.optimizer_offload else 2 * self.trained)

    def update(self) -> float:
        """States on the GPU during its update (train_mode): weights, gradients, Adam moments."""
        return 0.0 if self.host else self.weights + 3 * self.trained

    def adam_step(self) -> float:
        """Adam's temporaries at its step on the GPU (CUDA's multi-tensor step); the CPU steps a
        host engine's."""
        return 0.0 if self.host else act.adam_step(self.trained, 0.0, foreach=True)


def engine_of(cfg: Any, role: str, hf_config: Any, n_gpus: int) -> Engine:
    """The engine verl builds for ``role`` (actor, reference, critic) from the composed config:
    verl's own FSDPEngineConfig, its strategy taken from the role (as FSDPActorConfig and
    FSDPCriticConfig do when they are built)."""
    from verl.utils.config import omega_conf_to_dataclass

    node, strategy, model = {
        "actor": (cfg.actor_rollout_ref.actor.fsdp_config, cfg.actor_rollout_ref.actor.strategy,
                  cfg.actor_rollout_ref.model),
        "reference": (cfg.actor_rollout_ref.ref.fsdp_config, cfg.actor_rollout_ref.ref.strategy,
                      cfg.actor_rollout_ref.model),
        "critic": (cfg.critic.fsdp, cfg.critic.strategy, cfg.critic.model),
    }[role]  # fmt: skip
    engine = omega_conf_to_dataclass(node)
    if engine.forward_only:
        host = "forward_only: FSDP's CPU offload"
    elif strategy == "fsdp2" and engine.offload_policy:
        host = "offload_policy: CPUOffloadPolicy"
    else:
        host = ""
    params = count_parameters(hf_config)
    if role == "critic":  # a token classifier: the backbone and a 1-wide head, no LM head
        untied = not getattr(hf_config, "tie_word_embeddings", False)
        params += (
            hf_config.hidden_size + 1 - (hf_config.vocab_size * hf_config.hidden_size) * untied
        )
    rank = lora_rank(model) if role != "critic" else 0
    adapters = lora_parameters(hf_config, rank, model.get("target_modules")) if rank else 0
    weight = dtype_bytes(engine.model_dtype, 4)
    compute = dtype_bytes((engine.mixed_precision or {}).get("param_dtype"), 2)
    trained = 0 if engine.forward_only else (adapters or params)
    vocab_h = hf_config.vocab_size * hf_config.hidden_size
    root = vocab_h * (1 if getattr(hf_config, "tie_word_embeddings", False) else 2)
    layer = (count_parameters(hf_config) - root) / hf_config.num_hidden_layers
    return Engine(
        role=role,
        host=host,
        param_offload=bool(engine.param_offload) and not host,
        optimizer_offload=bool(engine.optimizer_offload) and not host,
        weights=(params + adapters) * weight / n_gpus / GIB,
        trained=trained * weight / n_gpus / GIB,
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
        return "; ".join([", ".join(shown) or "nothing resident"] + self.notes)


def micro_batch_tokens(cfg: Any, role: str, update: bool, n_gpus: int) -> int:
    """Tokens of the largest micro-batch a pass computes, every response at max length."""
    arr = cfg.actor_rollout_ref
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    n = arr.rollout.n
    owner = cfg.critic if role == "critic" else arr.actor
    prompts = (owner.ppo_mini_batch_size if update else cfg.data.train_batch_size) * n
    if role == "critic":
        dynamic = cfg.critic.use_dynamic_bsz
        v1 = cfg.trainer.get("use_v1", True)  # the legacy trainer reads the update budget
        budget = cfg.critic.ppo_max_token_len_per_gpu if update and not v1 else None
        budget = budget or cfg.critic.get("ppo_infer_max_token_len_per_gpu", 32768)
        micro = cfg.critic.ppo_micro_batch_size_per_gpu
    elif role == "actor" and update:
        dynamic, budget = arr.actor.use_dynamic_bsz, arr.actor.ppo_max_token_len_per_gpu
        micro = arr.actor.ppo_micro_batch_size_per_gpu
    else:  # log-probs of the actor (old, or as the LoRA reference) or of the reference
        node = arr.ref if role == "reference" else arr.rollout
        dynamic = node.get("log_prob_use_dynamic_bsz", arr.actor.use_dynamic_bsz)
        budget = node.log_prob_max_token_len_per_gpu
        micro = node.log_prob_micro_batch_size_per_gpu
    per_gpu = -(-prompts // n_gpus) * seq
    if dynamic:  # the budget counts real tokens; padded to the longest sequence without rmpad
        padding = 1.0 if remove_padding(cfg, role) else SDPA_PADDING_FACTOR
        return min(int(budget * padding), per_gpu)
    return min(int(micro or 1) * seq, per_gpu)


def remove_padding(cfg: Any, role: str) -> bool:
    """Whether ``role``'s model runs with padding removal (packed rows: flash-attn's varlen
    kernels, or sdpa's block-diagonal mask), or padded micro-batches."""
    model = cfg.critic.model if role == "critic" else cfg.actor_rollout_ref.model
    return bool(model.get("use_remove_padding", False))


def attention(cfg: Any, role: str) -> str:
    """``role``'s attention implementation (verl's default: flash_attention_2)."""
    model = cfg.critic.model if role == "critic" else cfg.actor_rollout_ref.model
    override = model.get("override_config", None) or {}
    return str(override.get("attn_implementation", None) or "flash_attention_2")


def flash_cross_entropy(cfg: Any, role: str) -> bool:
    """Whether verl's log-probs take flash-attn's in-place cross entropy: with padding removal
    where the flash_attn (2.x) package is there, i.e. where the run uses flash_attention_2 (the
    launcher picks sdpa exactly where flash-attn cannot be used)."""
    return remove_padding(cfg, role) and attention(cfg, role) == "flash_attention_2"


def activations(
    cfg: Any, role: str, hf_config: Any, update: bool, n_gpus: int, e: Engine, entropy: bool
) -> float:
    """GiB a pass of ``role``'s largest micro-batch holds beyond the states (activations.py):
    log-probs (with the entropy for the actor's own pass, not the reference's), the critic's
    values, or an update's saved activations and logits gradients."""
    tokens = micro_batch_tokens(cfg, role, update, n_gpus)
    rmpad, compute = remove_padding(cfg, role), e.compute_bytes
    if update:
        flash_ce = flash_cross_entropy(cfg, role)
        return act.update_pass(hf_config, tokens, compute, role != "critic", rmpad, flash_ce) / GIB
    if role == "critic":
        return act.value_pass(hf_config, tokens, compute) / GIB
    return act.logprob_pass(hf_config, tokens, compute, entropy, rmpad, e.compiled) / GIB


def update_peak(
    e: Engine, hf_config: Any, lora: bool, acts: float, step: float | None = None
) -> float:
    """GiB beyond weights and Adam moments at an update's peak: its backward's activations, or
    the complete gradients with Adam's step temporaries (``step``, GiB; CUDA's by default) or a
    tied embedding's summed gradient."""
    if e.host:
        return acts
    trained = e.role != "critic" and not lora
    embedding = act.embedding_backward(hf_config, e.weight_bytes, trained) / GIB
    step = e.adam_step() if step is None else step
    return max(acts, e.trained + step, e.trained + embedding)


def estimate_phases(cfg: Any, hf_configs: dict[str, Any]) -> list[Phase]:
    """Per-GPU memory of each phase of a PPO step (``hf_configs``: role -> model config; the
    critic's defaults to the actor's)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    n_gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    arr = cfg.actor_rollout_ref
    lora = lora_rank(arr.model) > 0
    models = {"actor": hf_configs["actor"], "reference": hf_configs["actor"]}
    models["critic"] = hf_configs.get("critic", hf_configs["actor"])
    engines = {"actor": engine_of(cfg, "actor", models["actor"], n_gpus)}
    if need_critic(cfg):
        engines["critic"] = engine_of(cfg, "critic", models["critic"], n_gpus)
    if need_reference_policy(cfg) and not lora:  # a LoRA actor without its adapter is the reference
        engines["reference"] = engine_of(cfg, "reference", models["reference"], n_gpus)
    sleeps = bool(arr.rollout.free_cache_engine)
    asleep = 0.0 if sleeps else arr.rollout.gpu_memory_utilization
    graphs = 0.0 if arr.rollout.get("enforce_eager", False) else VLLM_ASLEEP_GRAPHS_GIB

    def phase(
        name: str, role: str | None, update: bool, label: str = "", entropy: bool = False
    ) -> Phase:
        parts, notes = [], []
        if role is not None:
            e, label = engines[role], label or role
            acts = activations(cfg, role, models[role], update, n_gpus, e, entropy)
            if update:
                states = e.update() - (0.0 if e.host else e.trained)  # weights + Adam moments
                peak = update_peak(e, models[role], lora, acts)
                parts = [(f"{label} weights+Adam", states), (f"{label} working copy", e.working),
                         (f"{label} activations or gradients+Adam step", peak)]  # fmt: skip
            else:
                parts = [(f"{label} states", e.forward()), (f"{label} working copy", e.working),
                         (f"{label} activations", acts)]  # fmt: skip
            notes += [f"{label} states in host memory ({e.host})"] if e.host else []
            if sleeps:
                parts.append(
                    ("vLLM asleep (context, CUDA graphs)", VLLM_ASLEEP_CONTEXT_GIB + graphs)
                )
        for other, e in engines.items():
            if other == role:
                continue
            parts.append((f"{other} resting", e.resting()))
            if e.resting() == 0:
                why = e.host or ", ".join(
                    k for k in ("param_offload", "optimizer_offload") if getattr(e, k)
                )
                notes.append(f"{other} in host memory ({why})")
        share = arr.rollout.gpu_memory_utilization if role is None else asleep
        return Phase(name, parts, share, notes)

    phases = [phase("rollout", None, False), phase("old log-prob", "actor", False, entropy=True)]
    if need_reference_policy(cfg):
        phases.append(
            phase("reference", "actor", False, "actor without adapter")
            if lora
            else phase("reference", "reference", False)
        )
    if "critic" in engines:
        phases.append(phase("critic values", "critic", False))
        phases.append(phase("critic update", "critic", True))
    phases.append(phase("actor update", "actor", True))
    return phases


# The settings that lower a phase, printed as overrides (each composes: tests/test_memory.py).
OFFLOAD_KEYS = {"actor": "actor_rollout_ref.actor.fsdp_config", "critic": "critic.fsdp"}


def budget_key(cfg: Any, phase: str) -> str:
    """The token budget of the largest micro-batch of ``phase`` (micro_batch_tokens)."""
    if phase in ("critic update", "critic values"):
        v1 = cfg.trainer.get("use_v1", True) or phase == "critic values"
        return f"critic.{'ppo_infer_max_token_len_per_gpu' if v1 else 'ppo_max_token_len_per_gpu'}"
    if phase == "actor update":
        return "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    lora = lora_rank(cfg.actor_rollout_ref.model) > 0 or phase == "old log-prob"
    return f"actor_rollout_ref.{'rollout' if lora else 'ref'}.log_prob_max_token_len_per_gpu"


def fixes(phase: Phase, cfg: Any) -> list[str]:
    """Overrides that lower ``phase`` (values to choose shown as N)."""
    if phase.name == "rollout":
        lower = ["actor_rollout_ref.rollout.gpu_memory_utilization=N (ROLLOUT_GPU_MEM_UTIL)"]
        roles = [what.split()[0] for what, v in phase.parts if v > 0]
        return lower + [
            f"{OFFLOAD_KEYS[role]}.{key}=True"
            for role in roles
            if role in OFFLOAD_KEYS
            for key in ("param_offload", "optimizer_offload")
        ]
    role = "actor" if phase.name == "old log-prob" else phase.name.split()[0]
    keys = [f"{OFFLOAD_KEYS[role]}.offload_policy=True"] if role in OFFLOAD_KEYS else []
    return keys + [f"{budget_key(cfg, phase.name)}=N"]


def check_memory(cfg: Any, hf_configs: dict[str, Any], card: float | None, report: Any) -> None:
    """One line per phase; a phase above the card stops the launch, above 90 % of it warns.
    ``card``: GiB of one GPU, None when not known here (then the figures are printed only)."""
    for phase in estimate_phases(cfg, hf_configs):
        fixed = phase.gib(0.0)
        if card is None:
            share = f" + vLLM's {phase.vllm_share:g} of the card" if phase.vllm_share else ""
            what = f"{phase.name}: ~{fixed:.1f} GiB{share} per GPU ({phase.describe(None)})"
            report.note("memory", f"{what}; the card's memory is not known here")
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

"""The preflight's memory per phase (preflight/memory.py, activations.py), measured: each phase's
computation as verl 0.9.1 runs it, on a model of Qwen2.5-0.5B's widths (hidden size, heads,
vocabulary) with 4 of its 24 layers, built from that config alone (every term per layer is the
same; the estimate counts the layers the config gives),
under torch's tensor-bytes tracker (torch.distributed._tools.mem_tracker.MemTracker, a dispatch
mode that files every live tensor's storage as a parameter, gradient, optimizer state,
activation or temporary) and fake tensors (FakeTensorMode: the real shapes and dtypes, no memory
allocated, so the model and its 151936-wide logits cost nothing here). Each figure is compared
with the estimate for the same model, tokens and dtypes, within 15 %.

Apples to apples: one rank, no FSDP (the estimate's weights are all the weights; a GPU holds
them sharded, with FSDP's gathered bf16 units beside them), fp32 throughout without autocast
(the estimate is fed 4-byte compute; on a GPU verl computes in bf16 under autocast, whose fp32
list adds the copies activations.py counts for bf16), the eager entropy (verl's path without
padding removal, which is this machine's: the sdpa overlay), and the CPU's single-tensor Adam
step (CUDA's is multi-tensor, other temporaries: activations.adam_step). What a tracker cannot
see (CUDA context, the caching allocator, NCCL buffers, vLLM asleep) is in docs/gpu.md.

The computations, verl's own functions where they run without Ray or FSDP:
* old log-prob: the actor's forward (no gradients), ``verl_F.entropy_from_logits`` and
  ``logprobs_from_logits`` on the narrowed, concatenated logits, as ``prepare_model_outputs``
  does without padding removal (verl/workers/engine/fsdp/transformer_impl.py ~1478-1505);
* reference: the same without the entropy;
* critic values: ``AutoModelForTokenClassification`` with one label, as verl's
  ``load_valuehead_model`` builds the critic, forward without gradients;
* critic update: its forward with gradient checkpointing (non-reentrant, as verl enables it),
  ``core_algos.compute_value_loss``, backward, AdamW step;
* actor update: forward with gradient checkpointing, ``logprobs_from_logits``, the "vanilla"
  clipped policy loss from verl's registry, backward, AdamW step.
Adam's moments are made resident first (a step on zero gradients), as from step 2 on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from helpers import QWEN25_05B, ROOT

from verl_gsm8k.preflight import memory as act
from verl_gsm8k.preflight.cli import compose
from verl_gsm8k.preflight.memory import GIB, Engine, engine_of, update_peak

# About 50 s alone on this project's 2 cores with 4 layers, 175 s with 24 beside another file
# (MemTracker updates every module's peak at every op, and verl's logprobs_from_logits_v2 loops
# over tokens).
# The measurement is a module fixture, made once per xdist worker: one group keeps both tests on
# one worker, so it is made once (split over the two, it was made twice: 407 s for the file).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("memory_measured")]

BATCH, SEQ = 3, 512  # 1536 tokens: the update's logits peak above its end-of-backward peaks
TOKENS = BATCH * SEQ
FP32 = 4
TOLERANCE = 0.15
SHAPE = dict(QWEN25_05B, num_hidden_layers=4)  # the widths of the 0.5B model, 4 layers
MIB = 2**20


@dataclass
class Row:
    phase: str
    what: str
    measured: int  # bytes
    estimated: int  # bytes

    def ratio(self) -> float:
        return self.estimated / self.measured

    def line(self) -> str:
        return (
            f"{self.phase:<15} {self.what:<46} {self.measured / MIB:>10.1f} "
            f"{self.estimated / MIB:>10.1f} {self.ratio():>6.2f}"
        )


@dataclass
class Table:
    rows: list[Row] = field(default_factory=list)

    def add(self, phase: str, what: str, measured: int, estimated: float) -> None:
        self.rows.append(Row(phase, what, int(measured), int(estimated)))

    def text(self) -> str:
        head = f"{'phase':<15} {'what':<46} {'measured':>10} {'estimate':>10} {'est/m':>6}"
        return (
            "\n".join([f"MiB, {TOKENS} tokens, fp32, one rank, CPU", head])
            + "\n"
            + "\n".join(row.line() for row in self.rows)
        )


def by_name(snap: dict[Any, dict[Any, int]]) -> dict[str, int]:
    """One device's bytes per category (PARAM, GRAD, OPT, ACT, TEMP, ...; "total")."""
    (device,) = snap.values()
    return {getattr(k, "name", "total"): v for k, v in device.items()}


def snapshot(tracker: Any, kind: str) -> dict[str, int]:
    """The tracker's bytes per category, 'current' or at its 'peak'."""
    return by_name(tracker.get_tracker_snapshot(kind))


def categories(snap: dict[str, int], *names: str) -> int:
    return sum(snap.get(name, 0) for name in names)


def resident_moments(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """Adam's moments as from the second step on: one step on zero gradients creates them."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad()


class PolicyLossConfig(dict):
    """The ActorConfig fields verl's vanilla policy loss reads (its defaults)."""

    clip_ratio = 0.2
    clip_ratio_low = 0.2
    clip_ratio_high = 0.2
    global_batch_info: dict[str, Any] = {}


def engines() -> dict[str, Engine]:
    """memory.py's engines for the PPO config on one GPU (model_dtype fp32, verl's default)."""
    from transformers import Qwen2Config

    paths = ["actor_rollout_ref.model.path=/models/m", "critic.model.path=/models/m"]
    one_gpu = ["actor_rollout_ref.model.lora_rank=0", "trainer.n_gpus_per_node=1"]
    cfg = compose(ROOT / "configs", "gsm8k_ppo", [*paths, *one_gpu])
    hf = Qwen2Config(**SHAPE)
    built = {role: engine_of(cfg, role, hf, 1) for role in ("actor", "reference", "critic")}
    assert {e.dtype for e in built.values()} == {"fp32"}, built  # the tracker's run is fp32
    return built


def measure() -> Table:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from transformers import AutoModelForTokenClassification, Qwen2Config, Qwen2ForCausalLM
    from verl.trainer.ppo import core_algos
    from verl.utils import torch_functional as verl_F

    hf = Qwen2Config(**SHAPE, attn_implementation="sdpa")
    e = engines()
    table = Table()
    gib = float(GIB)

    def logits_to_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        # prepare_model_outputs without padding removal narrows each row to its length (every
        # row is full here: the whole row) and concatenates them, a copy of the logits
        flat = torch.cat(list(logits.unbind()))
        return verl_F.logprobs_from_logits(logits=flat, labels=ids.reshape(-1)).view(BATCH, SEQ)

    # a ShapeEnv lets verl's losses call .item() on fake tensors (their metrics)
    with FakeTensorMode(shape_env=ShapeEnv()):
        ids = torch.randint(0, hf.vocab_size, (BATCH, SEQ))
        zeros = torch.zeros(BATCH, SEQ)
        mask = torch.ones(BATCH, SEQ)

        # ---- actor: one untracked update, so that Adam's moments are resident
        actor = Qwen2ForCausalLM(hf)
        actor.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        actor.train()
        actor_opt = torch.optim.AdamW(actor.parameters(), lr=1e-6)

        def actor_backward() -> None:
            log_prob = logits_to_logprobs(actor(input_ids=ids, use_cache=False).logits, ids)
            loss, _ = core_algos.get_policy_loss_fn("vanilla")(
                zeros, log_prob, zeros, mask, "token-mean", PolicyLossConfig()
            )
            loss.backward()

        resident_moments(actor, actor_opt)

        # ---- old log-prob: forward without gradients, entropy, log-probs
        tracker = MemTracker()
        tracker.track_external(actor, actor_opt, ids)
        with tracker, torch.no_grad():
            logits = actor(input_ids=ids, use_cache=False).logits
            entropy = verl_F.entropy_from_logits(logits)
            log_prob = logits_to_logprobs(logits, ids)
            del logits, entropy, log_prob
        peak = snapshot(tracker, "peak")
        table.add("old log-prob", "weights (PARAM)", peak["PARAM"], e["actor"].weights * gib)
        table.add("old log-prob", "Adam moments (OPT)", peak["OPT"], 2 * e["actor"].trained * gib)
        estimate = act.logprob_pass(hf, TOKENS, FP32, entropy=True, rmpad=False)
        table.add("old log-prob", "logits, softmax, entropy temps (ACT)", peak["ACT"], estimate)

        # ---- reference: the same forward, no entropy (no optimizer: forward_only)
        tracker = MemTracker()
        tracker.track_external(actor, ids)
        with tracker, torch.no_grad():
            log_prob = logits_to_logprobs(actor(input_ids=ids, use_cache=False).logits, ids)
            del log_prob
        peak = snapshot(tracker, "peak")
        table.add("reference", "weights (PARAM)", peak["PARAM"], e["reference"].weights * gib)
        estimate = act.logprob_pass(hf, TOKENS, FP32, entropy=False, rmpad=False)
        table.add("reference", "logits, their concatenation (ACT)", peak["ACT"], estimate)

        # ---- actor update: fwd + bwd, then Adam's step
        def update(phase: str, model: Any, opt: Any, backward: Any, engine: Engine) -> None:
            tracker = MemTracker()
            tracker.track_external(model, opt, ids, zeros, mask)
            with tracker:
                resting = snapshot(tracker, "current")
                backward()
                grads = snapshot(tracker, "current")
            bw = snapshot(tracker, "peak")
            embed = tracker.memory_tracking[model.get_input_embeddings()]
            embed_peak = by_name(embed.snapshots[_ModState.PEAK_BW][-1])
            stepper = MemTracker()
            stepper.track_external(model, opt)
            with stepper:
                opt.step()
                opt.zero_grad()
            step_peak = snapshot(stepper, "peak")
            params = [p for p in model.parameters() if p.requires_grad]
            n_trained = sum(p.numel() for p in params)
            largest = max(p.numel() for p in params)
            step = act.adam_step(n_trained * FP32, largest * FP32, foreach=False)
            lm_head = engine.role == "actor"
            acts = act.update_pass(hf, TOKENS, FP32, lm_head=lm_head, rmpad=False)
            embedding = act.embedding_backward(hf, FP32, trained=lm_head)
            w, t = engine.weights * gib, engine.trained * gib
            table.add(phase, "weights (PARAM)", resting["PARAM"], w)
            table.add(phase, "Adam moments, resident (OPT)", resting["OPT"], 2 * t)
            table.add(phase, "gradients after backward (GRAD)", grads["GRAD"], t)
            if lm_head:  # at these tokens the logits peak is the backward's; gradients are 0 there
                at_peak = categories(bw, "ACT", "TEMP", "GRAD")
                table.add(phase, "backward peak: ACT+TEMP (+GRAD, 0 there)", at_peak, acts)
            end = categories(embed_peak, "GRAD", "TEMP")
            table.add(phase, "embedding backward: gradients+temps", end, t + embedding)
            table.add(phase, "Adam step: moments+temps (OPT)", step_peak["OPT"], 2 * t + step)
            measured = max(bw["total"], step_peak["total"])
            estimate = w + 2 * t + update_peak(engine, hf, False, acts / gib, step / gib) * gib
            table.add(phase, "phase peak (total)", measured, estimate)

        update("actor update", actor, actor_opt, actor_backward, e["actor"])

        # ---- critic: a 1-label token classifier, as verl's load_valuehead_model builds it
        critic_hf = Qwen2Config(**SHAPE, attn_implementation="sdpa", num_labels=1,
                                classifier_dropout=0.0)  # fmt: skip
        critic = AutoModelForTokenClassification.from_config(critic_hf)
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        critic.train()
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-5)

        def critic_backward() -> None:
            values = critic(input_ids=ids, use_cache=False).logits.squeeze(-1)
            loss, _ = core_algos.compute_value_loss(values, zeros, zeros, mask, 0.5)
            loss.backward()

        resident_moments(critic, critic_opt)
        critic.eval()

        tracker = MemTracker()
        tracker.track_external(critic, critic_opt, ids)
        with tracker, torch.no_grad():
            values = critic(input_ids=ids, use_cache=False).logits.squeeze(-1)
            del values
        peak = snapshot(tracker, "peak")
        table.add("critic values", "weights (PARAM)", peak["PARAM"], e["critic"].weights * gib)
        table.add("critic values", "Adam moments (OPT)", peak["OPT"], 2 * e["critic"].trained * gib)
        estimate = act.value_pass(hf, TOKENS, FP32)
        table.add("critic values", "one layer's working set (ACT)", peak["ACT"], estimate)

        critic.train()
        update("critic update", critic, critic_opt, critic_backward, e["critic"])
    return table


@pytest.fixture(scope="module")
def table() -> Table:
    return measure()


def test_every_phase_is_estimated_within_15_percent_of_what_it_holds(table: Table):
    text = table.text()
    print("\n" + text)
    phases = {row.phase for row in table.rows}
    assert phases == {"old log-prob", "reference", "critic values", "critic update",
                      "actor update"}  # fmt: skip
    off = [row.line() for row in table.rows if abs(row.ratio() - 1) > TOLERANCE]
    assert not off, "off by more than 15 %:\n" + "\n".join(off) + "\n\n" + text


def test_the_old_log_prob_pass_is_the_heaviest_forward(table: Table):
    """The entropy makes the old log-prob pass hold about three times the reference's logits (fp32:
    logits, softmax, and the product or logsumexp's temporary)."""
    acts = {row.phase: row.measured for row in table.rows if row.what.endswith("(ACT)")}
    logits = TOKENS * SHAPE["vocab_size"] * FP32
    assert acts["old log-prob"] >= 3 * logits
    assert acts["old log-prob"] > 1.4 * acts["reference"]

"""The preflight's memory per phase against torch's tensor tracker, within 15 %: verl's own
functions on Qwen2.5-0.5B's widths, 4 layers, fake tensors (what it cannot see: docs/gpu.md)."""

from typing import Any

import pytest
import torch
from helpers import QWEN25_05B, ROOT

from verl_gsm8k.preflight import memory as mem
from verl_gsm8k.preflight.compose import compose

# Slow (MemTracker hooks every op): a module fixture, both tests on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("memory_measured")]

BATCH, SEQ = 3, 512  # 1536 tokens: the update's logits peak above its end-of-backward peaks
TOKENS, FP32, MIB = BATCH * SEQ, 4, 2**20
SHAPE = dict(QWEN25_05B, num_hidden_layers=4)  # the widths of the 0.5B model, 4 layers


def snapshot(tracker: Any, kind: str = "peak", snap: Any = None) -> dict[str, int]:
    (device,) = (snap or tracker.get_tracker_snapshot(kind)).values()
    return {getattr(k, "name", "total"): v for k, v in device.items()}


def resident_moments(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for p in model.parameters():  # Adam's moments as from step 2 on
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad()


class PolicyLossConfig(dict):  # the ActorConfig fields verl's vanilla policy loss reads
    clip_ratio = clip_ratio_low = clip_ratio_high = 0.2
    global_batch_info: dict[str, Any] = {}


def measure() -> list[tuple[str, str, int, int]]:
    """(phase, what, measured bytes, estimated bytes) of every figure."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from transformers import AutoModelForTokenClassification, Qwen2Config, Qwen2ForCausalLM
    from verl.trainer.ppo import core_algos
    from verl.utils import torch_functional as verl_F

    hf = Qwen2Config(**SHAPE, attn_implementation="sdpa")
    paths = ["actor_rollout_ref.model.path=/m", "critic.model.path=/m", "trainer.n_gpus_per_node=1"]
    cfg = compose(ROOT / "configs", "gsm8k_ppo", [*paths, "actor_rollout_ref.model.lora_rank=0"])
    e = {role: mem.engine_of(cfg, role, hf, 1) for role in ("actor", "reference", "critic")}
    assert {engine.dtype for engine in e.values()} == {"fp32"}, e  # the tracker's run is fp32
    rows: list[tuple[str, str, int, int]] = []

    def add(phase: str, what: str, measured: int, estimated: float) -> None:
        rows.append((phase, what, int(measured), int(estimated)))

    def logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        # without padding removal verl narrows each row (all full here) and concatenates them
        flat = torch.cat(list(logits.unbind()))
        return verl_F.logprobs_from_logits(logits=flat, labels=ids.reshape(-1)).view(BATCH, SEQ)

    def forward(phase: str, tracked: tuple, fn: Any, engine: mem.Engine, what: str,
                estimate: int, moments: bool = True) -> None:  # fmt: skip
        tracker = MemTracker()
        tracker.track_external(*tracked)
        with tracker, torch.no_grad():
            fn()
        peak, gib = snapshot(tracker), float(mem.GIB)
        add(phase, "weights (PARAM)", peak["PARAM"], engine.weights * gib)
        if moments:
            add(phase, "Adam moments (OPT)", peak["OPT"], 2 * engine.trained * gib)
        add(phase, what, peak["ACT"], estimate)

    def update(phase: str, model: Any, opt: Any, backward: Any, engine: mem.Engine) -> None:
        tracker = MemTracker()
        tracker.track_external(model, opt, ids, zeros, mask)
        with tracker:
            resting = snapshot(tracker, "current")
            backward()
            grads = snapshot(tracker, "current")
        bw = snapshot(tracker)
        embed = snapshot(None, snap=tracker.memory_tracking[model.get_input_embeddings()]
                         .snapshots[_ModState.PEAK_BW][-1])  # fmt: skip
        stepper = MemTracker()
        stepper.track_external(model, opt)
        with stepper:
            opt.step()
            opt.zero_grad()
        step_peak = snapshot(stepper)
        params = [p for p in model.parameters() if p.requires_grad]
        step = mem.adam_step(sum(p.numel() for p in params) * FP32,
                             max(p.numel() for p in params) * FP32, foreach=False)  # fmt: skip
        lm_head = engine.role == "actor"
        acts = mem.update_pass(hf, TOKENS, FP32, lm_head=lm_head, rmpad=False)
        w, t = engine.weights * mem.GIB, engine.trained * mem.GIB
        add(phase, "weights (PARAM)", resting["PARAM"], w)
        add(phase, "Adam moments, resident (OPT)", resting["OPT"], 2 * t)
        add(phase, "gradients after backward (GRAD)", grads["GRAD"], t)
        if lm_head:  # at these tokens the logits peak is the backward's; gradients are 0 there
            at_peak = sum(bw.get(k, 0) for k in ("ACT", "TEMP", "GRAD"))
            add(phase, "backward peak: ACT+TEMP (+GRAD, 0 there)", at_peak, acts)
        end = embed.get("GRAD", 0) + embed.get("TEMP", 0)
        embedding = mem.embedding_backward(hf, FP32, trained=lm_head)
        add(phase, "embedding backward: gradients+temps", end, t + embedding)
        add(phase, "Adam step: moments+temps (OPT)", step_peak["OPT"], 2 * t + step)
        peak = mem.update_peak(engine, hf, False, acts / mem.GIB, step / mem.GIB) * mem.GIB
        add(phase, "phase peak (total)", max(bw["total"], step_peak["total"]), w + 2 * t + peak)

    with FakeTensorMode(shape_env=ShapeEnv()):  # a ShapeEnv: verl's losses call .item()
        ids = torch.randint(0, hf.vocab_size, (BATCH, SEQ))
        zeros, mask = torch.zeros(BATCH, SEQ), torch.ones(BATCH, SEQ)
        actor = Qwen2ForCausalLM(hf)
        actor.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        actor.train()
        actor_opt = torch.optim.AdamW(actor.parameters(), lr=1e-6)
        resident_moments(actor, actor_opt)

        def old_log_prob() -> None:
            logits = actor(input_ids=ids, use_cache=False).logits
            entropy, log_prob = verl_F.entropy_from_logits(logits), logprobs(logits, ids)
            del logits, entropy, log_prob

        forward("old log-prob", (actor, actor_opt, ids), old_log_prob, e["actor"],
                "logits, softmax, entropy temps (ACT)",
                mem.logprob_pass(hf, TOKENS, FP32, entropy=True, rmpad=False))  # fmt: skip
        forward("reference", (actor, ids),
                lambda: logprobs(actor(input_ids=ids, use_cache=False).logits, ids),
                e["reference"], "logits, their concatenation (ACT)",
                mem.logprob_pass(hf, TOKENS, FP32, entropy=False, rmpad=False),
                moments=False)  # fmt: skip

        def actor_backward() -> None:
            log_prob = logprobs(actor(input_ids=ids, use_cache=False).logits, ids)
            loss, _ = core_algos.get_policy_loss_fn("vanilla")(
                zeros, log_prob, zeros, mask, "token-mean", PolicyLossConfig())  # fmt: skip
            loss.backward()

        update("actor update", actor, actor_opt, actor_backward, e["actor"])
        critic_hf = Qwen2Config(**SHAPE, attn_implementation="sdpa", num_labels=1,
                                classifier_dropout=0.0)  # fmt: skip
        critic = AutoModelForTokenClassification.from_config(critic_hf)
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-5)
        resident_moments(critic, critic_opt)
        critic.eval()
        forward("critic values", (critic, critic_opt, ids),
                lambda: critic(input_ids=ids, use_cache=False).logits, e["critic"],
                "one layer's working set (ACT)", mem.value_pass(hf, TOKENS, FP32))  # fmt: skip

        def critic_backward() -> None:
            values = critic(input_ids=ids, use_cache=False).logits.squeeze(-1)
            loss, _ = core_algos.compute_value_loss(values, zeros, zeros, mask, 0.5)
            loss.backward()

        critic.train()
        update("critic update", critic, critic_opt, critic_backward, e["critic"])
    return rows


@pytest.fixture(scope="module")
def rows() -> list[tuple[str, str, int, int]]:
    return measure()


def test_every_phase_is_estimated_within_15_percent_of_what_it_holds(rows):
    text = "\n".join(f"{p:<15} {w:<46} {m / MIB:>10.1f} {e / MIB:>10.1f} {e / m:>6.2f}"
                     for p, w, m, e in rows)  # fmt: skip
    print(f"\nMiB, {TOKENS} tokens, fp32, one rank, CPU: phase, what, measured, estimate\n{text}")
    assert {row[0] for row in rows} == {"old log-prob", "reference", "critic values",
                                        "critic update", "actor update"}  # fmt: skip
    off = [row for row in rows if abs(row[3] / row[2] - 1) > 0.15]
    assert not off, f"off by more than 15 %: {off}\n\n{text}"


def test_the_old_log_prob_pass_is_the_heaviest_forward(rows):
    acts = {phase: measured for phase, what, measured, _ in rows if what.endswith("(ACT)")}
    assert acts["old log-prob"] >= 3 * TOKENS * SHAPE["vocab_size"] * FP32
    assert acts["old log-prob"] > 1.4 * acts["reference"]

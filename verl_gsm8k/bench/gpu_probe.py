"""GPU probe: the peak memory of each phase the preflight's memory model counts, measured on a
Qwen2.5-shaped model with random weights, beside the preflight's estimate for the same shapes.

Needs torch and transformers only (no verl, no vLLM, nothing downloaded): each model is built
from the shapes kept in verl_gsm8k/common/qwen25.py. The estimates come from the preflight's
own functions (verl_gsm8k/preflight/activations.py, memory.update_peak) and are computed before
anything is measured. Each phase mirrors what verl 0.9.1 runs (verl/workers/engine/fsdp/
transformer_impl.py ``prepare_model_outputs``, verl/utils/torch_functional.py), in bf16 autocast
on fp32 weights (verl's model_dtype and FSDP's compute dtype), one process, no FSDP:

* old log-prob (no gradients, with the entropy verl always computes there): padded rows with the
  eager entropy (verl without padding removal); one packed row with ``position_ids`` (padding
  removal, transformers' block-diagonal mask under sdpa) with the eager and the compiled entropy;
* reference (no entropy): padded and packed;
* actor update's forward and backward (gradient checkpointing, log-probs through verl's torch path,
  no flash-attn cross entropy): padded and packed;
* the AdamW step (CUDA's multi-tensor step), gradients complete, moments resident.

"measured" is the allocator's peak during the phase minus what was allocated when it began
(weights, Adam moments, and for the step the gradients), so it holds what the estimate's
activation terms hold; autocast's weight cache is off (FSDP's gathered bf16 units are the
estimate's separate "working copy", not in these rows). A case whose estimate exceeds the free
memory is skipped, an out-of-memory is recorded; the table says which.

    python -m verl_gsm8k.bench.gpu_probe --out runs/gpu_probe          # about 2-4 min on one H100
    python -m verl_gsm8k.bench.gpu_probe --models tiny --tokens 256 --seq 64 --device cpu --out D
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from verl_gsm8k.common.qwen25 import qwen25_config
from verl_gsm8k.common.tiny_model import tiny_config
from verl_gsm8k.preflight import activations as act
from verl_gsm8k.preflight.memory import GIB, Engine, update_peak
from verl_gsm8k.preflight.model import count_parameters

# The recipes' micro-batch token budget (configs/gsm8k_base.yaml: ppo_max_token_len_per_gpu,
# log_prob_max_token_len_per_gpu, ppo_infer_max_token_len_per_gpu) and longest sequence
# (launch/knobs.py: MAX_PROMPT_LENGTH 512 + MAX_RESPONSE_LENGTH 256); tests/test_gpu_probe.py
# holds both against the files.
RECIPE_TOKENS = 16384
RECIPE_SEQ = 768
# The recipes' models: 0.5B (PPO, GRPO: full fine-tuning), 1.5B (the LoRA recipe's actor).
DEFAULT_MODELS = ("0.5B", "1.5B")
COMPUTE = 2  # bytes of bf16, the compute dtype
WEIGHT = 4  # bytes of fp32, verl's model_dtype (weights, gradients, Adam moments)
FREE_MARGIN = 0.95  # a case runs only when its estimate is below this share of the free memory
MIB = 2**20
PHASES = (
    "old log-prob, padded, eager entropy",
    "old log-prob, packed, eager entropy",
    "old log-prob, packed, compiled entropy",
    "reference, padded",
    "reference, packed",
    "actor update fwd+bwd, padded",
    "actor update fwd+bwd, packed",
    "AdamW step",
)


@dataclass
class Row:
    model: str
    phase: str
    tokens: int  # tokens the phase computes (padded rows: rows x longest)
    estimate_mib: float
    measured_mib: float | None
    status: str  # "ok", "skipped: ...", "out of memory"
    seconds: float  # the measured run, warm-up and compilation included
    warm_seconds: float | None = None  # the same phase run again (its time, not its memory)

    def ratio(self) -> str:
        return f"{self.estimate_mib / self.measured_mib:.2f}" if self.measured_mib else ""


# ---------------------------------------------------------------------------- verl's math
def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """The formula of verl_F.entropy_from_logits: logsumexp(x) - sum(softmax(x) * x)."""
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """What verl_F.logprobs_from_logits computes without flash-attn (its ``_v2``): fp32 logits
    through a row loop of logsumexp, bf16 ones through a row loop of log_softmax."""
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    rows = [
        torch.nn.functional.log_softmax(row, dim=-1).gather(-1, label.unsqueeze(-1)).squeeze(-1)
        for row, label in zip(logits, labels, strict=True)
    ]
    return torch.stack(rows)


# ---------------------------------------------------------------------------- batches
@dataclass
class Batch:
    padded_ids: torch.Tensor  # (rows, longest)
    mask: torch.Tensor  # (rows, longest), 1 for real tokens
    packed_ids: torch.Tensor  # (1, tokens)
    position_ids: torch.Tensor  # (1, tokens): each row's positions from 0, as verl feeds them
    lengths: list[int]


def row_lengths(tokens: int, seq: int, seed: int = 0) -> list[int]:
    """Rows of seq/2..seq tokens summing to ``tokens`` (GSM8K-like spread; the padded batch then
    computes about 1.3x the real tokens)."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(seq // 2, seq), tokens - sum(lengths)))
    return lengths


def make_batch(vocab: int, tokens: int, seq: int, device: str) -> Batch:
    lengths = row_lengths(tokens, seq)
    longest = max(lengths)
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
    padded = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, row in enumerate(rows):
        padded[i, : len(row)], mask[i, : len(row)] = row, 1
    packed = torch.cat(rows).unsqueeze(0)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    to = {"device": device}
    return Batch(padded.to(**to), mask.to(**to), packed.to(**to), positions.to(**to), lengths)


# ---------------------------------------------------------------------------- meters
class CudaMeter:
    def __init__(self, device: str) -> None:
        self.device = torch.device(device)

    def free(self) -> int:
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        return free

    def peak_above_start(self, fn: Callable[[], None], *_tracked: Any) -> int:
        torch.cuda.synchronize(self.device)
        start = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        fn()
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - start

    def seconds(self, fn: Callable[[], None]) -> float:
        torch.cuda.synchronize(self.device)
        start = time.monotonic()
        fn()
        torch.cuda.synchronize(self.device)
        return time.monotonic() - start


class TrackerMeter:
    """The CPU's: torch's tensor-bytes tracker (a dispatch mode; torch.compile runs eager in it)."""

    def free(self) -> int:
        return 1 << 62  # host memory is not the question here

    def peak_above_start(self, fn: Callable[[], None], *tracked: Any) -> int:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(*tracked)
        with tracker:
            start = _total(tracker.get_tracker_snapshot("current"))
            fn()
        return _total(tracker.get_tracker_snapshot("peak")) - start

    def seconds(self, fn: Callable[[], None]) -> float:
        start = time.monotonic()
        fn()
        return time.monotonic() - start


def _total(snapshot: dict[Any, dict[Any, int]]) -> int:
    return sum(per_device["Total"] for per_device in snapshot.values())


# ---------------------------------------------------------------------------- the probe
def build_model(hf_config: Any, device: str) -> torch.nn.Module:
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(hf_config)  # fp32, random weights
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def estimates(hf_config: Any, batch: Batch) -> dict[str, int]:
    """Bytes each phase holds above its start, from the preflight's functions."""
    real = sum(batch.lengths)
    padded = batch.padded_ids.numel()
    params = count_parameters(hf_config)
    trained = params * WEIGHT / GIB
    engine = Engine("actor", "", False, False, trained, trained, 0.0, "fp32", COMPUTE, True, WEIGHT)

    def update(tokens: int, rmpad: bool) -> int:
        acts = act.update_pass(hf_config, tokens, COMPUTE, True, rmpad, flash_ce=False)
        return int(update_peak(engine, hf_config, False, acts / GIB, step=0.0) * GIB)

    return {
        PHASES[0]: act.logprob_pass(hf_config, padded, COMPUTE, True, rmpad=False),
        PHASES[1]: act.logprob_pass(hf_config, real, COMPUTE, True, rmpad=True, compiled=False),
        PHASES[2]: act.logprob_pass(hf_config, real, COMPUTE, True, rmpad=True, compiled=True),
        PHASES[3]: act.logprob_pass(hf_config, padded, COMPUTE, False, rmpad=False),
        PHASES[4]: act.logprob_pass(hf_config, real, COMPUTE, False, rmpad=True),
        PHASES[5]: update(padded, rmpad=False),
        PHASES[6]: update(real, rmpad=True),
        # multi-tensor on CUDA: sqrt(exp_avg_sq) of every parameter; the largest is the embedding
        PHASES[7]: int(
            act.adam_step(
                params * WEIGHT,
                hf_config.vocab_size * hf_config.hidden_size * WEIGHT,
                foreach=torch.cuda.is_available(),
            )
        ),  # fmt: skip
    }


def phase_steps(model: torch.nn.Module, batch: Batch, device: str) -> dict[str, Callable[[], None]]:
    """Each phase as verl runs it (module docstring); each drops what it made before returning."""
    kind = torch.device(device).type
    entropy_compiled = torch.compile(entropy_from_logits, dynamic=True)
    rows = zip(batch.padded_ids, batch.lengths, strict=True)
    labels_padded = torch.cat([row[:n] for row, n in rows])
    labels_packed = batch.packed_ids.squeeze(0)

    def autocast() -> Any:
        return torch.autocast(kind, dtype=torch.bfloat16, cache_enabled=False)

    def padded_logits() -> torch.Tensor:
        return model(input_ids=batch.padded_ids, attention_mask=batch.mask, use_cache=False).logits

    def packed_logits() -> torch.Tensor:
        out = model(input_ids=batch.packed_ids, position_ids=batch.position_ids, use_cache=False)
        return out.logits.squeeze(0)

    def narrowed(logits: torch.Tensor) -> torch.Tensor:  # verl's narrow + cat of the valid tokens
        return torch.cat([row[:n] for row, n in zip(logits, batch.lengths, strict=True)])

    def log_prob(packed: bool, entropy: Callable | None) -> Callable[[], None]:
        def run() -> None:
            model.eval()
            with torch.no_grad(), autocast():
                logits = packed_logits() if packed else padded_logits()
                ent = entropy(logits) if entropy else None
                flat = logits if packed else narrowed(logits)
                lp = token_logprobs(flat, labels_packed if packed else labels_padded)
                del logits, ent, flat, lp

        return run

    def update(packed: bool) -> Callable[[], None]:
        def run() -> None:
            model.train()
            with autocast():
                logits = packed_logits() if packed else narrowed(padded_logits())
                lp = token_logprobs(logits, labels_packed if packed else labels_padded)
                loss = -lp.float().mean()  # a policy loss reduces to a weighted mean of log-probs
                del logits, lp
            loss.backward()

        return run

    return {
        PHASES[0]: log_prob(False, entropy_from_logits),
        PHASES[1]: log_prob(True, entropy_from_logits),
        PHASES[2]: log_prob(True, entropy_compiled),
        PHASES[3]: log_prob(False, None),
        PHASES[4]: log_prob(True, None),
        PHASES[5]: update(False),
        PHASES[6]: update(True),
    }


def probe_model(name: str, hf_config: Any, tokens: int, seq: int, device: str) -> list[Row]:
    meter = CudaMeter(device) if torch.device(device).type == "cuda" else TrackerMeter()
    batch = make_batch(hf_config.vocab_size, tokens, seq, device)
    expected = estimates(hf_config, batch)  # before anything is measured
    states = count_parameters(hf_config) * WEIGHT * 4  # weights, gradients, two moments
    if states > FREE_MARGIN * meter.free():
        why = f"skipped: {states / GIB:.1f} GiB of states above the free memory"
        return [Row(name, p, 0, expected[p] / MIB, None, why, 0.0) for p in PHASES]
    model = build_model(hf_config, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=meter.__class__ is CudaMeter)
    for p in model.parameters():  # Adam's moments resident, as from the second step on
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    rows = []
    steps = phase_steps(model, batch, device)
    padded, real = batch.padded_ids.numel(), sum(batch.lengths)

    def measure(phase: str, fn: Callable[[], None], tokens: int) -> None:
        start = time.monotonic()
        if expected[phase] > FREE_MARGIN * meter.free():
            status, peak = f"skipped: estimate above {meter.free() / GIB:.1f} GiB free", None
        else:
            try:
                peak, status = meter.peak_above_start(fn, model, opt), "ok"
            except torch.OutOfMemoryError:
                peak, status = None, "out of memory"
        seconds = time.monotonic() - start
        warm = meter.seconds(fn) if status == "ok" else None
        measured = None if peak is None else peak / MIB
        shown = "" if measured is None else f", {measured:.1f} MiB"
        print(f"gpu_probe: {name}, {phase}: {status}{shown}, {seconds:.1f} s", flush=True)
        rows.append(
            Row(name, phase, tokens, expected[phase] / MIB, measured, status, seconds, warm)
        )

    for phase, fn in steps.items():
        model.zero_grad(set_to_none=True)
        measure(phase, fn, real if "packed" in phase else padded)
    # the step: complete gradients (the last update's), moments resident
    if model.lm_head.weight.grad is None:  # the update did not run: gradients of zeros
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    measure(PHASES[7], opt.step, real)
    return rows  # the model, its optimizer and the phases' closures go with this frame


def configs(names: list[str], attn: str = "sdpa") -> dict[str, Any]:
    return {
        name: (tiny_config(attn_implementation=attn) if name == "tiny"
               else qwen25_config(name, attn_implementation=attn))
        for name in names
    }  # fmt: skip


def markdown(rows: list[Row], header: dict[str, Any]) -> str:
    lines = [
        f"GPU probe on {header['device']}, torch {header['torch']}, transformers "
        f"{header['transformers']}, {header['date']}; attention {header['attn']}; "
        f"{header['tokens']} real tokens, rows of {header['seq'] // 2}-{header['seq']}; MiB above "
        "the phase's start; s: the measured run (compilation included), warm s: the same again.",
        "",
        "| model | phase | tokens | estimate MiB | measured MiB | est./meas. | status | s "
        "| warm s |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        measured = f"{r.measured_mib:.1f}" if r.measured_mib is not None else ""
        warm = f"{r.warm_seconds:.3f}" if r.warm_seconds is not None else ""
        lines.append(
            f"| {r.model} | {r.phase} | {r.tokens} | {r.estimate_mib:.1f} | {measured} | "
            f"{r.ratio()} | {r.status} | {r.seconds:.1f} | {warm} |"
        )
    return "\n".join(lines) + "\n"


def write(out: Path, name: str, text: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, out / name)


def main(argv: list[str] | None = None) -> int:
    import transformers

    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.bench.gpu_probe", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help="comma-separated Qwen2.5 sizes (0.5B, 1.5B, 3B, 7B) or 'tiny' (the tiny model's "
        f"shape, for a CPU check); default {','.join(DEFAULT_MODELS)}, the recipes' models",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=RECIPE_TOKENS,
        help=f"real tokens of a micro-batch (default {RECIPE_TOKENS}, the recipes' budgets)",
    )
    parser.add_argument(
        "--seq",
        type=int,
        default=RECIPE_SEQ,
        help=f"longest row; rows are seq/2..seq tokens (default {RECIPE_SEQ}, the recipes' "
        "prompt + response length)",
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cuda (the allocator's peaks) or cpu (torch's tensor tracker); default: cuda if any",
    )
    parser.add_argument(
        "--attn",
        default="sdpa",
        choices=("sdpa", "flash_attention_4", "flash_attention_2", "eager"),
        help="transformers' attn_implementation for every phase (default sdpa, what the recipes "
        "run without a flash-attn wheel; flash_attention_4 needs the flash-attn-4 package and a "
        "card of compute capability 9+, as `make setup FLASH_ATTN=4` installs)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for gpu_probe.md and gpu_probe.json"
    )
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.seq < 2:
        parser.error("--tokens must be >= 1 and --seq >= 2")
    try:
        models = configs([m.strip() for m in args.models.split(",") if m.strip()], args.attn)
    except ValueError as exc:
        parser.error(str(exc))
    device_name = (
        torch.cuda.get_device_name(args.device)
        if args.device.startswith("cuda")
        else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    )
    header = {
        "device": device_name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
        "tokens": args.tokens,
        "seq": args.seq,
        "attn": args.attn,
    }
    start = time.monotonic()
    rows: list[Row] = []
    for name, hf_config in models.items():
        rows += probe_model(name, hf_config, args.tokens, args.seq, args.device)
        print(f"gpu_probe: {name} done at {time.monotonic() - start:.0f} s", flush=True)
    header["seconds"] = round(time.monotonic() - start, 1)
    text = markdown(rows, header)
    write(args.out, "gpu_probe.json", json.dumps({**header, "rows": [asdict(r) for r in rows]}))
    write(args.out, "gpu_probe.md", text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

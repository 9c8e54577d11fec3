"""GPU probe: the peak memory of each phase the preflight's memory model counts, on a
Qwen2.5-shaped model with random weights, beside the preflight's own estimate (computed first).

Each phase as verl runs it (bf16 autocast, fp32 weights, one process, no FSDP); "measured" is
the allocator's peak above the phase's start; a case over the free memory is skipped.

    python -m verl_gsm8k.bench.gpu_probe --out runs/gpu_probe          # 2-4 min on one H100
    python -m verl_gsm8k.bench.gpu_probe --models tiny --tokens 256 --seq 64 --device cpu --out D
"""

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

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.common.qwen25 import qwen25_config
from verl_gsm8k.common.tiny_model import tiny_config
from verl_gsm8k.preflight import memory as mem
from verl_gsm8k.preflight.model import count_parameters

# The recipes' token budget and longest sequence (tests/test_gpu_probe.py holds both to them).
RECIPE_TOKENS, RECIPE_SEQ = 16384, 768
DEFAULT_MODELS = ("0.5B", "1.5B")  # the recipes' models
COMPUTE, WEIGHT = 2, 4  # bf16 compute, fp32 weights, gradients and Adam moments
FREE_MARGIN = 0.95  # a case runs only when its estimate is below this share of the free memory
MIB = 2**20
PHASES = ("old log-prob, padded, eager entropy", "old log-prob, packed, eager entropy",
          "old log-prob, packed, compiled entropy", "reference, padded", "reference, packed",
          "actor update fwd+bwd, padded", "actor update fwd+bwd, packed", "AdamW step")  # fmt: skip


@dataclass
class Row:
    model: str
    phase: str
    tokens: int  # tokens the phase computes (padded rows: rows x longest)
    estimate_mib: float
    measured_mib: float | None
    status: str  # "ok", "skipped: ...", "out of memory"
    seconds: float  # the measured run, warm-up and compilation included
    warm_seconds: float | None = None  # the same phase again (its time, not its memory)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """verl_F.entropy_from_logits: logsumexp(x) - sum(softmax(x) * x)."""
    return torch.logsumexp(logits, dim=-1) - torch.sum(logits.softmax(-1) * logits, dim=-1)


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """verl_F.logprobs_from_logits without flash-attn (logsumexp for fp32, log_softmax bf16)."""
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    return torch.stack([row.log_softmax(-1).gather(-1, label.unsqueeze(-1)).squeeze(-1)
                        for row, label in zip(logits, labels, strict=True)])  # fmt: skip


def row_lengths(tokens: int, seq: int) -> list[int]:
    """Rows of seq/2..seq tokens summing to ``tokens`` (GSM8K-like)."""
    rng, lengths = random.Random(0), []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(seq // 2, seq), tokens - sum(lengths)))
    return lengths


def make_batch(vocab: int, tokens: int, seq: int, device: str) -> dict[str, Any]:
    """The same rows padded (ids, mask) and packed in one row with each row's positions."""
    lengths = row_lengths(tokens, seq)
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
    padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    mask = (torch.arange(padded.shape[1]) < torch.tensor(lengths)[:, None]).long()
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    batch = dict(padded=padded, mask=mask, packed=torch.cat(rows)[None], positions=positions)
    return {k: v.to(device) for k, v in batch.items()} | {"lengths": lengths}


def estimates(c: Any, batch: dict[str, Any]) -> dict[str, int]:
    """Bytes each phase holds above its start, from the preflight's own functions."""
    real, padded = sum(batch["lengths"]), batch["padded"].numel()
    trained = count_parameters(c) * WEIGHT / mem.GIB
    engine = mem.Engine("actor", "", False, False, trained, trained, compute_bytes=COMPUTE)

    def update(tokens: int, rmpad: bool) -> int:
        acts = mem.update_pass(c, tokens, COMPUTE, True, rmpad, flash_ce=False) / mem.GIB
        return int(mem.update_peak(engine, c, False, acts, step=0.0) * mem.GIB)

    logprob = mem.logprob_pass
    step = mem.adam_step(count_parameters(c) * WEIGHT, c.vocab_size * c.hidden_size * WEIGHT,
                         foreach=torch.cuda.is_available())  # fmt: skip
    return dict(zip(PHASES, (
        logprob(c, padded, COMPUTE, True, rmpad=False),
        logprob(c, real, COMPUTE, True, rmpad=True, compiled=False),
        logprob(c, real, COMPUTE, True, rmpad=True, compiled=True),
        logprob(c, padded, COMPUTE, False, rmpad=False),
        logprob(c, real, COMPUTE, False, rmpad=True),
        update(padded, rmpad=False), update(real, rmpad=True), int(step),
    ), strict=True))  # fmt: skip


def phase_steps(model: Any, batch: dict[str, Any], device: str) -> list[Callable[[], None]]:
    """Each phase but the step, as verl runs it, each freeing what it made."""
    lengths, compiled = batch["lengths"], torch.compile(entropy_from_logits, dynamic=True)

    def narrowed(rows: torch.Tensor) -> torch.Tensor:  # verl's narrow + cat of the valid tokens
        return torch.cat([row[:n] for row, n in zip(rows, lengths, strict=True)])

    labels = {False: narrowed(batch["padded"]), True: batch["packed"][0]}

    def logits(packed: bool) -> torch.Tensor:
        if packed:
            ids, positions = batch["packed"], batch["positions"]
            return model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        return model(
            input_ids=batch["padded"], attention_mask=batch["mask"], use_cache=False
        ).logits

    def autocast() -> Any:
        return torch.autocast(torch.device(device).type, torch.bfloat16, cache_enabled=False)

    def log_prob(packed: bool, entropy: Callable | None) -> Callable[[], None]:
        def run() -> None:
            model.eval()
            with torch.no_grad(), autocast():
                out = logits(packed)  # padded: the entropy of every position, as verl's
                ent = entropy(out) if entropy else None
                flat = out if packed else narrowed(out)
                lp = token_logprobs(flat, labels[packed])
                del out, ent, flat, lp

        return run

    def update(packed: bool) -> Callable[[], None]:
        def run() -> None:
            model.train()
            with autocast():
                flat = logits(True) if packed else narrowed(logits(False))
                loss = -token_logprobs(flat, labels[packed]).float().mean()
                del flat
            loss.backward()

        return run

    return [log_prob(False, entropy_from_logits), log_prob(True, entropy_from_logits),
            log_prob(True, compiled), log_prob(False, None), log_prob(True, None),
            update(False), update(True)]  # fmt: skip


def peak_above_start(fn: Callable[[], None], device: str, *tracked: Any) -> int:
    """The peak during ``fn`` above what was allocated before (CUDA allocator, CPU: torch's
    tensor tracker, where torch.compile runs eager)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*tracked)
    with tracker:
        start = sum(d["Total"] for d in tracker.get_tracker_snapshot("current").values())
        fn()
    return sum(d["Total"] for d in tracker.get_tracker_snapshot("peak").values()) - start


def probe_model(name: str, c: Any, tokens: int, seq: int, device: str) -> list[Row]:
    cuda = torch.device(device).type == "cuda"
    batch = make_batch(c.vocab_size, tokens, seq, device)
    expected = estimates(c, batch)  # before anything is measured

    def free() -> int:
        return torch.cuda.empty_cache() or torch.cuda.mem_get_info(device)[0] if cuda else 1 << 62

    if count_parameters(c) * WEIGHT * 4 > FREE_MARGIN * free():  # weights, grads, 2 moments
        why = "skipped: the states are above the free memory"
        return [Row(name, p, 0, expected[p] / MIB, None, why, 0.0) for p in PHASES]
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(c)  # fp32, random weights
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=cuda)
    for p in model.parameters():  # Adam's moments resident, as from the second step on
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    rows = []
    real, padded = sum(batch["lengths"]), batch["padded"].numel()
    steps = [*phase_steps(model, batch, device), opt.step]
    for phase, fn in zip(PHASES, steps, strict=True):
        if phase != PHASES[-1]:
            model.zero_grad(set_to_none=True)
        elif model.lm_head.weight.grad is None:  # no update ran: the step on zero gradients
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        start, peak, warm = time.monotonic(), None, None
        if expected[phase] > FREE_MARGIN * free():
            status = f"skipped: estimate above {free() / mem.GIB:.1f} GiB free"
        else:
            try:
                peak, status = peak_above_start(fn, device, model, opt), "ok"
            except torch.OutOfMemoryError:
                status = "out of memory"
        seconds = time.monotonic() - start
        if peak is not None:
            again = time.monotonic()
            fn()
            torch.cuda.synchronize(device) if cuda else None
            warm = time.monotonic() - again
        tokens_of = real if "packed" in phase or phase == PHASES[-1] else padded
        rows.append(Row(name, phase, tokens_of, expected[phase] / MIB,
                        None if peak is None else peak / MIB, status, seconds, warm))  # fmt: skip
        print(f"gpu_probe: {name}, {phase}: {status}, {seconds:.1f} s", flush=True)
    return rows


def markdown(rows: list[Row], head: dict[str, Any]) -> str:
    lines = [f"GPU probe on {head['device']}, torch {head['torch']}, {head['date']}; attention "
             f"{head['attn']}; {head['tokens']} real tokens, rows of {head['seq'] // 2}-"
             f"{head['seq']}; MiB above the phase's start; s: the measured run, warm s: again.",
             "", "| model | phase | tokens | estimate MiB | measured MiB | est./meas. | status | "
             "s | warm s |", "|---|---|---:|---:|---:|---:|---|---:|---:|"]  # fmt: skip
    for r in rows:
        got = "" if r.measured_mib is None else f"{r.measured_mib:.1f}"
        ratio = f"{r.estimate_mib / r.measured_mib:.2f}" if r.measured_mib else ""
        warm = "" if r.warm_seconds is None else f"{r.warm_seconds:.3f}"
        lines.append(f"| {r.model} | {r.phase} | {r.tokens} | {r.estimate_mib:.1f} | {got} | "
                     f"{ratio} | {r.status} | {r.seconds:.1f} | {warm} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser("python -m verl_gsm8k.bench.gpu_probe",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="Qwen2.5 sizes (0.5B, ..., 7B) or tiny, comma-separated")  # fmt: skip
    parser.add_argument("--tokens", type=int, default=RECIPE_TOKENS,
                        help="real tokens of a micro-batch (the recipes' budget)")  # fmt: skip
    parser.add_argument("--seq", type=int, default=RECIPE_SEQ,
                        help="the longest row; rows are seq/2..seq tokens")  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    attns = ("sdpa", "flash_attention_4", "flash_attention_2", "eager")
    parser.add_argument("--attn", default="sdpa", choices=attns, help="attn_implementation")
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_probe.md, .json")
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.seq < 2:
        parser.error("--tokens must be >= 1 and --seq >= 2")
    try:
        models = {m: tiny_config(attn_implementation=args.attn) if m == "tiny"
                  else qwen25_config(m, attn_implementation=args.attn)
                  for m in args.models.split(",") if m}  # fmt: skip
    except ValueError as exc:
        parser.error(str(exc))
    cuda = args.device.startswith("cuda")
    head = dict(device=torch.cuda.get_device_name(args.device) if cuda else
                f"CPU ({platform.machine()}, {os.cpu_count()} cores)", torch=torch.__version__,
                date=datetime.date.today().isoformat(), tokens=args.tokens, seq=args.seq,
                attn=args.attn)  # fmt: skip
    rows = [r for name, c in models.items() for r in probe_model(name, c, args.tokens, args.seq,
                                                                 args.device)]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(
        args.out / "gpu_probe.json", json.dumps({**head, "rows": [asdict(r) for r in rows]})
    )
    write_atomic(args.out / "gpu_probe.md", markdown(rows, head))
    print(markdown(rows, head), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

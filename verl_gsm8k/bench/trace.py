"""What the per-token trace costs: learn_tiny.sh with the trace on (TRACE_SAMPLES=4, the default)
and off (0), alternately, several runs each, one at a time.

    python -m verl_gsm8k.bench.trace                  # 3 runs on, 3 off, PPO, seed 0
    python -m verl_gsm8k.bench.trace --runs 2 --algo grpo

For each run: the median step time (verl's timing_s/step over steps 2..N: the first step warms up),
and, traced, the training thread's own time in the trace (timing_s/gsm8k_trace, outside verl's step
timer) and the trace's size per step. It prints the overhead both ways (traced minus untraced step
time, noisy on a shared CPU; and the trace's own time against the step time, direct), and the size
of a default trace of one GSM8K step of the 0.5B recipes, computed from the measured bytes per
traced token: 4 responses of up to 512 tokens after a ~150-token prompt, and the step line's
length of each of the step's 256 responses.

A benchmark, not a test. The warm start is built once before the first run (cached in CACHE_DIR).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from verl_gsm8k.bench.cpu_train import read_metrics
from verl_gsm8k.bench.learning import run_once
from verl_gsm8k.common.run_dir import TRACE_DIR

STEP, TRACE = "timing_s/step", "timing_s/gsm8k_trace"
# One step of recipes/ppo_qwen2.5-0.5b_gsm8k.sh: the default trace of it, on paper.
GSM8K_STEP = {"responses": 256, "traced": 4, "response_tokens": 512, "prompt_tokens": 150}


def trace_sizes(run_dir: Path) -> dict[str, float]:
    """Mean bytes per trace file, of its step line, and per traced token: a response token
    (its text, id, mask and every per-token number) and a prompt token (text and id)."""
    files = sorted((run_dir / TRACE_DIR).glob("*.jsonl"))
    sizes, heads = [], []
    prompt_bytes = prompt_tokens = response_bytes = response_tokens = 0
    for path in files:
        lines = path.read_text().splitlines()
        sizes.append(sum(len(line) + 1 for line in lines))
        heads.append(len(lines[0]) + 1)
        for line in lines[1:]:
            sample = json.loads(line)
            prompt = len(json.dumps(sample["prompt"]))
            prompt_bytes += prompt
            prompt_tokens += len(sample["prompt"]["ids"])
            response_bytes += len(line) + 1 - prompt
            response_tokens += len(sample["response"]["ids"])
    return {
        "files": len(files),
        "bytes_per_step": statistics.fmean(sizes) if sizes else 0.0,
        "step_line_bytes": statistics.fmean(heads) if heads else 0.0,
        "bytes_per_response_token": response_bytes / response_tokens if response_tokens else 0.0,
        "bytes_per_prompt_token": prompt_bytes / prompt_tokens if prompt_tokens else 0.0,
    }


def on_paper(sizes: dict[str, float], responses_in_run: int) -> float:
    """Bytes of a default trace of one 0.5B GSM8K step, from the measured bytes per token (the
    step line grows by one response length per response of the step)."""
    g = GSM8K_STEP
    sample = (g["response_tokens"] * sizes["bytes_per_response_token"]
              + g["prompt_tokens"] * sizes["bytes_per_prompt_token"])  # fmt: skip
    lengths = sizes["step_line_bytes"] / max(responses_in_run, 1) * g["responses"]
    return g["traced"] * sample + lengths


def measure(run: dict) -> dict:
    steps = read_metrics(Path(run["run_dir"]))
    times = [m[STEP] for s, m in sorted(steps.items()) if s >= 2 and STEP in m]
    traced = [m[TRACE] for s, m in sorted(steps.items()) if s >= 2 and TRACE in m]
    return {
        "step_s": statistics.median(times) if times else None,
        "trace_s": statistics.median(traced) if traced else None,
        "wall_s": run["wall_s"],
        "status": run["status"],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m verl_gsm8k.bench.trace", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=int, default=3, help="runs with the trace on, and off")
    parser.add_argument("--algo", choices=("ppo", "grpo"), default="ppo", help="ALGO")
    parser.add_argument("--seed", type=int, default=0, help="SEED of every run")
    parser.add_argument("--out", type=Path, help="run root (default: a new temp dir)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-trace-"))
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {"on": [], "off": []}
    sizes: dict[str, float] = {}
    for i in range(args.runs):
        for mode, samples in (("on", 4), ("off", 0)):
            name = f"trace_{mode}_{i}"
            print(f"bench.trace: run {i + 1}/{args.runs}, trace {mode} ...", flush=True)
            run = run_once(args.seed, args.algo, out, [f"TRACE_SAMPLES={samples}"], None, name)
            rows[mode].append(measure(run))
            if mode == "on" and not sizes:
                sizes = trace_sizes(Path(run["run_dir"]))
    on = [r["step_s"] for r in rows["on"] if r["step_s"]]
    off = [r["step_s"] for r in rows["off"] if r["step_s"]]
    own = [r["trace_s"] for r in rows["on"] if r["trace_s"] is not None]
    responses = 16 * 8  # learn_tiny: 16 prompts x rollout.n 8 per step
    summary = {
        "runs": rows,
        "step_s_on": statistics.fmean(on) if on else None,
        "step_s_off": statistics.fmean(off) if off else None,
        "trace_s": statistics.fmean(own) if own else None,
        "sizes": sizes,
        "gsm8k_step_bytes": on_paper(sizes, responses) if sizes else None,
    }  # fmt: skip
    if on and off and own:
        s = summary
        print(f"step time, median of steps 2..N, mean of {args.runs} runs: traced "
              f"{s['step_s_on']:.2f} s, untraced {s['step_s_off']:.2f} s "
              f"({100 * (s['step_s_on'] / s['step_s_off'] - 1):+.1f}%)")  # fmt: skip
        print(f"the trace's own time on the training thread: {1000 * s['trace_s']:.1f} ms a step "
              f"({100 * s['trace_s'] / s['step_s_on']:.2f}% of a traced step)")  # fmt: skip
        print(f"trace size: {sizes['bytes_per_step'] / 1024:.1f} KiB a step here "
              f"({sizes['bytes_per_response_token']:.0f} bytes per response token, "
              f"{sizes['bytes_per_prompt_token']:.0f} per prompt token); a 0.5B GSM8K "
              f"step on paper: {s['gsm8k_step_bytes'] / 1024:.0f} KiB")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if all(r["status"] == 0 for v in rows.values() for r in v) else 1


if __name__ == "__main__":
    sys.exit(main())

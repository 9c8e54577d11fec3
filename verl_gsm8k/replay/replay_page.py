"""``replay.html``: one PPO / GRPO iteration of a real run, token by token, in the order of the
loop (rollout, reward, reference KL, critic value, advantage and return, the update).

Written beside ``report.html`` by ``python -m verl_gsm8k.report RUN_DIR`` from the run's trace
(``load.py``): the page itself, ``replay/index.js`` (the traced steps and the default choice) and
``replay/step-<N>.js`` per step, loaded when the step is chosen. ``#step=N&sample=K&token=T`` in the
address selects a step, a sample and a focused token.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from verl_gsm8k.common.atomic_io import write_atomic
from verl_gsm8k.replay.assets import data_js, page, script, write_data
from verl_gsm8k.replay.load import Trace, TraceStep

PAGE_NAME = "replay.html"
DATA_DIRNAME = "replay"

# The update's metrics, each in one sentence (shown when the step logged it).
UPDATE_METRICS: dict[str, str] = {
    "actor/pg_loss": "the clipped surrogate loss the actor's update minimised (lower is better "
    "for the sampled tokens' advantages)",
    "actor/pg_clipfrac": "share of tokens whose probability ratio new/old left [1 - clip_low, "
    "1 + clip_high] and so stopped pulling",
    "actor/ppo_kl": "approximate KL between the policy before and after this update, on the "
    "sampled tokens: how far one step moved it",
    "actor/grad_norm": "the actor's gradient norm before clipping",
    "actor/lr": "the actor's learning rate at this step",
    "actor/entropy": "mean entropy of the actor's next-token distribution on the sampled tokens",
    "actor/reward_kl_penalty": "mean KL to the reference that the reward was charged (KL in the "
    "reward), before the coefficient",
    "actor/reward_kl_penalty_coeff": "the coefficient that KL was charged at",
    "actor/kl_loss": "KL to the reference as a loss term (GRPO), at the current policy",
    "critic/vf_loss": "the critic's regression loss toward the returns",
    "critic/vf_clipfrac": "share of values whose change was clipped (critic.cliprange_value)",
    "critic/vf_explained_var": "share of the returns' variance the values explain: 1 a perfect "
    "critic, 0 no better than a constant",
    "critic/grad_norm": "the critic's gradient norm before clipping",
    "critic/lr": "the critic's learning rate at this step",
    "training/rollout_probs_diff_max": "largest gap between vLLM's and the actor's probability of "
    "a sampled token: a stale weight sync shows here",
}


def _sample_payload(sample: dict[str, Any]) -> dict[str, Any]:
    response = sample.get("response") or {}
    prompt = sample.get("prompt") or {}
    return {
        "key": sample.get("key"),
        "uid": sample.get("uid"),
        "session": sample.get("session"),
        "score": sample.get("score"),
        "gt": sample.get("ground_truth"),
        "source": sample.get("data_source"),
        "extra": sample.get("reward_extra") or {},
        "prompt": "".join(prompt.get("tokens") or []),
        "tokens": response.get("tokens") or [],
        "ids": response.get("ids") or [],
        "pt": sample.get("per_token") or {},
        "absent": sample.get("absent") or {},
    }


def _mean_abs(values: list[Any]) -> float:
    nums = [abs(v) for v in values if isinstance(v, (int, float))]
    return sum(nums) / len(nums) if nums else 0.0


def default_choice(trace: Trace) -> tuple[int, int]:
    """(step, sample index) a page opens on: the latest step where a response earned reward (for
    GRPO, in a group whose scores differ), that response, the one with the most advantage."""
    for step in sorted(trace.steps, reverse=True):
        samples = trace.steps[step].samples
        scores = [s.get("score") or 0.0 for s in samples]
        if not samples or max(scores) <= 0 or (len(set(scores)) == 1 and len(samples) > 1):
            continue
        weights = [
            (score, _mean_abs((sample.get("per_token") or {}).get("advantage", [])))
            for score, sample in zip(scores, samples, strict=True)
        ]
        best = max(range(len(samples)), key=weights.__getitem__)
        return step, best
    last = max(trace.steps)
    return last, 0


KL_COEF_METRIC = "actor/reward_kl_penalty_coeff"  # verl: the coefficient charged at that step


def charged_kl_coef(head: dict[str, Any]) -> Any:
    """The KL coefficient of this step: what verl logged as charged (an adaptive controller moves
    it every step), else the run's setting (a fixed controller, or the KL as a loss term)."""
    logged = (head.get("metrics") or {}).get(KL_COEF_METRIC)
    return logged if logged is not None else ((head.get("run") or {}).get("kl") or {}).get("coef")


def _step_payload(ts: TraceStep) -> dict[str, Any]:
    head = ts.head
    return {
        "step": ts.step,
        "run": head.get("run") or {},
        "kl_coef": charged_kl_coef(head),
        "traced": head.get("traced"),
        "of": head.get("of"),
        "batch": {k: v for k, v in (head.get("batch") or {}).items() if k != "response_lengths"},
        "metrics": head.get("metrics") or {},
        "samples": [_sample_payload(s) for s in ts.samples],
    }


def write_replay(trace: Trace, out_dir: Path, run_name: str) -> Path:
    """Write the page and its data files under ``out_dir``; returns the page's path."""
    data_dir = out_dir / DATA_DIRNAME
    index = {"run": trace.run, "name": run_name, "steps": []}
    for step, ts in sorted(trace.steps.items()):
        write_data(data_dir, f"step-{step}.js", data_js("REPLAY", step, _step_payload(ts)))
        scores = [s.get("score") for s in ts.samples]
        known = scores and None not in scores  # null: NaN in the trace (a sick run): no mean
        index["steps"].append({"step": step, "n": len(ts.samples),
                               "mean": sum(scores) / len(scores) if known else None})  # fmt: skip
    step, sample = default_choice(trace)
    index["default"] = {"step": step, "sample": sample}
    index["explain"] = UPDATE_METRICS
    write_data(data_dir, "index.js", data_js("REPLAY_INDEX", "run", index))
    path = out_dir / PAGE_NAME
    write_atomic(path, page(f"Replay: {run_name}", _BODY.format(name=html.escape(run_name)),
                            script("replay.js"), [f"{DATA_DIRNAME}/index.js"]))  # fmt: skip
    return path


_BODY = """
<h1>One iteration, replayed: {name}</h1>
<div class=meta>A real step of this run, read back from <code>trace/&lt;step&gt;.jsonl</code>:
the numbers verl computed for a few responses, token by token, in the order of the loop.
<a href="report.html">Back to the report</a> &middot; <a href="rollouts.html">all rollouts</a>.
</div>
<nav><label>step <select id=step></select></label>
<label>response <select id=sample></select></label><span id=status class=why></span></nav>
<section id=rollout><h2>1. Rollout: the actor samples a response (vLLM)</h2>
<details><summary>prompt</summary><pre id=prompt></pre></details>
<div class=why>Tokens coloured by their advantage: <span class=legend>
<span style="background:#d73027"></span> negative <span style="background:#fff;border:1px solid
#ccc"></span> 0 <span style="background:#1a9850"></span> positive</span>. Hover or focus (Tab) a
token for all of its numbers.</div>
<div id=tokens class=toks></div></section>
<section id=reward><h2>2. Reward: the rule reads the <code>####</code> line</h2>
<div id=reward-body></div></section>
<section id=reference><h2>3. Reference: the KL penalty, token by token</h2>
<div id=kl-body></div></section>
<section id=critic><h2>4. Critic: the value of each state</h2><div id=value-body></div></section>
<section id=advantage><h2>5. Advantage and return</h2><div id=adv-body></div></section>
<section id=group><h2>Responses to the same prompt</h2><div id=group-body></div></section>
<section id=update><h2>6. Update: what this step's optimiser steps did</h2>
<div id=update-body></div></section>
<div id=panel>Focus a token to see its numbers.</div>
"""

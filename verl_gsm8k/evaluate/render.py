"""Render the comparison table (comparison.md) and the per-model samples (samples/*.md)."""

from __future__ import annotations

import re

from verl_gsm8k.evaluate.scoring import match_row, response_text, user_prompt

# verl 0.9.1's best@N (verl/trainer/ppo/metric_utils.py: process_validation_metrics,
# bootstrap_metric): 1000 draws of N of a question's N answers WITH replacement, the mean of each
# draw's best. A question with c of N right scores about 1 - (1 - c/N)^N there, pass@N 1.
BEST_AT_N = (
    "verl's best@N/mean is not this: it is a bootstrap (1000 draws of N of the N answers with "
    "replacement, the mean of each draw's best), about 1 - (1 - c/N)^N per question, so it sits "
    "below pass@N whenever a question has some but not all answers right (1 of 4 right: 0.68 "
    "against 1.0). Do not compare pass@k with best@N."
)


def pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}"


def pp(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.2f}"


def _how(gen: dict) -> str:
    if gen.get("samples_per_question", 1) > 1:
        return (
            f"sampled ({gen['samples_per_question']} answers per question, temperature "
            f"{gen['temperature']}, repetition_penalty {gen['repetition_penalty']})"
        )
    penalty = gen["repetition_penalty"]
    return f"greedy (temperature 0, do_sample false, repetition_penalty {penalty})"


def render_markdown(summary: dict) -> str:
    gen = summary["generation"]
    lines = [
        "# GSM8K evaluation",
        "",
        f"EvalScope {summary['evalscope_version']} (benchmark gsm8k "
        f"{summary.get('benchmark_version') or '?'}), data `{summary['data']['source']}` "
        f"(test split, {summary['data']['n_test']} rows"
        + (f", limit {summary['limit']}" if summary.get("limit") else "")
        + f"), baseline **{summary['baseline']}**. Generation: {_how(gen)}, max_tokens "
        f"{gen['max_tokens']} (from {gen.get('max_tokens_from') or 'unrecorded'}), batch size "
        f"{gen['batch_size'] or 'auto (8 local, 64 server)'}.",
        "",
        "| model | mode | accuracy % (EvalScope) | n | our reward acc % | Δ vs baseline (pp) "
        "| Δ our reward (pp) | backend |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in summary["results"]:
        model = r["model"] + (" (baseline)" if r["model"] == summary["baseline"] else "")
        if r.get("error"):
            lines.append(f"| {model} | {r['mode']} | failed | — | — | — | — | {r['backend']} |")
            continue
        lines.append(
            f"| {model} | {r['mode']} | {pct(r['accuracy'])} | {r['n']} "
            f"| {pct(r.get('our_reward_accuracy'))} | {pp(r.get('delta_vs_baseline'))} "
            f"| {pp(r.get('our_reward_delta_vs_baseline'))} | {r['backend']} |"
        )
    sampled = [r for r in summary["results"] if r.get("pass_at_k") is not None
               or r.get("our_reward_pass_at_k") is not None]  # fmt: skip
    if sampled:
        k = gen.get("samples_per_question")
        lines += [
            "",
            f"Sampled: {k} answers per question at temperature {gen.get('temperature')}; the "
            "accuracies above are mean@k (over every answer): compare them with verl's mean@N "
            "validation metric. pass@k below is the unbiased estimate, per question "
            "1 - C(n-c,k)/C(n,k) over its n answers with c right (Chen et al. 2021). "
            f"{BEST_AT_N}",
            "",
            "| model | mode | pass@k % (EvalScope) | pass@k % (our reward) |",
            "|---|---|---:|---:|",
        ]
        lines += [
            f"| {r['model']} | {r['mode']} | {pct(r.get('pass_at_k'))} "
            f"| {pct(r.get('our_reward_pass_at_k'))} |"
            for r in sampled
        ]
    lines += ["", "## Modes", ""]
    for mode, info in summary["modes"].items():
        template = info["prompt_template"].replace("{{", "{").replace("}}", "}")
        template = template.replace("\n", "\\n")
        lines.append(
            f"- **{mode}**: {info['few_shot']}-shot, scorer: {info['scorer']}; prompt template "
            f"`{template}`. {info['comparable_to']}"
        )
    failed = [r for r in summary["results"] if r.get("error")]
    if failed:
        lines += ["", "## Failures", ""]
        for r in failed:
            first = r["error"].strip().splitlines()[0] if r["error"].strip() else "error"
            lines.append(f"- {r['model']} / {r['mode']}: {first}")
    lines += [
        "",
        "Accuracies from different prompts, few-shot settings or EvalScope releases are not "
        "comparable; compare rows of the same mode only. Samples: `samples/`.",
        "",
    ]
    return "\n".join(lines)


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def render_samples(
    label: str,
    mode: str,
    records: list[dict],
    reviews: dict[int, dict],
    ours: dict[int, dict] | None,
    rows: list[dict],
    ground_truth,
    k: int,
    header: str,
) -> str:
    lines = [
        f"# {label}: {mode} mode, first {min(k, len(records))} of {len(records)}",
        "",
        header,
        "",
    ]
    for record in sorted(records, key=lambda r: r.get("index", 0))[:k]:
        index = record.get("index")
        row = match_row(record, rows)
        review = reviews.get(index, {})
        response = response_text(record)
        fence = _fence(response)
        es = review.get("score")
        verdicts = [f"EvalScope {'correct' if es else 'wrong'} ({es})"]
        if ours is not None and index in ours:
            verdicts.append(f"our reward acc {ours[index]['acc']:.0f}")
        lines += [
            f"## test #{index}: {', '.join(verdicts)}",
            "",
            f"**Question:** {row['question'] if row else user_prompt(record)}",
            "",
            f"**Ground truth:** {ground_truth(row['answer']) if row else review.get('target')}"
            f" | **EvalScope extracted:** `{review.get('extracted')}`",
            "",
            "<details><summary>prompt sent (last user message)</summary>",
            "",
            _fence(user_prompt(record)) + "text",
            user_prompt(record),
            _fence(user_prompt(record)),
            "",
            "</details>",
            "",
            "**Response:**",
            "",
            fence + "text",
            response,
            fence,
            "",
        ]
    return "\n".join(lines)

"""The pages: comparison.md (and a sweep's table by step) and samples/<model>-<mode>.md."""

import re

from verl_gsm8k.common.run_dir import BEST_FILE
from verl_gsm8k.evaluate.scoring import match_row, said

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


def render_markdown(summary: dict) -> str:
    gen, results, base = summary["generation"], summary["results"], summary["baseline"]
    k = gen.get("samples_per_question", 1)
    how = (f"sampled ({k} answers per question, temperature {gen['temperature']}, " if k > 1
           else "greedy (temperature 0, do_sample false, ")  # fmt: skip
    limit = f", limit {summary['limit']}" if summary.get("limit") else ""
    lines = [
        "# GSM8K evaluation", "",
        f"EvalScope {summary['evalscope_version']} (benchmark gsm8k "
        f"{summary.get('benchmark_version') or '?'}), data `{summary['data']['source']}` (test "
        f"split, {summary['data']['n_test']} rows{limit}), baseline **{base}**. Generation: "
        f"{how}repetition_penalty {gen['repetition_penalty']}), max_tokens {gen['max_tokens']} "
        f"(from {gen.get('max_tokens_from') or 'unrecorded'}), batch size "
        f"{gen['batch_size'] or 'auto (8 local, 64 server)'}.", "",
        "| model | mode | accuracy % (EvalScope) | n | our reward acc % | Δ vs baseline (pp) "
        "| Δ our reward (pp) | backend |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for r in results:
        cells = ["failed", "—", "—", "—", "—"] if r.get("error") else [
            pct(r["accuracy"]), r["n"], pct(r.get("our_reward_accuracy")),
            pp(r.get("delta_vs_baseline")), pp(r.get("our_reward_delta_vs_baseline"))]  # fmt: skip
        model = r["model"] + " (baseline)" * (r["model"] == base)
        lines.append(f"| {model} | {r['mode']} | {' | '.join(map(str, cells))} | {r['backend']} |")
    tools = [f"- {r['model']} / {r['mode']}: the tool called in {pct(r['tool_call_rate'])}% of "
             f"the answers ({pct(r.get('accuracy_with_call'))}% right)"
             for r in results if r.get("tool_call_rate") is not None]  # fmt: skip
    lines += ["", *tools] if tools else []
    sampled = [r for r in results if r.get("pass_at_k") is not None
               or r.get("our_reward_pass_at_k") is not None]  # fmt: skip
    if sampled:
        lines += [
            "", f"Sampled: {k} answers per question at temperature {gen.get('temperature')}; "
            "the accuracies above are mean@k (over every answer): compare them with verl's "
            "mean@N validation metric. pass@k below is the unbiased estimate, per question "
            "1 - C(n-c,k)/C(n,k) over its n answers with c right (Chen et al. 2021). "
            f"{BEST_AT_N}", "",
            "| model | mode | pass@k % (EvalScope) | pass@k % (our reward) |",
            "|---|---|---:|---:|",
            *(f"| {r['model']} | {r['mode']} | {pct(r.get('pass_at_k'))} "
              f"| {pct(r.get('our_reward_pass_at_k'))} |" for r in sampled),
        ]  # fmt: skip
    lines += ["", "## Modes", ""]
    for mode, info in summary["modes"].items():
        template = info["prompt_template"].replace("{{", "{").replace("}}", "}")
        lines.append(f"- **{mode}**: {info['few_shot']}-shot, scorer: {info['scorer']}; prompt "
                     f"template `{template.replace(chr(10), chr(92) + 'n')}`. "
                     f"{info['comparable_to']}")  # fmt: skip
    failed = [f"- {r['model']} / {r['mode']}: {r['error'].strip().splitlines()[0]}"
              for r in results if r.get("error")]  # fmt: skip
    lines += ["", "## Failures", "", *failed] if failed else []
    lines += ["", "Accuracies from different prompts, few-shot settings or EvalScope releases are "
              "not comparable; compare rows of the same mode only. Samples: `samples/`.",
              ""]  # fmt: skip
    return "\n".join(lines)


def render_steps(summary: dict) -> str:
    sweep, best = summary["sweep"], summary["sweep"].get("best_checkpoint") or {}
    lines = [f"# Checkpoints of {sweep['run_dir']}", "", f"Step 0 is the starting model, "
             f"`{sweep['starting_model']}`; every checkpoint was merged and evaluated the same "
             "way (settings below). Accuracy % by step:", "",
             "| step | mode | accuracy % (EvalScope) | our reward acc % | n |",
             "|---:|---|---:|---:|---:|"]  # fmt: skip
    metric = str(best.get("metric", ""))
    name = "val acc" if metric.startswith("val-core/") and "/acc/" in metric else metric
    for r in summary["results"]:
        step = r["step"]
        step = f"{step} best ({name} {best['value']:.4g})" if step == best.get("step") else step
        lines.append(f"| {step} | {r['mode']} | failed: {r['error'][:90]} | | |" if r.get("error")
                     else f"| {step} | {r['mode']} | {pct(r.get('accuracy'))} "
                     f"| {pct(r.get('our_reward_accuracy'))} | {r.get('n')} |")  # fmt: skip
    if best:
        lines += ["", f"The run's kept best checkpoint (`{BEST_FILE}`): step {best['step']}, "
                  f"{metric} = {best['value']:.4g}; `bash scripts/merge.sh {sweep['run_dir']} "
                  "OUT --best` merges it."]  # fmt: skip
    return "\n".join(lines) + "\n\n"


def _fenced(text: str) -> list[str]:
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    return [fence + "text", text, fence]


def render_samples(label: str, mode: str, header: str, records: list[dict], reviews: dict,
                   ours: dict | None, rows: list[dict], k: int) -> str:  # fmt: skip
    from data_prep.gsm8k import ground_truth

    lines = [f"# {label}: {mode} mode, first {min(k, len(records))} of {len(records)}", "",
             header, ""]  # fmt: skip
    for record in sorted(records, key=lambda r: r.get("index", 0))[:k]:
        index, row, prompt = record.get("index"), match_row(record, rows), said(record, "user")
        review = reviews.get(index, {})
        score = review.get("score")
        verdict = f"EvalScope {'correct' if score else 'wrong'} ({score})"
        if ours is not None and index in ours:
            verdict += f", our reward acc {ours[index]['acc']:.0f}"
        truth = ground_truth(row["answer"]) if row else review.get("target")
        lines += [
            f"## test #{index}: {verdict}", "",
            f"**Question:** {row['question'] if row else prompt}", "",
            f"**Ground truth:** {truth} | **EvalScope extracted:** `{review.get('extracted')}`",
            "", "<details><summary>prompt sent (last user message)</summary>", "",
            *_fenced(prompt), "", "</details>", "", "**Response:**", "",
            *_fenced(said(record, "assistant")), "",
        ]  # fmt: skip
    return "\n".join(lines)

"""The comparison as one offline HTML page: no script, no stylesheet or image to fetch.

The x axis (step, samples seen, wall time) is chosen with three radio buttons: each axis has
its own set of charts, and CSS shows the set whose button is checked.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from typing import Any

from verl_gsm8k.analysis.vocab import metric_label
from verl_gsm8k.compare.charts import AXIS_TITLES, build_charts, colour, eval_chart, x_range
from verl_gsm8k.compare.diff import ConfigDiff
from verl_gsm8k.compare.runs import AXES, Run
from verl_gsm8k.runpage.html import CSS, duration, num
from verl_gsm8k.svgplot.chart import render_line_plot

_AXIS_CSS = (
    ".axis-set{display:none;flex-wrap:wrap;gap:14px;margin-top:10px}"
    + ",".join(f"#x-{axis}:checked~#set-{axis}" for axis in AXES)
    + "{display:flex}"
    ".axis-choice label{margin-right:14px} .swatch{display:inline-block;width:10px;height:10px;"
    "margin-right:5px} .missing-key{color:#999;font-style:italic}"
)
esc = html.escape


def _value(value: Any) -> str:
    if isinstance(value, str):
        return esc(value)
    return esc(json.dumps(value, default=str))


def _devices(table: dict) -> str:
    """The device count, with the device when trainer.device is not cuda ("1 cpu")."""
    device = table.get("device")
    suffix = f" {device}" if device and device != "cuda" else ""
    return num(table["n_gpus"]) + suffix


def _acc(point: dict[str, Any] | None) -> str:
    return f"{point['value']:.3f} @ {point['step']}" if point else "n/a"


def _table(runs: Sequence[Run], tables: dict[str, dict[str, Any]]) -> list[str]:
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("first validation accuracy", lambda t: _acc(t["val_first"])),
        ("best validation accuracy (step)", lambda t: _acc(t["val_best"])),
        ("last validation accuracy", lambda t: _acc(t["val_last"])),
        ("final train score (median of last 10)", lambda t: num(t["train_score_final_median_10"])),
        ("steps", lambda t: str(t["steps"])),
        ("wall time (steps + validation)", lambda t: duration(t["wall_time_s"])),
        ("mean step time", lambda t: f"{num(t['mean_step_time_s'])} s"),
        (
            "tokens/s",
            lambda t: (
                (f"{t['tokens_per_s']:.0f}" if t["tokens_per_s"] else "n/a")
                + (" (estimated)" if t["tokens_per_s_estimated"] else "")
            ),
        ),
        ("devices (n_gpus_per_node x nnodes)", _devices),
        ("device hours", lambda t: num(t["gpu_hours"], 3)),
        ("samples per step (batch x rollout.n)", lambda t: num(t["samples_per_step"])),
    ]
    out = ['<table id="runs-table"><tr><th></th>']
    out += [f"<th>{_swatch(i)}{esc(r.label)}</th>" for i, r in enumerate(runs)]
    out.append("</tr>")
    for name, cell in rows:
        out.append(f"<tr><td>{esc(name)}</td>")
        out += [f"<td>{esc(cell(tables[r.label]))}</td>" for r in runs]
        out.append("</tr>")
    out.append("</table>")
    return out


def _swatch(index: int) -> str:
    return f'<span class="swatch" style="background:{colour(index)}"></span>'


def _curves(runs: Sequence[Run]) -> list[str]:
    out = ['<h2>Curves</h2><div class="axis-choice">x axis: ']
    for i, axis in enumerate(AXES):
        checked = " checked" if i == 0 else ""
        out.append(
            f'<input type="radio" name="x-axis" id="x-{axis}"{checked}>'
            f'<label for="x-{axis}">{esc(AXIS_TITLES[axis])}</label>'
        )
    for axis, meaning in AXES.items():
        out.append(f'<div class="axis-set" id="set-{axis}">')
        missing = [why for run in runs if (why := run.why_not(axis))]
        out.append(
            f'<p class="meta" style="width:100%">{esc(meaning)}.'
            + "".join(f" Not drawn: {esc(m)}." for m in missing)
            + " Noisy per-step metrics: the rolling median in bold, the raw values faint.</p>"
        )
        span = x_range(runs, axis)
        plots = build_charts(runs, axis)
        evals = eval_chart(runs, axis)
        out += [render_line_plot(plot, span) for plot in plots]
        if evals is not None:
            out.append(render_line_plot(evals, span))
        out.append("</div>")
    out.append("</div>")
    return out


def _diff(diff: ConfigDiff, runs: Sequence[Run]) -> list[str]:
    out = ["<h2>Config diff</h2>"]
    for run in runs:
        out.append(f'<p class="meta">{esc(run.label)}: config from {esc(run.config.source)}</p>')
    if diff.not_compared:
        out += [
            f'<p class="config-missing">{esc(label)}: {esc(why)}; its config is not compared.</p>'
            for label, why in diff.not_compared.items()
        ]
    if len(diff.compared) < 2:
        out.append("<p>Fewer than two runs have a config: nothing to diff.</p>")
        return out
    if not diff.rows:
        out.append('<p class="ok">The configs are the same.</p>')
        return out
    labels = diff.compared
    out.append('<table id="config-diff"><tr><th>key</th><th>set by</th>')
    out += [f"<th>{esc(label)}</th>" for label in labels]
    out.append("</tr>")
    for group, rows in diff.by_group().items():
        out.append(f'<tr class="group"><th colspan="{len(labels) + 2}">{esc(group)}</th></tr>')
        for row in rows:
            setter = ", ".join(row.knobs) + (" (user key=value)" if row.user_override else "")
            out.append(
                f'<tr class="diff-row" data-key="{esc(row.key)}"><td><code>{esc(row.key)}</code>'
                f"</td><td>{esc(setter)}</td>"
            )
            for label in labels:
                if label in row.values:
                    out.append(f"<td>{_value(row.values[label])}</td>")
                else:
                    out.append('<td class="missing-key">not in its config</td>')
            out.append("</tr>")
    out.append("</table>")
    return out


def _some_runs(only: dict[str, list[str]], runs: Sequence[Run]) -> list[str]:
    out = ["<h2>Metrics not logged by every run</h2>"]
    if not only:
        return out + ["<p>Every run logged the same metrics.</p>"]
    out.append('<table id="metrics-some-runs"><tr><th>metric</th><th>meaning</th>')
    out += [f"<th>{esc(r.label)}</th>" for r in runs]
    out.append("</tr>")
    for name, labels in only.items():
        out.append(f"<tr><td><code>{esc(name)}</code></td><td>{esc(metric_label(name))}</td>")
        out += [f"<td>{'logged' if r.label in labels else '-'}</td>" for r in runs]
        out.append("</tr>")
    return out + ["</table>"]


def _health(runs: Sequence[Run]) -> list[str]:
    out = ['<h2>Health checks, side by side</h2><table id="health"><tr><th>check</th>']
    out += [f"<th>{esc(r.label)}</th>" for r in runs]
    out.append("</tr><tr><td>errors / warnings / notes</td>")
    for run in runs:
        c = run.summary["health_counts"]
        out.append(f"<td>{c['error']} / {c['warning']} / {c['note']}</td>")
    out.append("</tr>")
    checks = sorted({f.check for run in runs for f in run.findings})
    for check in checks:
        out.append(f'<tr class="check"><td>{esc(check)}</td>')
        for run in runs:
            hits = [f for f in run.findings if f.check == check]
            cell = "<br>".join(
                f'<span class="sev-{f.severity}">{f.severity}</span> steps {f.start_step}-'
                f"{f.end_step}: {esc(f.message)}"
                for f in hits
            )
            out.append(f"<td>{cell or '-'}</td>")
        out.append("</tr>")
    out.append("</table>")
    if not checks:
        out.append('<p class="ok">No check fired in any run.</p>')
    return out + [
        '<p class="meta">What each check means: <code>docs/reading-a-ppo-run.md</code>.</p>'
    ]


def _evals(runs: Sequence[Run], info: dict[str, dict[str, Any] | None]) -> list[str]:
    out: list[str] = []
    for run in runs:
        item = info[run.label]
        if run.evals is None or item is None:
            continue
        text = item["agreement_text"] if item["rows"] else "no usable row"
        out.append(
            f"<li>{esc(run.label)} (<code>{esc(str(run.evals.path))}</code>, "
            f"{len(item['rows'])} checkpoints): {esc(text)}</li>"
        )
    return ["<h2>Checkpoint evaluations</h2><ul>", *out, "</ul>"] if out else []


def render_page(
    runs: Sequence[Run],
    summary: dict[str, Any],
    diff: ConfigDiff,
) -> str:
    """The whole comparison as one HTML document."""
    labels = " vs ".join(r.label for r in runs)
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(labels)} - run comparison</title><style>{CSS}{_AXIS_CSS}</style></head>",
        f"<body><h1>Run comparison: {esc(labels)}</h1>",
        f'<p class="meta">generated {esc(summary["generated_at"])}</p><ul class="meta">',
    ]
    for i, run in enumerate(runs):
        sources = ", ".join(f"<code>{esc(s)}</code>" for s in run.data.sources)
        body.append(
            f"<li>{_swatch(i)}<b>{esc(run.label)}</b>: {esc(str(run.path))} ({sources})</li>"
        )
    body.append("</ul>")
    if summary.get("questions_page"):
        link = esc(summary["questions_page"])
        body.append(
            f'<p><a id="questions-link" href="{link}">which questions changed '
            f"(each run's {esc(summary.get('questions_step', 'last'))} validation step, question "
            "by question)</a></p>"
        )
    body += _table(runs, {r["label"]: r["table"] for r in summary["runs"]})
    body += _curves(runs)
    body += _evals(runs, {r["label"]: r["checkpoint_evals"] for r in summary["runs"]})
    body += _diff(diff, runs)
    body += _some_runs(summary["metrics_in_some_runs"], runs)
    body += _health(runs)
    issues = [(r.label, str(i)) for r in runs for i in r.data.issues]
    issues += [
        (r.label, f"{r.evals.path}: {r.evals.problem}") for r in runs if r.evals and r.evals.problem
    ]
    if issues:
        body.append("<h2>Input problems (the rest was used)</h2><ul>")
        body += [f"<li>{esc(label)}: <code>{esc(text)}</code></li>" for label, text in issues]
        body.append("</ul>")
    body.append("</body></html>")
    return "\n".join(body)

"""comparison.html: a chart per headline metric, a line per run, against each x axis (radio
buttons and CSS, no script, show one axis' charts)."""

import json
from collections.abc import Sequence
from html import escape
from typing import Any

from verl_gsm8k.analysis.evals import eval_series
from verl_gsm8k.compare.config import ConfigDiff
from verl_gsm8k.compare.runs import AXES, Run
from verl_gsm8k.guard.thresholds import THRESHOLDS
from verl_gsm8k.guard.vocab import CUT_SHARE, metric_label
from verl_gsm8k.runpage.html import duration, num
from verl_gsm8k.runpage.plots import with_trend
from verl_gsm8k.svgplot.chart import PALETTE, Line, Plot, render_line_plot
from verl_gsm8k.svgplot.page import Raw, page, table

# chart id, title, canonical metric, y label, log y (None: from the data)
CHARTS = (
    ("val_acc", "Validation accuracy", "val_acc", "accuracy", False),
    ("score", "Train score (critic/score/mean)", "score", "score", False),
    ("kl", "KL in the reward (actor/reward_kl_penalty)", "kl", "KL", False),
    ("kl_loss", "KL as a loss (actor/kl_loss)", "kl_loss", "KL", False),
    ("response_length", "Response length (mean)", "response_length_mean", "tokens", False),
    ("clip_ratio", "Share of responses cut at data.max_response_length", CUT_SHARE, "share",
     False),
    ("entropy", "Policy entropy", "entropy", "nats", False),
    ("vf_loss", "Value loss (critic/vf_loss)", "vf_loss", "loss", None),
    ("vf_explained_var", "Value explained variance", "vf_explained_var", "explained var", False),
    ("pg_clipfrac", "Policy clip fraction (actor/pg_clipfrac)", "pg_clipfrac", "fraction", False),
    ("step_time", "Step time", "step_time", "seconds", False),
    ("throughput", "Throughput (tokens/s per GPU)", "throughput", "tokens/s", False),
)  # fmt: skip
AXIS_TITLES = {"step": "by step", "samples": "by samples seen", "wall_time": "by wall time"}
STYLE = (".axis-set{display:none;flex-wrap:wrap;gap:14px;margin-top:10px}"
         + ",".join(f"#x-{axis}:checked~#set-{axis}" for axis in AXES) + "{display:flex}"
         ".swatch{display:inline-block;width:10px;height:10px;margin-right:5px}"
         ".missing-key{color:#999;font-style:italic}")  # fmt: skip


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def _swatch(index: int) -> str:
    return f'<span class="swatch" style="background:{colour(index)}"></span>'


def _scale(axis: str, runs: Sequence[Run]) -> tuple[float, str]:
    """(units per x unit, the x axis' name): hours past two hours, else minutes."""
    if axis != "wall_time":
        return 1.0, {"step": "step", "samples": "samples seen"}[axis]
    hours = max((r.wall_until[-1] for r in runs if r.wall_until), default=0.0) > 7200
    return (3600.0, "h") if hours else (60.0, "min")


def on_axis(run: Run, axis: str, points: Sequence[tuple[int, float]], scale: float = 1.0
            ) -> list[tuple[float, float]]:  # fmt: skip
    out = []
    for step, value in points:
        x = run.x(axis, step)
        if x is None:
            return []
        out.append((x / scale, value))
    return out


def build_charts(runs: Sequence[Run], axis: str) -> list[Plot]:
    scale, unit = _scale(axis, runs)
    label = f"wall time ({unit}, cumulative step time)" if axis == "wall_time" else unit
    plots = []
    for chart_id, title, metric, y_label, log_y in CHARTS:
        lines: list[Line] = []
        for i, run in enumerate(runs):
            points = on_axis(run, axis, run.canon.series.get(metric, []), scale)
            lines += ([Line(run.label, points, colour(i), width=2.0, dots=True)]
                      if metric == "val_acc" and points
                      else with_trend(run.label, points, colour(i), THRESHOLDS.window))  # fmt: skip
        plots.append(Plot(f"{chart_id}-{axis}", f"{title} {AXIS_TITLES[axis]}", lines, y_label,
                          log_y, missing="no run logged it", x_label=label))  # fmt: skip
    lines = []
    for i, run in enumerate(runs):
        if run.evals and run.evals.rows:
            val = on_axis(run, axis, run.canon.series.get("val_acc", []), scale)
            ours = on_axis(run, axis, eval_series(run.evals.rows)[0], scale)
            lines += [Line(f"{run.label} verl validation", val, colour(i)),
                      Line(f"{run.label} our reward (checkpoints)", ours, colour(i), 2.0, True,
                           dashed=True)]  # fmt: skip
    if lines:
        plots.append(Plot(f"checkpoint_eval-{axis}", "Checkpoint evaluations: our reward vs "
                          f"verl's validation accuracy {AXIS_TITLES[axis]}", lines, "accuracy",
                          False, x_label=label))  # fmt: skip
    return plots


def x_range(runs: Sequence[Run], axis: str) -> tuple[float, float]:
    scale = _scale(axis, runs)[0]
    xs = []
    for run in runs:
        steps = run.canon.all_steps + [e.step for e in (run.evals.rows if run.evals else [])]
        xs += [x / scale for s in (min(steps), max(steps)) if (x := run.x(axis, s)) is not None]
    xs += [0.0] * (axis != "step")
    return (min(xs), max(xs)) if xs else (0.0, 1.0)


def _curves(runs: Sequence[Run]) -> list[str]:
    out = ['<h2>Curves</h2><div class="axis-choice">x axis: ']
    out += [f'<input type="radio" name="x-axis" id="x-{axis}"{" checked" * (i == 0)}>'
            f'<label for="x-{axis}">{AXIS_TITLES[axis]}</label> '
            for i, axis in enumerate(AXES)]  # fmt: skip
    for axis, meaning in AXES.items():
        missing = "".join(f" Not drawn: {escape(w)}." for r in runs if (w := r.why_not(axis)))
        span = x_range(runs, axis)
        out.append(f'<div class="axis-set" id="set-{axis}"><p class="meta" style="width:100%">'
                   f"{escape(meaning)}.{missing} Noisy per-step metrics: the rolling median in "
                   "bold, the raw values faint.</p>")  # fmt: skip
        out += [render_line_plot(plot, span) for plot in build_charts(runs, axis)] + ["</div>"]
    return [*out, "</div>"]


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _diff(diff: ConfigDiff, runs: Sequence[Run]) -> list[str]:
    out = ["<h2>Config diff</h2>"]
    out += [f'<p class="meta">{escape(r.label)}: config from {escape(r.config.source)}</p>'
            for r in runs]  # fmt: skip
    out += [f'<p class="config-missing">{escape(label)}: {escape(why)}; its config is not '
            "compared.</p>" for label, why in diff.not_compared.items()]  # fmt: skip
    if len(diff.compared) < 2:
        return [*out, "<p>Fewer than two runs have a config: nothing to diff.</p>"]
    if not diff.rows:
        return [*out, '<p class="ok">The configs are the same.</p>']
    labels = diff.compared
    cells = ['<table id="config-diff"><tr><th>key</th><th>set by</th>']
    cells += [f"<th>{escape(label)}</th>" for label in labels] + ["</tr>"]
    for group, rows in diff.by_group().items():
        cells.append(f'<tr class="group"><th colspan="{len(labels) + 2}">{escape(group)}</th>')
        for row in rows:
            setter = ", ".join(row.knobs) + " (user key=value)" * row.user_override
            values = [f"<td>{escape(_value(row.values[x]))}</td>" if x in row.values
                      else '<td class="missing-key">not in its config</td>'
                      for x in labels]  # fmt: skip
            cells.append(f'<tr class="diff-row" data-key="{escape(row.key)}"><td><code>'
                         f"{escape(row.key)}</code></td><td>{escape(setter)}</td>"
                         + "".join(values) + "</tr>")  # fmt: skip
    return [*out, "\n".join(cells) + "</table>"]


def _health(runs: Sequence[Run]) -> list[str]:
    counts = ["{error} / {warning} / {note}".format(**r.summary["health_counts"]) for r in runs]
    checks = sorted({f.check for run in runs for f in run.findings})
    rows = [["errors / warnings / notes", *counts]]
    for check in checks:
        hits = [[f'<span class="sev-{f.severity}">{f.severity}</span> steps {f.start_step}-'
                 f"{f.end_step}: {escape(f.message)}" for f in r.findings if f.check == check]
                for r in runs]  # fmt: skip
        rows.append([check, *(Raw("<br>".join(hit) or "-") for hit in hits)])
    return ["<h2>Health checks, side by side</h2>",
            table(["check", *(r.label for r in runs)], rows, ' id="health"'),
            '<p class="ok">No check fired in any run.</p>' * (not checks),
            '<p class="meta">What each check means: <code>docs/reading-a-ppo-run.md</code>.'
            "</p>"]  # fmt: skip


def _table(runs: Sequence[Run], tables: dict[str, dict[str, Any]]) -> str:
    def acc(point: dict[str, Any] | None) -> str:
        return f"{point['value']:.3f} @ {point['step']}" if point else "n/a"

    def devices(t: dict[str, Any]) -> str:
        return num(t["n_gpus"]) + (f" {t['device']}" if t["device"] not in (None, "cuda") else "")

    rows = {
        "first validation accuracy": lambda t: acc(t["val_first"]),
        "best validation accuracy (step)": lambda t: acc(t["val_best"]),
        "last validation accuracy": lambda t: acc(t["val_last"]),
        "final train score (median of last 10)": lambda t: num(t["train_score_final_median_10"]),
        "steps": lambda t: str(t["steps"]),
        "wall time (steps + validation)": lambda t: duration(t["wall_time_s"]),
        "mean step time": lambda t: f"{num(t['mean_step_time_s'])} s",
        "tokens/s": lambda t: (f"{t['tokens_per_s']:.0f}" if t["tokens_per_s"] else "n/a")
        + " (estimated)" * t["tokens_per_s_estimated"],
        "devices (n_gpus_per_node x nnodes)": devices,
        "device hours": lambda t: num(t["gpu_hours"], 3),
        "samples per step (batch x rollout.n)": lambda t: num(t["samples_per_step"]),
    }  # fmt: skip
    head = ["", *(Raw(_swatch(i) + escape(r.label)) for i, r in enumerate(runs))]
    body = [[name, *(cell(tables[r.label]) for r in runs)] for name, cell in rows.items()]
    return table(head, body, ' id="runs-table"')


def render_page(runs: Sequence[Run], summary: dict[str, Any], diff: ConfigDiff) -> str:
    labels = " vs ".join(r.label for r in runs)
    body = [
        f"<h1>Run comparison: {escape(labels)}</h1>",
        f'<p class="meta">generated {escape(summary["generated_at"])}</p><ul class="meta">',
    ]
    body += [f"<li>{_swatch(i)}<b>{escape(r.label)}</b>: {escape(str(r.path))} ("
             + ", ".join(f"<code>{escape(s)}</code>" for s in r.data.sources) + ")</li>"
             for i, r in enumerate(runs)] + ["</ul>"]  # fmt: skip
    if summary.get("questions_page"):
        body.append(f'<p><a id="questions-link" href="{escape(summary["questions_page"])}">which '
                    f"questions changed (each run's {escape(summary['questions_step'])} "
                    "validation step, question by question)</a></p>")  # fmt: skip
    body += [_table(runs, {r["label"]: r["table"] for r in summary["runs"]}), *_curves(runs)]
    evals = []
    for run, info in zip(runs, (x["checkpoint_evals"] for x in summary["runs"]), strict=True):
        if run.evals and info:
            said = info["agreement_text"] if info["rows"] else "no usable row"
            evals.append(f"<li>{escape(run.label)} (<code>{escape(str(run.evals.path))}</code>, "
                         f"{len(info['rows'])} checkpoints): {escape(said)}</li>")  # fmt: skip
    body += ["<h2>Checkpoint evaluations</h2><ul>", *evals, "</ul>"] if evals else []
    body += _diff(diff, runs)
    some = summary["metrics_in_some_runs"]
    rows = [[Raw(f"<code>{escape(n)}</code>"), metric_label(n),
             *("logged" if r.label in some[n] else "-" for r in runs)] for n in some]  # fmt: skip
    head = ["metric", "meaning", *(r.label for r in runs)]
    body += ["<h2>Metrics not logged by every run</h2>",
             table(head, rows, ' id="metrics-some-runs"') if some
             else "<p>Every run logged the same metrics.</p>"]  # fmt: skip
    body += _health(runs)
    issues = [(r.label, i) for r in runs for i in r.summary["parse_issues"]]
    issues += [(r.label, f"{r.evals.path}: {r.evals.problem}") for r in runs
               if r.evals and r.evals.problem]  # fmt: skip
    if issues:
        items = "".join(f"<li>{escape(k)}: <code>{escape(v)}</code></li>" for k, v in issues)
        body.append(f"<h2>Input problems (the rest was used)</h2><ul>{items}</ul>")
    return page(f"{labels} - run comparison", body, STYLE)

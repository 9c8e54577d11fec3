"""The comparison's charts: each headline metric with one line per run, against each x axis.

Drawn as the run report draws its own: with verl_gsm8k/svgplot/ (Plot, Line, render_line_plot)
and the report's trend (verl_gsm8k/runpage/plots.py: with_trend, raw values faint under a rolling
median); only the x of each point changes with the axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verl_gsm8k.analysis.evals import eval_series
from verl_gsm8k.analysis.parse import Series
from verl_gsm8k.analysis.thresholds import THRESHOLDS
from verl_gsm8k.analysis.vocab import CUT_SHARE
from verl_gsm8k.compare.runs import Run
from verl_gsm8k.runpage.plots import with_trend
from verl_gsm8k.svgplot.chart import PALETTE, Line, Plot


@dataclass(frozen=True)
class Chart:
    """A headline metric: chart id, title, canonical metric (verl_gsm8k/analysis/vocab.py), y."""

    chart_id: str
    title: str
    metric: str
    y_label: str
    log_y: bool | None = False


CHARTS = (
    Chart("val_acc", "Validation accuracy", "val_acc", "accuracy"),
    Chart("score", "Train score (critic/score/mean)", "score", "score"),
    Chart("kl", "KL in the reward (actor/reward_kl_penalty)", "kl", "KL"),
    Chart("kl_loss", "KL as a loss (actor/kl_loss)", "kl_loss", "KL"),
    Chart("response_length", "Response length (mean)", "response_length_mean", "tokens"),
    Chart(
        "clip_ratio",
        "Share of responses cut at data.max_response_length",
        CUT_SHARE,
        "share",
    ),
    Chart("entropy", "Policy entropy", "entropy", "nats"),
    Chart("vf_loss", "Value loss (critic/vf_loss)", "vf_loss", "loss", log_y=None),
    Chart("vf_explained_var", "Value explained variance", "vf_explained_var", "explained var"),
    Chart("pg_clipfrac", "Policy clip fraction (actor/pg_clipfrac)", "pg_clipfrac", "fraction"),
    Chart("step_time", "Step time", "step_time", "seconds"),
    Chart("throughput", "Throughput (tokens/s per GPU)", "throughput", "tokens/s"),
)
AXIS_TITLES = {"step": "by step", "samples": "by samples seen", "wall_time": "by wall time"}
EVAL_CHART = "checkpoint_eval"


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def wall_unit(runs: Sequence[Run]) -> tuple[str, float]:
    """Hours for runs longer than two hours, else minutes: (unit, seconds per unit)."""
    longest = max((r.wall_until[-1] for r in runs if r.wall_until), default=0.0)
    return ("h", 3600.0) if longest > 7200 else ("min", 60.0)


def x_label(axis: str, runs: Sequence[Run]) -> str:
    if axis == "wall_time":
        return f"wall time ({wall_unit(runs)[0]}, cumulative step time)"
    return {"step": "step", "samples": "samples seen"}[axis]


def on_axis(run: Run, axis: str, points: Series, scale: float = 1.0) -> list[tuple[float, float]]:
    """A run's (step, value) points with x on ``axis``; [] when the run has no such axis."""
    out = []
    for step, value in points:
        x = run.x(axis, step)
        if x is None:
            return []
        out.append((x / scale, value))
    return out


def _scale(axis: str, runs: Sequence[Run]) -> float:
    return wall_unit(runs)[1] if axis == "wall_time" else 1.0


def build_charts(runs: Sequence[Run], axis: str) -> list[Plot]:
    """The headline charts against ``axis``, one line per run that logged the metric."""
    scale = _scale(axis, runs)
    plots = []
    for chart in CHARTS:
        lines: list[Line] = []
        for i, run in enumerate(runs):
            points = on_axis(run, axis, run.canon.series.get(chart.metric, []), scale)
            if not points:
                continue
            if chart.metric == "val_acc":
                lines.append(Line(run.label, points, colour(i), width=2.0, dots=True))
            else:
                lines += with_trend(run.label, points, colour(i), THRESHOLDS.window)
        plots.append(
            Plot(
                f"{chart.chart_id}-{axis}",
                f"{chart.title} {AXIS_TITLES[axis]}",
                lines,
                chart.y_label,
                log_y=chart.log_y,
                missing="no run logged it",
                x_label=x_label(axis, runs),
            )
        )
    return plots


def eval_chart(runs: Sequence[Run], axis: str) -> Plot | None:
    """Our reward on each run's evaluated checkpoints (dashed, dots) over its verl validation
    (solid), in the run's colour; None when no run has checkpoint evaluations."""
    if not any(run.evals and run.evals.rows for run in runs):
        return None
    scale = _scale(axis, runs)
    lines: list[Line] = []
    for i, run in enumerate(runs):
        if not (run.evals and run.evals.rows):
            continue
        ours, _ = eval_series(run.evals.rows)
        val = run.canon.series.get("val_acc", [])
        lines.append(
            Line(f"{run.label} verl validation", on_axis(run, axis, val, scale), colour(i))
        )
        lines.append(
            Line(
                f"{run.label} our reward (checkpoints)",
                on_axis(run, axis, ours, scale),
                colour(i),
                width=2.0,
                dots=True,
                dashed=True,
            )
        )
    return Plot(
        f"{EVAL_CHART}-{axis}",
        f"Checkpoint evaluations: our reward vs verl's validation accuracy {AXIS_TITLES[axis]}",
        lines,
        "accuracy",
        log_y=False,
        x_label=x_label(axis, runs),
    )


def x_range(runs: Sequence[Run], axis: str) -> tuple[float, float]:
    """The span of every run on ``axis`` (all charts of an axis share it)."""
    scale = _scale(axis, runs)
    xs: list[float] = []
    for run in runs:
        steps = list(run.canon.all_steps)
        if run.evals:
            steps += [row.step for row in run.evals.rows]
        for step in (min(steps), max(steps)):
            x = run.x(axis, step)
            if x is not None:
                xs.append(x / scale)
    if axis != "step":
        xs.append(0.0)  # samples seen and wall time start from nothing
    return (min(xs), max(xs)) if xs else (0.0, 1.0)

"""The report's choice of charts: which line charts it draws (build_plots, a finding shaded on the
chart of its metric, raw values faint under a rolling median: with_trend), the time per phase
(stacked areas) and the share of wall-clock per phase (one bar). Drawn with verl_gsm8k/svgplot/,
so the HTML page needs nothing else to open.
"""

from __future__ import annotations

import html
from typing import Any

from verl_gsm8k.analysis import finding as rf
from verl_gsm8k.analysis import parse as rp
from verl_gsm8k.analysis import vocab as rv
from verl_gsm8k.analysis.thresholds import THRESHOLDS
from verl_gsm8k.svgplot.chart import (
    LEFT,
    PALETTE,
    RIGHT,
    Axes,
    Line,
    Plot,
    Points,
    W,
    axes_svg,
    bucket_means,
    figure,
)

PHASE_COLOURS = {
    "gen": "#1f77b4",
    "reward": "#aec7e8",
    "old_log_prob": "#9edae5",
    "ref": "#17becf",
    "values": "#98df8a",
    "adv": "#c7c7c7",
    "update_critic": "#2ca02c",
    "update_actor": "#d62728",
    "update_weights": "#ff9896",
    "save_checkpoint": "#8c564b",
    "other": "#7f7f7f",
    "testing": "#9467bd",
}


def render_phase_plot(canon: rp.Canonical, x_range: tuple[float, float], other: rp.Series) -> str:
    """Stacked areas: seconds per step spent in each phase inside the step timer."""
    layers: list[tuple[str, dict[int, float]]] = [
        (name, dict(points))
        for name, points in sorted(
            canon.phases.items(),
            key=lambda kv: rv.PHASE_ORDER.index(kv[0]) if kv[0] in rv.PHASE_ORDER else 99,
        )
        if name not in rv.OUTSIDE_STEP_PHASES
    ]
    if any(v > 0 for _, v in other):
        layers.append(("other", dict(other)))
    steps = sorted({s for _, layer in layers for s in layer})
    title = "Step time by phase (stacked, s)"
    if not steps:
        return (
            '<div class="plot missing" id="plot-step_time"><b>' + title + "</b><br>"
            "not logged in this run</div>"
        )
    xs, heights = bucket_means(steps, [[layer.get(s, 0.0) for s in steps] for _, layer in layers])
    totals = [sum(column) for column in zip(*heights, strict=True)]
    axes = Axes(x_range, (0.0, max(totals) or 1.0), False)
    parts = axes_svg(axes, "seconds")
    base = [0.0] * len(xs)
    for (name, _), height in zip(layers, heights, strict=True):
        top = [b + h for b, h in zip(base, height, strict=True)]
        upper = " ".join(f"{axes.x(s):.1f},{axes.y(v):.1f}" for s, v in zip(xs, top, strict=True))
        lower = " ".join(
            f"{axes.x(s):.1f},{axes.y(v):.1f}"
            for s, v in reversed(list(zip(xs, base, strict=True)))
        )
        colour = PHASE_COLOURS.get(name, "#bcbd22")
        parts.append(
            f'<polygon class="series" data-series="{html.escape(name)}" '
            f'data-count="{len(xs)}" fill="{colour}" fill-opacity="0.85" stroke="none" '
            f'points="{upper} {lower}"><title>{html.escape(name)}</title></polygon>'
        )
        base = top
    legend = [(name, PHASE_COLOURS.get(name, "#bcbd22")) for name, _ in layers]
    return figure("step_time", title, len(steps), parts, legend)


def render_share_bar(phases: dict[str, dict[str, Any]]) -> str:
    """One horizontal bar: share of the logged wall-clock per phase (validation included)."""
    parts: list[str] = []
    x = float(LEFT)
    span = W - LEFT - RIGHT
    for name, info in phases.items():
        width = info["share"] * span
        colour = PHASE_COLOURS.get(name, "#bcbd22")
        parts.append(
            f'<rect class="series" data-series="{html.escape(name)}" data-count="1" x="{x:.1f}" '
            f'y="28" width="{width:.1f}" height="22" fill="{colour}">'
            f"<title>{html.escape(name)}: {info['share'] * 100:.1f}%</title></rect>"
        )
        if width > 34:
            parts.append(
                f'<text x="{x + width / 2:.1f}" y="43" text-anchor="middle" fill="#fff">'
                f"{info['share'] * 100:.0f}%</text>"
            )
        x += width
    legend = [(n, PHASE_COLOURS.get(n, "#bcbd22")) for n in phases]
    title = "Share of logged wall-clock per phase"
    return figure("time_share", title, len(phases), parts, legend, height=60)


# --------------------------------------------------------------------------------------------
# Which plots the report draws
# --------------------------------------------------------------------------------------------

# Which plot a finding on a canonical metric is drawn on.
_PLOT_OF_METRIC = {
    "val_acc": "val_acc",
    "score": "score",
    "kl": "kl",
    "kl_loss": "kl",
    "entropy": "entropy",
    "response_length_mean": "response_length",
    "vf_loss": "vf_loss",
    "pg_clipfrac": "clipfrac",
    "rollout_probs_diff_mean": "rollout_mismatch",
}


def _smoothed(points: Points, window: int) -> list[tuple[float, float]]:
    values = rf.rolling_median([v for _, v in points], window)
    return [(s, v) for (s, _), v in zip(points, values, strict=True)]


def with_trend(name: str, points: Points, colour: str, window: int) -> list[Line]:
    """Raw values faint plus a rolling median, for noisy per-step metrics."""
    if len(points) <= 3 * window:
        return [Line(name, points, colour)]
    return [
        Line(f"{name} (raw)", points, colour, width=1.0, faint=True),
        Line(name, _smoothed(points, window), colour, width=2.0),
    ]


def build_plots(canon: rp.Canonical, findings: list[rf.Finding]) -> list[Plot]:
    """The report's line charts, in display order, each finding shaded on the charts it concerns."""
    win = THRESHOLDS.window
    plots = (
        _reward_and_policy_plots(canon, win)
        + _length_and_update_plots(canon.series, win)
        + _engine_and_validation_plots(canon, win)
    )
    _shade_findings(plots, findings)
    return plots


def _best_mark(val: rp.Series) -> list[tuple[int, float, str]]:
    """The best validation accuracy, marked at its first step (none without validation)."""
    if not val:
        return []
    top = max(v for _, v in val)
    best_step = next(st for st, v in val if v == top)
    return [(best_step, top, f"best {top:.3f} @ {best_step}")]


def _kl_lines(s: dict[str, rp.Series], win: int) -> list[Line]:
    """The KL to the reference (in the reward, as a loss, or both); else the update's ppo_kl."""
    kl_lines: list[Line] = []
    for i, name in enumerate(("kl", "kl_loss")):
        if name in s:
            kl_lines += with_trend(name, s[name], PALETTE[i], win)
    if not kl_lines and "ppo_kl" in s:
        kl_lines = with_trend("ppo_kl (old->new policy)", s["ppo_kl"], PALETTE[2], win)
    return kl_lines


def _reward_and_policy_plots(canon: rp.Canonical, win: int) -> list[Plot]:
    """What the run is for and what it costs the policy: validation accuracy, train score and
    reward, the KL to the reference, entropy."""
    s = canon.series
    val = s.get("val_acc", [])
    marks = _best_mark(val)
    kl_lines = _kl_lines(s, win)
    return [
        Plot(
            "val_acc",
            f"Validation accuracy ({canon.val_key or 'not logged'})",
            [Line("val_acc", val, PALETTE[0], width=2.0, dots=True)],
            "accuracy",
            log_y=False,
            marks=marks,
        ),
        Plot(
            "score",
            "Train score (critic/score/mean) and reward incl. KL (critic/rewards/mean)",
            with_trend("score", s.get("score", []), PALETTE[0], win)
            + with_trend("reward", s.get("reward", []), PALETTE[2], win),
            "score",
            log_y=False,
        ),
        Plot(
            "kl",
            "KL to the reference policy",
            kl_lines,
            "KL",
            log_y=False,
            note="needs algorithm.use_kl_in_reward=True or actor.use_kl_loss=True",
        ),
        Plot(
            "entropy",
            "Policy entropy (per token)",
            with_trend("entropy", s.get("entropy", []), PALETTE[3], win),
            "nats",
            log_y=False,
            note="actor/entropy: both verl 0.9.1 trainers (v1 and legacy) log it every step",
        ),
    ]


def _length_and_update_plots(s: dict[str, rp.Series], win: int) -> list[Plot]:
    """What the policy writes and how hard each update pushes: response lengths and cuts, the
    value loss, the clip fraction, gradient norms."""
    return [
        Plot(
            "response_length",
            "Response length: mean and max (tokens)",
            with_trend("mean", s.get("response_length_mean", []), PALETTE[0], win)
            + [Line("max", s.get("response_length_max", []), PALETTE[1], width=1.0)],
            "tokens",
            log_y=False,
        ),
        Plot(
            rv.CUT_SHARE,
            "Responses cut at data.max_response_length (share)",
            with_trend("cut", s.get(rv.CUT_SHARE, []), PALETTE[4], win),
            "share",
            log_y=False,
            note="needs verl 0.9.1's response_length/clip_ratio and /max, and "
            "data.max_response_length (a run directory's launch record or a console log's "
            "config dump); verl's clip_ratio alone is the share as long as the step's longest "
            "response, not the share cut",
        ),
        Plot(
            "vf_loss",
            "Value (critic) loss",
            with_trend("vf_loss", s.get("vf_loss", []), PALETTE[5], win),
            "loss",
            note="no critic (GRPO) or not logged",
        ),
        Plot(
            "clipfrac",
            "PPO clip fraction of the policy update (actor/pg_clipfrac)",
            with_trend("pg_clipfrac", s.get("pg_clipfrac", []), PALETTE[0], win),
            "fraction",
            log_y=False,
        ),
        Plot(
            "grad_norm",
            "Gradient norms (before clipping)",
            with_trend("actor", s.get("actor_grad_norm", []), PALETTE[1], win)
            + with_trend("critic", s.get("critic_grad_norm", []), PALETTE[5], win),
            "norm",
        ),
    ]


def _engine_and_validation_plots(canon: rp.Canonical, win: int) -> list[Plot]:
    """The machinery: throughput, rollout vs training agreement, GPU memory per role; and the
    reward's other validation keys."""
    s = canon.series
    return [
        Plot(
            "throughput",
            "Throughput (tokens/s per GPU)"
            + (
                " - estimated from batch size, lengths and step time"
                if canon.throughput_estimated
                else ""
            ),
            with_trend("tokens/s", s.get("throughput", []), PALETTE[2], win),
            "tokens/s",
            log_y=False,
        ),
        Plot(
            "rollout_mismatch",
            "Rollout vs training: |p_rollout - p_training| per token (training/rollout_probs_diff)",
            with_trend("max", s.get("rollout_probs_diff_max", []), PALETTE[1], win)
            + with_trend("mean", s.get("rollout_probs_diff_mean", []), PALETTE[0], win),
            "probability",
            note="needs actor_rollout_ref.rollout.calculate_log_probs=True (verl 0.9.1 default)",
        ),
        Plot(
            "rollout_corr",
            "Rollout vs training: Pearson correlation of token probabilities",
            with_trend("pearson", s.get("rollout_probs_corr", []), PALETTE[2], win),
            "correlation",
            log_y=False,
            note="needs actor_rollout_ref.rollout.calculate_log_probs=True (verl 0.9.1 default)",
        ),
        Plot(
            "memory",
            "Peak GPU memory per role (GiB, allocated; reserved faint)",
            [
                line
                for i, (role, (allocated, reserved)) in enumerate(rv.MEMORY_ROLES.items())
                for line in (
                    Line(role, s.get(allocated, []), PALETTE[i]),
                    Line(f"{role} reserved", s.get(reserved, []), PALETTE[i], faint=True),
                )
            ],
            "GiB",
            log_y=False,
            note="actor/perf/max_memory_allocated_gb and critic/perf/... (verl 0.9.1)",
        ),
        Plot(
            "val_aux",
            "Validation: the reward's other keys (val-aux, mean per validation)",
            [
                Line(name[len(rv.VAL_AUX_PREFIX) :], points, PALETTE[i % len(PALETTE)], dots=True)
                for i, (name, points) in enumerate(
                    (n, p)
                    for n, p in sorted(s.items())
                    if n.startswith(rv.VAL_AUX_PREFIX) and n != "val_acc"
                )
            ],
            "mean",
            log_y=False,
            note="val-aux/<data_source>/<key>/mean@N, logged by verl 0.9.1 for a reward dict",
        ),
    ]


def _shade_findings(plots: list[Plot], findings: list[rf.Finding]) -> None:
    """Shade each finding's steps on the chart of its metric (every chart for the run's state)."""
    by_id = {plot.plot_id: plot for plot in plots}
    for finding in findings:
        if finding.check in ("nan_inf", "watchdog"):  # the whole run's state: every curve
            targets = list(by_id)
        elif finding.check == "rollout_mismatch":
            targets = ["rollout_mismatch", "rollout_corr"]
        elif finding.check == "kl_without_score_gain":
            targets = ["kl", "score"]
        else:
            targets = [_PLOT_OF_METRIC.get(finding.metric, "")]
        for target in targets:
            if target in by_id:
                by_id[target].bands.append((finding.start_step, finding.end_step, finding.severity))

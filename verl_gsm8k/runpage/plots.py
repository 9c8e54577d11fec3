"""The report's charts: lines with the findings shaded, the step time by phase, the time share."""

from html import escape
from typing import Any

from verl_gsm8k.analysis.finding import Finding, rolling_median
from verl_gsm8k.analysis.parse import Canonical, Series
from verl_gsm8k.guard import vocab
from verl_gsm8k.guard.thresholds import THRESHOLDS
from verl_gsm8k.svgplot import chart
from verl_gsm8k.svgplot.chart import PALETTE, Line, Plot, Points

_HUES = ("#1f77b4", "#aec7e8", "#9edae5", "#17becf", "#98df8a", "#c7c7c7", "#2ca02c", "#d62728",
         "#ff9896", "#8c564b", "#7f7f7f", "#9467bd")  # fmt: skip
PHASE_COLOURS = dict(zip(vocab.PHASE_ORDER, _HUES, strict=True))
CALC = "needs actor_rollout_ref.rollout.calculate_log_probs=True (verl 0.9.1 default)"
# id, title, y label, log y (None: from the data), note when not drawn, (legend, series, colour)
CHARTS: tuple[tuple[Any, ...], ...] = (
    ("score", "Train score (critic/score/mean) and reward incl. KL (critic/rewards/mean)",
     "score", False, "", ("score", "score", 0), ("reward", "reward", 2)),
    ("kl", "KL to the reference policy", "KL", False,
     "needs algorithm.use_kl_in_reward=True or actor.use_kl_loss=True",
     ("kl", "kl", 0), ("kl_loss", "kl_loss", 1)),
    ("entropy", "Policy entropy (per token)", "nats", False,
     "actor/entropy: both verl 0.9.1 trainers log it every step", ("entropy", "entropy", 3)),
    ("response_length", "Response length: mean and max (tokens)", "tokens", False, "",
     ("mean", "response_length_mean", 0)),
    (vocab.CUT_SHARE, "Responses cut at data.max_response_length (share)", "share", False,
     "needs verl 0.9.1's response_length/clip_ratio and /max, and data.max_response_length; "
     "verl's clip_ratio alone is the share as long as the step's longest response",
     ("cut", vocab.CUT_SHARE, 4)),
    ("vf_loss", "Value (critic) loss", "loss", None, "no critic (GRPO) or not logged",
     ("vf_loss", "vf_loss", 5)),
    ("clipfrac", "PPO clip fraction of the policy update (actor/pg_clipfrac)", "fraction",
     False, "", ("pg_clipfrac", "pg_clipfrac", 0)),
    ("grad_norm", "Gradient norms (before clipping)", "norm", None, "",
     ("actor", "actor_grad_norm", 1), ("critic", "critic_grad_norm", 5)),
    ("throughput", "Throughput (tokens/s per GPU)", "tokens/s", False, "",
     ("tokens/s", "throughput", 2)),
    ("rollout_mismatch", "Rollout vs training: |p_rollout - p_training| per token "
     "(training/rollout_probs_diff)", "probability", None, CALC,
     ("max", "rollout_probs_diff_max", 1), ("mean", "rollout_probs_diff_mean", 0)),
    ("rollout_corr", "Rollout vs training: Pearson correlation of token probabilities",
     "correlation", False, CALC, ("pearson", "rollout_probs_corr", 2)),
    ("tools", "Tool use: responses that called the tool, accuracy with and without a call",
     "share", False, "a tool launch (TOOLS) only: tools/* (docs/tools.md)",
     ("called", "tool_called", 0), ("errors", "tool_errors", 3),
     ("accuracy, called", "tool_acc_called", 2),
     ("accuracy, not called", "tool_acc_not_called", 1)),
    ("turns", "Turns per response (num_turns/mean: 2 a plain answer, 4 one tool round)", "turns",
     False, "logged by verl 0.9.1's v1 trainer", ("turns", "num_turns", 0)),
)  # fmt: skip
# the chart a finding is shaded on, by the check or its metric; "*": every chart
SHADED = {"non_finite": "*", "watchdog": "*", "rollout_mismatch": "rollout_mismatch rollout_corr",
          "kl_without_score_gain": "kl score", "kl_loss": "kl",
          "response_length_mean": "response_length", "pg_clipfrac": "clipfrac",
          "rollout_probs_diff_mean": "rollout_mismatch"}  # fmt: skip


def _colour(phase: str) -> str:
    return PHASE_COLOURS.get(phase, "#bcbd22")


def with_trend(name: str, points: Points, colour: str, window: int) -> list[Line]:
    if len(points) <= 3 * window:
        return [Line(name, points, colour)]
    smooth = rolling_median([v for _, v in points], window)
    trend = [(s, v) for (s, _), v in zip(points, smooth, strict=True)]
    return [Line(f"{name} (raw)", points, colour, width=1.0, faint=True),
            Line(name, trend, colour, width=2.0)]  # fmt: skip


def build_plots(canon: Canonical, findings: list[Finding]) -> list[Plot]:
    s, win = canon.series, THRESHOLDS.window
    val = s.get("val_acc", [])
    top = max(val, key=lambda p: (p[1], -p[0])) if val else None
    mark = [(top[0], top[1], f"best {top[1]:.3f} @ {top[0]}")] if top else []
    plots = [Plot("val_acc", f"Validation accuracy ({canon.val_key or 'not logged'})",
                  [Line("val_acc", val, PALETTE[0], width=2.0, dots=True)], "accuracy", False,
                  marks=mark)]  # fmt: skip
    for plot_id, title, y_label, log_y, note, *lines in CHARTS:
        drawn = [x for n, k, c in lines for x in with_trend(n, s.get(k, []), PALETTE[c], win)]
        plots.append(Plot(plot_id, title, drawn, y_label, log_y, note))
    by_id = {plot.plot_id: plot for plot in plots}
    if not by_id["kl"].lines[0].points and not by_id["kl"].lines[-1].points:
        by_id["kl"].lines = with_trend("ppo_kl (old->new policy)", s.get("ppo_kl", []),
                                       PALETTE[2], win)  # fmt: skip
    longest = s.get("response_length_max", [])
    by_id["response_length"].lines.append(Line("max", longest, PALETTE[1], width=1.0))
    if canon.throughput_estimated:
        by_id["throughput"].title += " - estimated from batch size, lengths and step time"
    memory = [Line(f"{role}{part}", s.get(key, []), PALETTE[i], faint=bool(part))
              for i, (role, keys) in enumerate(vocab.MEMORY_ROLES.items())
              for part, key in zip(("", " reserved"), keys, strict=True)]  # fmt: skip
    aux = sorted(n for n in s if n.startswith(vocab.VAL_AUX_PREFIX) and n != "val_acc")
    plots += [
        Plot("memory", "Peak GPU memory per role (GiB, allocated; reserved faint)", memory,
             "GiB", False, "actor/perf/max_memory_allocated_gb and critic/perf/... (verl 0.9.1)"),
        Plot("val_aux", "Validation: the reward's other keys (val-aux, mean per validation)",
             [Line(n[len(vocab.VAL_AUX_PREFIX):], s[n], PALETTE[i % 10], dots=True)
              for i, n in enumerate(aux)], "mean", False,
             "val-aux/<data_source>/<key>/mean@N, logged by verl 0.9.1 for a reward dict"),
    ]  # fmt: skip
    for f in findings:
        where = SHADED.get(f.check) or SHADED.get(f.metric, f.metric)
        for target in by_id if where == "*" else where.split():
            if target in by_id:
                by_id[target].bands.append((f.start_step, f.end_step, f.severity))
    return plots


def render_phase_plot(canon: Canonical, x_range: tuple[float, float], other: Series) -> str:
    names = sorted(canon.phases, key=vocab.phase_order)
    layers = [(n, dict(canon.phases[n])) for n in names if n not in vocab.OUTSIDE_STEP_PHASES]
    if any(v > 0 for _, v in other):
        layers.append(("other", dict(other)))
    steps = sorted({s for _, layer in layers for s in layer})
    title = "Step time by phase (stacked, s)"
    if not steps:
        return (f'<div class="plot missing" id="plot-step_time"><b>{title}</b><br>'
                "not logged in this run</div>")  # fmt: skip
    xs, heights = chart.bucket_means(steps, [[ly.get(s, 0.0) for s in steps] for _, ly in layers])
    axes = chart.Axes(x_range, (0.0, max(map(sum, zip(*heights, strict=True))) or 1.0), False)
    parts, base = chart.axes_svg(axes, "seconds"), [0.0] * len(xs)
    for (name, _), height in zip(layers, heights, strict=True):
        top = [b + h for b, h in zip(base, height, strict=True)]
        edge = [*zip(xs, top, strict=True), *reversed(list(zip(xs, base, strict=True)))]
        xy = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in edge)
        parts.append(f'<polygon class="series" data-series="{escape(name)}" '
                     f'data-count="{len(xs)}" fill="{_colour(name)}" '
                     f'fill-opacity="0.85" points="{xy}"><title>{escape(name)}</title>'
                     "</polygon>")  # fmt: skip
        base = top
    legend = [(name, _colour(name)) for name, _ in layers]
    return chart.figure("step_time", title, len(steps), parts, legend)


def render_share_bar(phases: dict[str, dict[str, Any]]) -> str:
    parts, x = [], float(chart.LEFT)
    for name, info in phases.items():
        width, share = info["share"] * (chart.W - chart.LEFT - chart.RIGHT), info["share"] * 100
        label = f'<text x="{x + width / 2:.1f}" y="43" text-anchor="middle" fill="#fff">'
        parts.append(f'<rect class="series" data-series="{escape(name)}" data-count="1" '
                     f'x="{x:.1f}" y="28" width="{width:.1f}" height="22" '
                     f'fill="{_colour(name)}"><title>{escape(name)}: '
                     f"{share:.1f}%</title></rect>")  # fmt: skip
        parts.append(f"{label}{share:.0f}%</text>" if width > 34 else "")
        x += width
    legend = [(n, _colour(n)) for n in phases]
    return chart.figure("time_share", "Share of logged wall-clock per phase", len(phases),
                        parts, legend, height=60)  # fmt: skip

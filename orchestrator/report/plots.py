"""The HTML report's plots: matplotlib figures (Agg, no pyplot) rendered to inline SVG text from plain numbers."""

from __future__ import annotations

import io
import math
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.common.printable import visible
from orchestrator.errors import OrchError
from orchestrator.stats.estimates import BreakEven

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from orchestrator.report import nightly_page

INSTALL_HINT = (
    "the HTML report draws its plots with matplotlib, which is not installed: pip install 'orch-bench[report]' "
    "(in a checkout: pip install -e '.[report]')"
)
VERDICT_COLORS = {"faster": "#1a7f37", "slower": "#cf222e", "no difference": "#0969da", "inconclusive": "#bf8700"}


class MissingExtra(OrchError):
    """An optional dependency is not installed: a problem of the environment, not of the input (exit 1)."""


def require_matplotlib() -> None:
    """Fail early with the install hint, before any work is done."""
    try:
        import matplotlib
    except ImportError as e:
        raise MissingExtra(INSTALL_HINT) from e
    # Only the HTML path gets here, so `orch --help` and every other command never pay for matplotlib.
    matplotlib.use("Agg")


def arm_color(index: int) -> str:
    return f"C{index % 10}"


def _render(fig_id: str, size: tuple[float, float], draw: Callable[[Figure], None]) -> str:
    require_matplotlib()
    import matplotlib
    from matplotlib.figure import Figure

    rc: dict[Any, Any] = {  # Any keys: matplotlib types them as a Literal of every rc name
        "svg.fonttype": "none",  # text stays text: selectable, searchable, and a tenth of the size of glyph paths
        "svg.hashsalt": fig_id,  # clip-path ids differ between the figures inlined into one page, and are stable
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "text.parse_math": False,  # a profile named "a$b" is a name, not TeX
    }
    with matplotlib.rc_context(rc):
        fig = Figure(figsize=size, layout="constrained")
        draw(fig)
        _show_texts(fig)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    # The last guard, should a text drawn at save time have escaped _show_texts: the SVG's own markup holds no
    # control character but its newlines.
    text = visible(buf.getvalue(), lines=True)
    text = text[text.index("<svg") :]  # inline: no XML declaration or DOCTYPE inside HTML
    return re.sub(r"<svg ", f'<svg role="img" aria-labelledby="{fig_id}-cap" ', text, count=1)


# Texts and tick labels that orch breaks into lines itself (a box's "(n=…)" under its arm's name, a nightly label
# wrapped to fit), the names in them already made visible: their newlines stay.
_OWN_LINES: weakref.WeakSet[Any] = weakref.WeakSet()
_T = TypeVar("_T")


def _own_lines(obj: _T) -> _T:
    _OWN_LINES.add(obj)
    return obj


def _show_texts(fig: Figure) -> None:
    """Every text of the figure (titles, axis and tick labels, legends, annotations) with its control characters,
    bidi overrides and newlines shown as escapes, as the page around the figure shows them: an arm's name from a
    store, a bundle or a nightly file is drawn as the text it is, never reordered or split into forged lines."""
    from matplotlib.axis import Axis
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter, FuncFormatter

    for axis in fig.findobj(Axis):
        # Tick labels are set again from their formatter when the figure is drawn: the names given as labels
        # (set_xticks) live in a FuncFormatter's function, or a FixedFormatter's list.
        for fmt in (axis.get_major_formatter(), axis.get_minor_formatter()):
            lines = fmt in _OWN_LINES
            if isinstance(fmt, FuncFormatter):
                fmt.func = _shown_labels(fmt.func, lines)
            elif isinstance(fmt, FixedFormatter):
                fmt.seq = [visible(str(s), lines=lines) for s in fmt.seq]
    for text in fig.findobj(Text):
        text.set_text(visible(text.get_text(), lines=text in _OWN_LINES))


def _shown_labels(func: Callable[[float, int | None], str], lines: bool) -> Callable[[float, int | None], str]:
    return lambda x, pos: visible(str(func(x, pos)), lines=lines)


@dataclass(frozen=True)
class ArmLaunches:
    """One arm at one level: per launch its block number (1-based), run values and launch value; the arm median."""

    label: str
    index: int
    launches: Sequence[tuple[int, Sequence[float], float | None]]
    median: float | None


def launch_points(fig_id: str, arms: Sequence[ArmLaunches], ylabel: str) -> str:
    """Each run a dot, grouped by launch (so launch-to-launch spread shows), each launch's value a bar, the arm's
    median a dashed line."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        for pos, arm in enumerate(arms):
            n = len(arm.launches)
            xs = [pos + (k - (n - 1) / 2) * (0.6 / max(n, 1)) for k in range(n)]
            for x, (block, runs, value) in zip(xs, arm.launches, strict=True):
                ax.scatter([x] * len(runs), runs, s=14, color=arm_color(arm.index), alpha=0.55, zorder=3)
                if value is not None:
                    ax.hlines(value, x - 0.06, x + 0.06, color=arm_color(arm.index), linewidth=2.5, zorder=4)
                ax.annotate(
                    f"b{block}",
                    (x, 0),
                    xycoords=("data", "axes fraction"),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    fontsize=7,
                    color="#57606a",
                )
            if arm.median is not None:
                ax.hlines(arm.median, pos - 0.4, pos + 0.4, color="black", linestyle="--", linewidth=1, zorder=5)
                ax.annotate(
                    f"median {arm.median:.1f}",
                    (pos + 0.4, arm.median),
                    xytext=(2, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=8,
                )
        ax.set_xticks(range(len(arms)), [a.label for a in arms])
        ax.set_xlim(-0.6, len(arms) - 0.2)
        # From zero, so heights compare honestly; a small gap then looks small, and the ratio plot shows its size.
        ax.set_ylim(0, None)
        if len(arms) > 1:
            title = "y axis from 0; each arm's median is marked, the ratio plot shows the difference with its CI"
            ax.set_title(title, fontsize=8, loc="right")
        ax.set_ylabel(ylabel)
        ax.grid(axis="x", visible=False)

    return _render(fig_id, (8.0, 3.6), draw)


@dataclass(frozen=True, kw_only=True)
class RatioBar:
    """One comparison's bar in the ratio-interval plot: its ratio, 95 % interval and verdict."""

    label: str
    ratio: float | None
    lo: float | None  # None: no interval (one block, or nothing paired)
    hi: float | None
    verdict: str | None


def ratio_intervals(fig_id: str, rows: Sequence[RatioBar], min_effect: float) -> str:
    """Each comparison's ratio with its 95 % CI, against the band of differences too small to matter."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        ax.axvspan(1 - min_effect, 1 + min_effect, color="#8c959f", alpha=0.25)
        ax.set_title(f"grey band: no difference within ±{min_effect * 100:.1f}%", fontsize=8, loc="right")
        ax.axvline(1.0, color="black", linewidth=0.8)
        for y, row in enumerate(rows):
            color = VERDICT_COLORS.get(row.verdict or "", "#57606a")
            if row.ratio is None:
                ax.annotate("nothing to compare", (1.0, y), ha="center", va="center", fontsize=8)
                continue
            if row.lo is not None and row.hi is not None:
                ax.errorbar(
                    [row.ratio],
                    [y],
                    xerr=[[row.ratio - row.lo], [row.hi - row.ratio]],
                    fmt="o",
                    color=color,
                    capsize=4,
                    markersize=6,
                )
            else:
                ax.plot([row.ratio], [y], marker="o", markerfacecolor="white", color=color, markersize=6)
            ax.annotate(
                f"{row.ratio:.3f}x  {row.verdict or 'no interval'}",
                (row.ratio, y),
                xytext=(0, 7),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                color=color,
            )
        ax.set_yticks(range(len(rows)), [r.label for r in rows])
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.invert_yaxis()
        ax.set_xlabel("ratio of tok/s per stream (arm / baseline), 95% CI over blocks")

    return _render(fig_id, (8.0, 1.3 + 0.55 * len(rows)), draw)


@dataclass(frozen=True)
class LoadSeries:
    """One arm against the baseline over the levels: per level its ratio and 95 % CI (None: not drawn), and where
    its ratio crosses 1 (the crossover's estimate and CI ends; None where there is none, or it is open)."""

    label: str
    index: int
    points: Sequence[tuple[float, float | None, float | None, float | None]]  # level, ratio, lo, hi
    crossing: tuple[float, float | None, float | None] | None


def ratio_over_load(
    fig_id: str, series: Sequence[LoadSeries], xlabel: str, ylabel: str, simulated: bool = False
) -> str:
    """Each arm's ratio to the baseline at every level (95 % CIs over blocks) on a log load axis, with the load where
    it crosses 1 marked and its CI shaded: where speculation stops paying, drawn."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        ax.axhline(1.0, color="black", linewidth=0.8)
        levels = sorted({p[0] for s in series for p in s.points})
        for s in series:
            color = arm_color(s.index)
            xs = [p[0] for p in s.points if p[1] is not None]
            ys = [p[1] for p in s.points if p[1] is not None]
            ax.plot(xs, ys, marker="o", color=color, label=s.label)
            for x, y, lo, hi in s.points:
                if y is not None and lo is not None and hi is not None:
                    ax.errorbar([x], [y], yerr=[[y - lo], [hi - y]], fmt="none", color=color, capsize=3)
            if s.crossing is not None:
                at, lo, hi = s.crossing
                ax.axvspan(lo if lo is not None else levels[0], hi if hi is not None else levels[-1], color=color,
                           alpha=0.12)  # fmt: skip
                ax.axvline(at, color=color, linestyle="--", linewidth=1)
                ax.annotate(f"crosses 1 at ~{at:.3g}", (at, 1.0), xytext=(4, 6), textcoords="offset points",
                            fontsize=8, color=color)  # fmt: skip
        ax.set_xscale("log")
        ax.set_xticks(levels, [f"{v:g}" for v in levels])
        ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, loc="best")
        if simulated:
            fig.suptitle(SIM_MARK, x=0.995, ha="right", fontsize=8, color="#9a6700", fontweight="bold")

    return _render(fig_id, (8.0, 3.6), draw)


@dataclass(frozen=True)
class Timeline:
    """One run of one arm: per request its token-arrival profile (seconds from its start at 0 %, 10 %, ..., 100 %
    of its tokens), its end-to-end seconds and its tokens; sequential when the requests ran one after another."""

    label: str
    index: int
    requests: Sequence[tuple[Sequence[float], float, int]]
    sequential: bool


def token_timelines(fig_id: str, lines: Sequence[Timeline]) -> str:
    """Tokens received against time, through the measured instants at each tenth of every request's tokens."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        for line in lines:
            color, start, total = arm_color(line.index), 0.0, 0
            for n, (profile, e2e, tokens) in enumerate(line.requests):
                base = total if line.sequential else 0
                steps = len(profile) - 1
                xs = [start + t for t in profile]
                ys = [base + tokens * k / steps for k in range(steps + 1)]
                label = line.label if n == 0 else None
                ax.plot(xs, ys, color=color, linewidth=1.3, marker="o", markersize=2.5, label=label)
                if line.sequential:
                    start, total = start + e2e, total + tokens
        ax.set_xlabel("seconds since the run's first request was sent")
        ax.set_ylabel("output tokens received")
        ax.set_xlim(0, None)
        ax.set_ylim(0, None)
        ax.legend(fontsize=8)

    return _render(fig_id, (8.0, 3.4), draw)


def strip_box(fig_id: str, groups: Sequence[tuple[str, int, Sequence[float]]], ylabel: str) -> str:
    """A box plot per arm with every sample drawn over it (small samples: the points matter more than the box)."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        data = [list(values) for _, _, values in groups]
        ax.boxplot(data, positions=range(len(groups)), widths=0.45, showfliers=False, medianprops={"color": "black"})
        for pos, (_, index, values) in enumerate(groups):
            n = len(values)
            xs = [pos + ((k * 0.618) % 1 - 0.5) * 0.3 for k in range(n)]  # deterministic jitter
            ax.scatter(xs, values, s=12, color=arm_color(index), alpha=0.7, zorder=3)
        ax.set_xticks(range(len(groups)), [f"{visible(label)}\n(n={len(v)})" for label, _, v in groups])
        _own_lines(ax.xaxis.get_major_formatter())
        ax.set_ylabel(ylabel)
        ax.grid(axis="x", visible=False)

    return _render(fig_id, (8.0, 3.2), draw)


def percentile_points(
    fig_id: str, groups: Sequence[tuple[str, int, Mapping[str, Sequence[float]]]], ylabel: str
) -> str:
    """Per arm and percentile (p50, p90, p99 …), one dot per run: what is stored when raw samples are not."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        keys = list(dict.fromkeys(k for _, _, per in groups for k in per))
        width = 0.7 / max(len(groups), 1)
        for g, (label, index, per) in enumerate(groups):
            for k, key in enumerate(keys):
                values = per.get(key, [])
                x = k + (g - (len(groups) - 1) / 2) * width
                ax.scatter(
                    [x] * len(values), values, s=14, color=arm_color(index), alpha=0.7, label=label if k == 0 else None
                )
        ax.set_xticks(range(len(keys)), keys)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(axis="x", visible=False)

    return _render(fig_id, (8.0, 3.2), draw)


def breakeven_chart(fig_id: str, be: BreakEven, label: str, base_label: str, index: int) -> str:
    """tok/s against accept length at the measured cycle time: the break-even line, the measured point, the target."""
    per_ms = 1000.0 / be.cycle_ms  # tok/s per token of accept length at this cycle time
    reach = be.steps + 1

    lo, hi = be.tau_range
    # A break-even below one token per cycle is drawn where it is: left of 1, every accept length beats it.
    left = min(1.0, lo * 0.95)

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        top = max(reach, hi, be.target_tau or 0.0, be.measured_tau or 0.0) * 1.08
        ax.plot(
            [left, top],
            [left * per_ms, top * per_ms],
            color=arm_color(index),
            label=f"{label} at a {be.cycle_ms:.1f} ms cycle",
        )
        ax.axhline(be.baseline_tps, color="black", linewidth=1, label=f"{base_label}: {be.baseline_tps:.1f} tok/s")
        ax.axvline(
            be.breakeven_tau,
            color="#cf222e",
            linestyle="--",
            linewidth=1,
            label=f"break-even accept length {be.breakeven_tau:.2f}"
            + (" (below 1: always reached)" if be.reach == "always" else ""),
        )
        if be.breakeven_tau_ci95 is not None:
            ax.axvspan(lo, hi, color="#cf222e", alpha=0.12, label=f"its 95% CI [{lo:.2f}, {hi:.2f}]")
        if left < 1.0:
            ax.axvspan(left, 1.0, color="#8c959f", alpha=0.2, label="below 1 token per cycle (no cycle yields less)")
        if top > reach:
            ax.axvspan(reach, top, color="#8c959f", alpha=0.2, label=f"beyond {be.steps} draft steps (unreachable)")
        if be.measured_tau is not None:
            ax.plot(
                [be.measured_tau],
                [be.measured_tau * per_ms],
                "o",
                color=arm_color(index),
                markersize=8,
                markeredgecolor="black",
                label=f"measured: {be.measured_tau:.2f}" + (f" ({be.position} break-even)" if be.position else ""),
            )
            if (mci := be.measured_tau_ci95) is not None:
                ax.errorbar(
                    [be.measured_tau],
                    [be.measured_tau * per_ms],
                    # An interval as narrow as the point (every launch alike) can sit a rounding error beside it:
                    # matplotlib refuses a negative error bar.
                    xerr=[[max(0.0, be.measured_tau - mci[0])], [max(0.0, mci[1] - be.measured_tau)]],
                    fmt="none",
                    ecolor="black",
                    capsize=3,
                    linewidth=1,
                )
        if be.target_tps is not None and be.target_tau is not None:
            ax.axhline(be.target_tps, color="#8250df", linestyle=":", linewidth=1.2)
            ax.plot(
                [be.target_tau],
                [be.target_tps],
                "D",
                color="#8250df",
                label=f"target {be.target_tps:.0f} tok/s: accept length {be.target_tau:.2f}",
            )
        ax.set_xlim(left, top)
        ax.set_ylim(0, None)
        ax.set_xlabel("accept length (tokens per draft-and-verify cycle)")
        ax.set_ylabel("tok/s per stream")
        ax.legend(fontsize=8, loc="upper left")

    return _render(fig_id, (8.0, 3.8), draw)


# ---------------------------------------------------------------- over the load: latency, goodput, the Pareto front

SIM_MARK = "SIMULATED (orch's simulator, not a measured server)"


@dataclass(frozen=True, kw_only=True)
class Point:
    """One arm at one level: x and y, each with its 95 % CI ends (None: no interval, one launch); `tag` names the
    level beside the point where a plot labels its points."""

    x: float
    y: float
    x_ci: tuple[float, float] | None = None
    y_ci: tuple[float, float] | None = None
    tag: str = ""


@dataclass(frozen=True)
class Curve:
    """One arm's points over the levels (increasing load); `dashed` draws it as a secondary line (a p50 beside a
    p99) with hollow markers."""

    label: str
    index: int
    points: Sequence[Point]
    dashed: bool = False


@dataclass(frozen=True, kw_only=True)
class Mark:
    """A load marked on the x axis with its 95 % CI band (an end None: open, the band runs to the axis' edge): a
    crossover (dashed) or an arm's highest load within the SLO (dotted)."""

    at: float
    lo: float | None
    hi: float | None
    text: str
    index: int
    dotted: bool = False


@dataclass(frozen=True)
class Panel:
    """One axes of a load figure: its curves, its y label, and horizontal limits (an SLO's) with their words."""

    ylabel: str
    curves: Sequence[Curve]
    limits: Sequence[tuple[float, str]] = ()
    log_y: bool = False


def _plain_log_axis(axis: Any) -> None:
    """Log ticks at 1, 2, 5 per decade written as plain numbers (mathtext is off: no 10^x)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _draw_curve(ax: Any, curve: Curve, *, label: bool = True) -> None:
    color = arm_color(curve.index)
    pts = list(curve.points)
    style = {"linestyle": "--", "markerfacecolor": "white", "alpha": 0.85} if curve.dashed else {"linestyle": "-"}
    ax.plot(
        [p.x for p in pts],
        [p.y for p in pts],
        marker="o",
        markersize=5,
        color=color,
        label=curve.label if label else None,
        **style,
    )
    for p in pts:
        xerr = [[p.x - p.x_ci[0]], [p.x_ci[1] - p.x]] if p.x_ci else None
        yerr = [[p.y - p.y_ci[0]], [p.y_ci[1] - p.y]] if p.y_ci else None
        if xerr or yerr:
            ax.errorbar([p.x], [p.y], xerr=xerr, yerr=yerr, fmt="none", color=color, capsize=3, linewidth=1)


def _draw_marks(ax: Any, marks: Sequence[Mark], *, label: bool) -> None:
    """Each mark a vertical line with its CI band; named in the legend when `label`."""
    left, right = ax.get_xlim()
    for m in marks:
        color = arm_color(m.index)
        ax.axvspan(m.lo if m.lo is not None else left, m.hi if m.hi is not None else right, color=color, alpha=0.1)
        ax.axvline(
            m.at, color=color, linestyle=":" if m.dotted else "--", linewidth=1.3, label=m.text if label else None
        )
    ax.set_xlim(left, right)


def load_panels(
    fig_id: str,
    panels: Sequence[Panel],
    xlabel: str,
    marks: Sequence[Mark] = (),
    *,
    log_x: bool = False,
    ticks: Sequence[float] = (),
    ceiling: tuple[str, Sequence[tuple[float, float]]] | None = None,
    simulated: bool = False,
) -> str:
    """One or more panels side by side over a shared load axis: each arm's curves with their CIs on both axes, an
    SLO's limits as red dotted lines (named on the line), the marks (crossover, highest load within the SLO) with their
    CI bands, and `ceiling` (its words, its points) as a grey line (the rate scheduled: goodput's most); one legend
    under the panels."""

    def draw(fig: Figure) -> None:
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for n, (ax, panel) in enumerate(zip(axes, panels, strict=True)):
            for curve in panel.curves:
                _draw_curve(ax, curve, label=n == 0)
            if ceiling is not None and ceiling[1]:
                words, pts = ceiling
                ax.plot(
                    [x for x, _ in pts],
                    [y for _, y in pts],
                    color="#8c959f",
                    linewidth=1,
                    marker="_",
                    label=words if n == 0 else None,
                )
            for value, words in panel.limits:
                ax.axhline(value, color="#cf222e", linestyle=":", linewidth=1.2)
                ax.annotate(
                    words,
                    (1.0, value),
                    xycoords=("axes fraction", "data"),
                    xytext=(-2, 2),
                    textcoords="offset points",
                    ha="right",
                    va="bottom",
                    fontsize=7,
                    color="#cf222e",
                )
            if log_x:
                ax.set_xscale("log")
                if ticks:
                    ax.set_xticks(list(ticks), [f"{v:g}" for v in ticks])
                ax.minorticks_off()
            if panel.log_y:
                ax.set_yscale("log")
                _plain_log_axis(ax.yaxis)
                # The points and limits set the range, not the CIs: two launches' t interval (t = 12.7) can span
                # decades and would flatten every curve; a bar past the edge is cut there (the table has its ends).
                ys = [p.y for c in panel.curves for p in c.points if p.y > 0] + [v for v, _ in panel.limits]
                if ys:
                    ax.set_ylim(min(ys) / 1.5, max(ys) * 1.5)
            _draw_marks(ax, marks, label=n == 0)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(panel.ylabel)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), fontsize=7.5, frameon=False)
        if simulated:
            fig.suptitle(SIM_MARK, x=0.995, ha="right", fontsize=8, color="#9a6700", fontweight="bold")

    width = 8.0 if len(panels) == 1 else 10.5
    return _render(fig_id, (width, 4.4), draw)


def pareto_chart(
    fig_id: str,
    curves: Sequence[Curve],
    front: Sequence[tuple[float, float]],
    stars: Sequence[tuple[float, float, str, int]] = (),
    *,
    simulated: bool = False,
) -> str:
    """tok/s per user against aggregate tok/s: each arm's levels joined in load order, each point named by its level
    with its CIs, the Pareto front (no point beats it on both) ringed and joined in grey, and `stars` (x, y, words,
    arm index): where a crossover lies on an arm's curve."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        ordered = sorted(front)
        if ordered:
            ax.plot(
                [x for x, _ in ordered],
                [y for _, y in ordered],
                color="#57606a",
                linewidth=6,
                alpha=0.22,
                solid_capstyle="round",
                zorder=1,
                label="Pareto front",
            )
            ax.scatter(
                [x for x, _ in ordered],
                [y for _, y in ordered],
                s=150,
                facecolors="none",
                edgecolors="black",
                linewidths=1.2,
                zorder=4,
            )
        for curve in curves:
            _draw_curve(ax, curve)
            for p in curve.points:
                ax.annotate(
                    p.tag,
                    (p.x, p.y),
                    xytext=(5, 4),
                    textcoords="offset points",
                    fontsize=7,
                    color=arm_color(curve.index),
                )
        for x, y, words, index in stars:
            ax.plot(
                [x],
                [y],
                marker="*",
                markersize=14,
                color=arm_color(index),
                markeredgecolor="black",
                zorder=5,
                linestyle="none",
                label=words,
            )
        ax.set_xlabel("aggregate output tok/s (all requests together)")
        ax.set_ylabel("tok/s per user (each request's output tok/s)")
        ax.set_ylim(0, None)
        ax.set_xlim(0, None)
        ax.legend(fontsize=7.5, loc="lower left")
        if simulated:
            fig.suptitle(SIM_MARK, x=0.995, ha="right", fontsize=8, color="#9a6700", fontweight="bold")

    return _render(fig_id, (8.0, 4.2), draw)


def accept_histogram(fig_id: str, arms: Sequence[tuple[str, int, Sequence[float], float, float]]) -> str:
    """Accept length per request, one histogram per arm on shared bins, with the mean of per-request values (solid)
    and the token-weighted mean (dashed) marked: where they part, long completions carry the average."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        values = [v for _, _, vs, _, _ in arms for v in vs]
        low, high = min(values), max(values)
        bins = [low + (high - low) * k / 20 for k in range(21)] if high > low else [low - 0.5, low + 0.5]
        for label, index, vs, mean, weighted in arms:
            color = arm_color(index)
            ax.hist(list(vs), bins=bins, alpha=0.45, color=color, label=f"{label} (n={len(vs)})")
            ax.axvline(mean, color=color, linestyle="-", linewidth=1.2)
            ax.axvline(weighted, color=color, linestyle="--", linewidth=1.2)
        ax.set_xlabel("accept length (tokens per target pass), per request")
        ax.set_ylabel("requests")
        ax.legend(loc="upper right", fontsize=8)

    return _render(fig_id, (8.0, 3.0), draw)


# ---------------------------------------------------------------- the nightly history page

NIGHT_COLORS = {"regression": "#cf222e", "improvement": "#1a7f37", "env": "#8250df", "gap": "#cf222e"}


def _upright_label(ax: Any, x: float, label: str, ha: str, color: str) -> None:
    """A label written upwards from the bottom of the axes at night x (an environment step's, a gap's reason), kept
    out of the layout so a long one never squeezes the plot."""
    _own_lines(
        ax.annotate(
            _wrapped(visible(label)),
            (x, 0.03),
            xycoords=("data", "axes fraction"),
            ha=ha,
            va="bottom",
            rotation=90,
            fontsize=6.5,
            color=color,
            clip_on=True,
        )
    ).set_in_layout(False)


def _metric(s: nightly_page.Series) -> str:
    return s.series.rpartition(":")[2].partition("@")[0]


def _is_load(s: nightly_page.Series) -> bool:
    """A crossover or max_rate_slo series: a level found across the loads measured (nightly.history.across_levels)."""
    return _metric(s) in ("crossover", "max_rate_slo")


def is_load_slo(s: nightly_page.Series) -> bool:
    return _metric(s) == "max_rate_slo"


def open_ends(s: nightly_page.Series) -> list[tuple[nightly_page.Point, bool]]:
    """The ends of a crossing's CI (or of the interval an undecided one may lie in) that reach past the range
    measured (None in the point; elsewhere None means one launch, no CI): each point and whether it is the upper."""
    marks = censored_marks(s)
    out = []
    for p in s.points:
        censored = p.censored if p.censored in marks else None
        if censored in ("above", "below") or not (_is_load(s) or p.lo is not None or p.hi is not None):
            continue
        out += [(p, False)] if p.lo is None else []
        out += [(p, True)] if p.hi is None else []
    return out


def censored_marks(s: nightly_page.Series) -> dict[str, str]:
    """The legend's words for the nights of a crossover or max_rate_slo series that did not cross in the range
    measured (history.SeriesValue.censored): a bound, ▲ at least / ▼ at most its value, or undecided (drawn at the
    middle of where it may lie, a placeholder, with that interval as its bar)."""
    slo = is_load_slo(s)
    return {
        "above": "beyond the range measured: at least this",
        "below": "beyond the range measured: at most this",
        "undecided": f"undecided: {'it may leave the SLO' if slo else 'a crossing may lie'} in the bar (not judged)",
    }


def nightly_series(fig_id: str, s: nightly_page.Series) -> str:
    """One series over its nights: each night's value with its CI, the detector's levels, the threshold band around
    the current level, change points (direction and size), environment steps and failed nights, each labelled; a
    crossing's bound (▲/▼), undecided night (hollow, its interval as the bar) and CI open on one side (an arrow to
    the edge) each marked as such."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        n = len(s.nights)
        if s.band is not None:
            first, last, lo, hi = s.band
            ax.fill_between(
                [first - 0.4, last + 0.4],
                lo,
                hi,
                color="#8c959f",
                alpha=0.22,
                linewidth=0,
                label=f"threshold ±{s.threshold * 100:g} % around the current level",
            )
        for k, level in enumerate(s.levels):
            name = "level (median between steps)" if k == 0 else "_nolegend_"
            ax.hlines(
                level.value, level.first - 0.4, level.last + 0.4, color="black", linewidth=1.4, zorder=4, label=name
            )
        shown = [p.value for p in s.points] + [v for lv in s.levels for v in (lv.value,)]
        if s.band is not None:
            shown += [s.band[2], s.band[3]]
        lo_y, hi_y = (min(shown), max(shown)) if shown else (0.0, 1.0)
        if s.band is None and hi_y - lo_y < abs(hi_y) * 0.4:
            # No night was measured in range (every one a bound, or undecided): around its values, not a sliver
            # of a unit around one bound.
            mid = (lo_y + hi_y) / 2
            lo_y, hi_y = min(lo_y, mid - abs(mid) * 0.09), max(hi_y, mid + abs(mid) * 0.09)
        span = max(hi_y - lo_y, abs(hi_y) * 0.02, 1e-9)
        styles: dict[str, tuple[str, str, str | None]] = {
            "night": ("o", "C0", "night"),
            "first": ("o", "C0", None),
            "rerun": ("D", "C1", "re-run"),
        }
        marks = censored_marks(s)
        groups: dict[tuple[str, str | None], list[nightly_page.Point]] = {}
        for p in s.points:
            censored = p.censored if p.censored in marks else None
            groups.setdefault((p.kind if p.kind in styles else "night", censored), []).append(p)
        labelled: set[str] = set()
        for (kind, censored), points in groups.items():
            # One artist per kind of point, not per night: a 30-night series draws in a fraction of the time.
            marker, color, label = styles[kind]
            if censored is not None:
                marker, label = {"above": "^", "below": "v"}.get(censored, marker), marks[censored]
            lows, highs = [], []
            for p in points:
                # A night's CI, or the interval an undecided crossing may lie in; a bound has none. A CI far beyond
                # the values is cut at the plot's edge (the nights table has the numbers); an open end (past the
                # range measured) is drawn as an arrow to the edge, below.
                has_ci = censored in (None, "undecided")
                lows.append(max(p.value - max(p.lo, lo_y - span), 0) if has_ci and p.lo is not None else 0)
                highs.append(max(min(p.hi, hi_y + span) - p.value, 0) if has_ci and p.hi is not None else 0)
            hollow = kind == "rerun" or censored == "undecided"
            ax.errorbar(
                [p.x for p in points],
                [p.value for p in points],
                yerr=[lows, highs],
                fmt=marker,
                color=color,
                markerfacecolor="white" if hollow else color,
                markersize=6 if censored in ("above", "below") else 5,
                capsize=2,
                elinewidth=1,
                zorder=5,
                label=label if label and label not in labelled else None,
            )
            labelled.add(label or "")
        for p, up in open_ends(s):
            # A CI open on this side: from the value to the plot's edge, ending in an arrow.
            color = styles.get(p.kind, styles["night"])[1]
            ax.annotate(
                "",
                (p.x, 1.0 if up else 0.0),
                xycoords=("data", "axes fraction"),
                xytext=(p.x, p.value),
                textcoords="data",
                arrowprops={"arrowstyle": "->", "color": color, "linewidth": 1, "shrinkA": 0, "shrinkB": 0},
                zorder=4,
            ).set_in_layout(False)
        for x in s.outliers:
            hit = next((q for q in s.points if round(q.x) == x), None)
            if hit is not None:
                ax.scatter([x], [hit.value], s=110, facecolors="none", edgecolors="#9a6700", zorder=6)
                ax.annotate(
                    "outlier",
                    (x, hit.value),
                    xytext=(0, 8),
                    textcoords="offset points",
                    ha="center",
                    fontsize=7,
                    color="#9a6700",
                )
        for c in s.changes:
            color = NIGHT_COLORS.get(c.kind, "#57606a")
            ax.axvline(c.x - 0.5, color=color, linestyle=":", linewidth=1.2, zorder=2)
            arrow = "▲" if c.change > 0 else "▼"
            ax.annotate(
                f"{arrow} {c.kind} {c.change * 100:+.1f} %",
                (c.x - 0.45, 0.97),
                xycoords=("data", "axes fraction"),
                ha="left",
                va="top",
                fontsize=7.5,
                color=color,
                fontweight="bold",
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
            ).set_in_layout(False)
        for e in s.env_steps:
            ax.axvline(e.x - 0.5, color=NIGHT_COLORS["env"], linewidth=1.6, zorder=2)
            _upright_label(ax, e.x - 0.55, e.label, "right", NIGHT_COLORS["env"])
        for g in s.gaps:
            ax.axvspan(g.x - 0.45, g.x + 0.45, color="#ffebe9", zorder=1)
            _upright_label(ax, g.x, g.label, "center", NIGHT_COLORS["gap"])
        bottom = lo_y - span * 0.6
        # A load is never below 0: an interval open below reaches the axis at 0.
        ax.set_ylim(max(bottom, 0.0) if _is_load(s) and lo_y >= 0 else bottom, hi_y + span * 0.6)
        ax.set_xlim(-0.6, max(n, 1) - 0.4)
        step = max(1, math.ceil(n / 16))
        ticks = list(range(0, n, step))
        ax.set_xticks(ticks, [s.nights[k][5:10] for k in ticks], fontsize=7.5)
        ax.set_xlabel("night")
        direction = "higher is better" if s.higher_is_better else "lower is better"
        ax.set_ylabel(f"{s.unit} ({direction})")
        ax.grid(axis="x", visible=False)
        handles, labels = ax.get_legend_handles_labels()
        if labels:
            ax.legend(
                handles,
                labels,
                fontsize=7,
                loc="lower left",
                ncols=_legend_columns(labels),
                frameon=False,
                bbox_to_anchor=(0, 1.0),
            )
        if s.simulated:
            fig.suptitle(SIM_MARK, x=0.995, ha="right", fontsize=8, color="#9a6700", fontweight="bold")

    return _render(fig_id, (9.0, 3.4), draw)


def _legend_columns(labels: Sequence[str], most: int = 4, width: int = 140) -> int:
    """Columns for the legend above a nightly figure: up to `most`, fewer where its rows would be wider than the
    figure (about `width` characters at its font size; a wider legend squeezes the plot)."""
    for cols in range(min(len(labels), most), 1, -1):
        rows = math.ceil(len(labels) / cols)
        columns = [labels[k : k + rows] for k in range(0, len(labels), rows)]
        if sum(max(len(x) for x in c) + 6 for c in columns) <= width:
            return cols
    return 1


def _wrapped(text: str, width: int = 36, lines: int = 2) -> str:
    """A label drawn along a night's rule: at most `lines` lines that fit the plot's height (the caption and the
    list under the figure have it whole)."""
    import textwrap

    out = textwrap.wrap(text, width, max_lines=lines, placeholder=" …")
    return "\n".join(out)

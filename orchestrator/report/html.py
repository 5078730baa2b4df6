"""`orch report --html`: one self-contained HTML file (inline CSS and SVG plots, no scripts, no network) per result."""

from __future__ import annotations

import datetime
import html
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator import __version__
from orchestrator.common.printable import visible
from orchestrator.config.slo import DEFAULT_METRIC, METRICS, SLO
from orchestrator.report import plots
from orchestrator.report.lines import (
    SIM_BANNER,
    attached_banner,
    breakeven_lines,
    category_heading,
    category_lines,
    category_rows,
    comparison_line,
    crossover_lines,
    energy_lines,
    energy_note,
    level_heading,
    level_rows,
    metric_heading,
    metric_line,
    metric_rows,
    prompt_heading,
    prompt_lines,
    prompt_rows,
    rate_lines,
    slo_capacity_lines,
    slo_heading,
    slo_line,
    slo_rows,
    sweep_lines,
    unsent_lines,
)
from orchestrator.report.outputs import accept_lines, outputs_lines
from orchestrator.report.sections import Section, sections
from orchestrator.results import curves
from orchestrator.results.byprompt import by_prompt
from orchestrator.results.categories import by_category
from orchestrator.results.model import ABResult, ArmResult, LaunchResult
from orchestrator.results.outputs import accept_distributions
from orchestrator.results.run import Level, Rate, level_name, level_phrase
from orchestrator.results.turns import arm_turns_at
from orchestrator.stats.estimates import LaunchMean

if TYPE_CHECKING:
    from orchestrator.results.run import RunResult

# launch id -> the store's per-request rows of that launch (store.requests): live results carry them in each run.
Requests = Mapping[str, Sequence[Mapping[str, Any]]]

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;max-width:1100px;margin:0 auto;
padding:24px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 8px;border-bottom:1px solid #d0d7de}
.meta{color:#57606a;margin:0 0 12px}
.banner{padding:10px 14px;border-radius:6px;font-weight:600;margin:10px 0}
.sim{background:#fff8c5;border:2px solid #bf8700}.attached{background:#ffebe9;border:2px solid #cf222e}
ul.verdicts{list-style:none;padding:0}ul.verdicts li{padding:8px 12px;margin:6px 0;border-left:6px solid #8c959f;
background:#f6f8fa;font-family:ui-monospace,monospace;font-size:14px;font-weight:600}
ul.verdicts li.v-faster{border-color:#1a7f37}ul.verdicts li.v-slower{border-color:#cf222e}
ul.verdicts li.v-no-difference{border-color:#0969da}
ul.verdicts li.v-inconclusive,ul.verdicts li.v-none{border-color:#bf8700}
table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{padding:4px 10px;border-bottom:1px solid #d0d7de}
th{background:#f6f8fa;text-align:left}td:first-child{white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:18px 0;padding:8px;border:1px solid #d0d7de;border-radius:6px}figure svg{width:100%;height:auto}
figcaption{color:#57606a;font-size:13px;margin-top:4px}.note{color:#57606a}.warn{color:#9a6700}
"""


def _e(value: object) -> str:
    """value as HTML text or an attribute's value: its control characters, bidi overrides and newlines shown as
    escapes first (names and reasons come from stores, bundles and servers; escaping `<` and `&` alone leaves a
    right-to-left override free to make a line read other than it is)."""
    return html.escape(visible(str(value)), quote=True)


def _table(rows: Sequence[Sequence[object]], table_id: str, numeric_from: int = 1) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in rows[0])
    body = "".join(
        "<tr>"
        + "".join(f'<td class="n">{_e(c)}</td>' if i >= numeric_from else f"<td>{_e(c)}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows[1:]
    )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def level_id(level: Level) -> str:
    """A level in element ids: c8 (concurrency), r2 or r0_5 (a rate)."""
    return f"r{float(level):g}".replace(".", "_") if isinstance(level, Rate) else f"c{level}"


def _figure(fig_id: str, svg: str, caption: str) -> str:
    return f'<figure id="{fig_id}">{svg}<figcaption id="{fig_id}-cap">{_e(caption)}</figcaption></figure>'


def _request_rows(run: RunResult, launch: LaunchResult, requests: Requests) -> list[Mapping[str, Any]]:
    """A run's per-request summaries (index, tokens, ttft_s, e2e_s, error): from the run, or the store's rows."""
    if run.per_request:
        return list(run.per_request)
    return [
        {**r, "index": r.get("idx")}
        for r in requests.get(launch.launch_id, ())
        if not r.get("run_warmup")
        and r.get("run_concurrency") == run.concurrency
        and (r.get("run_rate") or 0.0) == (run.rate or 0.0)
        and r.get("run_idx") == run.index
    ]


def _complete(rows: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, int]]:
    return [
        (float(r["ttft_s"]), float(r["e2e_s"]), int(r["tokens"]))
        for r in sorted(rows, key=lambda r: r.get("index") or 0)
        if not r.get("error") and r.get("ttft_s") is not None and r.get("e2e_s") is not None
    ]


def _arrivals(rows: Sequence[Mapping[str, Any]]) -> list[tuple[Sequence[float], float, int]]:
    """Each complete request's token-arrival profile (seconds from its start at 0 %, 10 %, ..., 100 % of its tokens),
    end-to-end time and tokens; none for requests stored before orch kept the profile."""
    out: list[tuple[Sequence[float], float, int]] = []
    for r in sorted(rows, key=lambda r: r.get("index") or 0):
        profile = r.get("arrivals_s")
        if profile is None and r.get("arrivals_json"):
            profile = json.loads(r["arrivals_json"])
        if not r.get("error") and profile and r.get("e2e_s") is not None and r.get("tokens"):
            out.append(([float(t) for t in profile], float(r["e2e_s"]), int(r["tokens"])))
    return out


def _runs(arm: ArmResult, level: Level) -> list[tuple[LaunchResult, RunResult]]:
    return [(launch, r) for launch in arm.launches for r in launch.timed_at(level)]


def _tok_s_figure(result: ABResult, level: Level) -> str:
    arms = [
        plots.ArmLaunches(
            arm.label,
            i,
            [(la.block + 1, [r.tok_s for r in la.timed_at(level)], la.value_at(level)) for la in arm.launches],
            arm.median_at(level),
        )
        for i, arm in enumerate(result.arms)
    ]
    fig_id = f"fig-tok-s-{level_id(level)}"
    svg = plots.launch_points(fig_id, arms, f"tok/s per stream @ {level_phrase(level)}")
    return _figure(
        fig_id,
        svg,
        f"tok/s per stream at {level_phrase(level)}: each dot is a timed run, grouped by launch (bN: block N); a bar "
        "marks a launch's value (the median of its runs), the dashed line the arm's median of launch values. "
        "Comparisons rest on launches, so the spread between bars is the noise that matters.",
    )


def _ratio_figure(result: ABResult) -> str:
    rows = []
    for level in result.levels or [1]:
        for c in result.comparisons_at(level):
            est = c.estimate
            ci = est is not None and est.blocks >= 2  # one block's interval holds only run noise: not drawn
            label = f"{c.arm_label or c.arm} vs {c.vs_label or c.vs} @ {level_name(level)}"
            rows.append(
                plots.RatioBar(
                    label=label,
                    ratio=c.ratio,
                    lo=est.lo if ci and est else None,
                    hi=est.hi if ci and est else None,
                    verdict=c.verdict if ci else "inconclusive",
                )
            )
    svg = plots.ratio_intervals("fig-ratios", rows, result.min_effect)
    return _figure(
        "fig-ratios",
        svg,
        f"Each comparison's ratio (arm / baseline{'' if result.metric == 'tok_s' else ' of ' + result.metric}) with "
        "its 95% confidence interval over blocks; the grey band is "
        f"±{result.min_effect * 100:.1f}% (--min-effect). A hollow point has no interval (fewer than two blocks).",
    )


def _load_figure(result: ABResult) -> str:
    """The ratios over the levels with the crossover marked (two or more levels, an A/B)."""
    crossings = {arm.label: x for arm, x in result.crossovers()}
    series = []
    for i, arm in enumerate(result.arms[1:], start=1):
        points = []
        for level in result.levels:
            c = next((c for c in result.comparisons_at(level) if c.arm_index == i), None)
            est = c.estimate if c is not None else None
            ci = est is not None and est.blocks >= 2
            points.append((float(level), c.ratio if c else None, est.lo if ci and est else None,
                           est.hi if ci and est else None))  # fmt: skip
        x = crossings.get(arm.label)
        crossing = (x.at, x.lo, x.hi) if x is not None and x.status == "crosses" and x.at is not None else None
        series.append(plots.LoadSeries(arm.label, i, points, crossing))
    rates = isinstance(result.levels[0], Rate)
    svg = plots.ratio_over_load(
        "fig-load",
        series,
        "offered rate (req/s)" if rates else "concurrency (streams)",
        f"ratio of {METRICS[result.metric].label} (arm / baseline)"
        if result.metric in METRICS
        else f"ratio of {result.metric} (arm / baseline)",
        simulated=result.simulated,
    )
    return _figure(
        "fig-load",
        svg,
        "Each arm's ratio to the baseline at every level measured, with its 95% CI over blocks; the dashed line is "
        "where the ratio crosses 1 (the crossover) and the shaded band its 95% CI (stats/crossover: docs/"
        "statistics.md); the solid line only joins the measured points, while the crossover interpolates each "
        "block between levels. SIMULATED where the banner says so.",
    )


def _ci_text(m: LaunchMean | None, scale: float = 1.0, digits: int = 1) -> str:
    """A mean with its CI for the numbers' tables: "23.1 [21.0, 25.3]" (no interval from one launch)."""
    if m is None:
        return "-"
    ci = f" [{m.lo * scale:.{digits}f}, {m.hi * scale:.{digits}f}]" if m.lo is not None and m.hi is not None else ""
    return f"{m.value * scale:.{digits}f}{ci}"


def _point(x: LaunchMean, y: LaunchMean, y_scale: float = 1.0, tag: str = "") -> plots.Point:
    return plots.Point(
        x=x.value,
        y=y.value * y_scale,
        x_ci=(x.lo, x.hi) if x.lo is not None and x.hi is not None else None,
        y_ci=(y.lo * y_scale, y.hi * y_scale) if y.lo is not None and y.hi is not None else None,
        tag=tag,
    )


def _numbers(table_id: str, rows: Sequence[Sequence[object]]) -> str:
    """The numbers a figure draws, as a table under it (collapsed): what a screen reader or a copy-paste gets."""
    return (
        f'<details id="{table_id}-numbers"><summary>The numbers plotted</summary>{_table(rows, table_id, 2)}</details>'
    )


def _load_name(rates: bool, value: float) -> str:
    return f"{value:.3g} req/s" if rates else f"concurrency {value:.3g}"


def _sim_prefix(result: ABResult) -> str:
    return "SIMULATED (orch's simulator, not a measured server): " if result.simulated else ""


def _crossing_marks(result: ABResult, place: Callable[[int, float], float | None] | None = None) -> list[plots.Mark]:
    """Each arm's crossover (the verdict metric's ratio crossing 1) as a mark; `place` maps a load to where it lies on
    another axis for arm i (None: not drawn there)."""
    rates = curves.is_rate(result.levels)
    out = []
    for arm, x in result.crossovers():
        if x.status != "crosses" or x.at is None:
            continue
        i = result.arms.index(arm)
        at, lo, hi = x.at, x.lo, x.hi
        if place is not None:
            at_p = place(i, at)
            if at_p is None:
                continue
            at, lo, hi = at_p, None if lo is None else place(i, lo), None if hi is None else place(i, hi)
        on = "" if result.metric == DEFAULT_METRIC else f" on {result.metric}"
        # In the figure's own axis only: on an achieved-rate axis, the rate achieved there (the caption names the
        # offered load it corresponds to, once: _achieved_crossing_words).
        where = f"{at:.3g} req/s achieved" if place is not None else _load_name(rates, x.at)
        out.append(plots.Mark(at=at, lo=lo, hi=hi, text=f"{arm.label} crossover{on} ~{where}", index=i))
    return out


def _achieved_crossing_words(result: ABResult, place: Callable[[int, float], float | None]) -> str:
    """The crossovers for a figure whose x axis is the achieved request rate: in that axis's terms, each with the
    offered load (the level the verdicts name) said once."""
    rates = curves.is_rate(result.levels)
    parts = []
    for arm, x in result.crossovers():
        if x.status != "crosses" or x.at is None:
            continue
        i = result.arms.index(arm)
        at = place(i, x.at)
        if at is None:
            continue
        lo, hi = (None if v is None else place(i, v) for v in (x.lo, x.hi))
        band = f" (95% CI {lo:.3g} to {hi:.3g})" if lo is not None and hi is not None else ""
        parts.append(
            f"{arm.label} crosses the baseline on {METRICS[result.metric].label} at ~{at:.3g} req/s achieved{band}, "
            f"which is {f'~{x.at:.3g} req/s offered' if rates else f'concurrency ~{x.at:.3g}'}"
        )
    return "; ".join(parts)


def _crossing_words(result: ABResult) -> str:
    rates = curves.is_rate(result.levels)
    parts = []
    for arm, x in result.crossovers():
        if x.status == "crosses" and x.at is not None:
            lo = f"below {x.levels[0]:g}" if x.lo is None else f"{x.lo:.3g}"
            hi = f"beyond {x.levels[-1]:g}" if x.hi is None else f"{x.hi:.3g}"
            on = METRICS[result.metric].label
            parts.append(
                f"{arm.label} crosses the baseline on {on} at ~{_load_name(rates, x.at)} (95% CI {lo} to {hi})"
            )
    return "; ".join(parts)


def _ttft_span(arm: curves.ArmCurve) -> str:
    """An arm's TTFT p99 at its lowest and highest level, with the rates it achieved there, for a caption."""
    ends = [arm.points[0], arm.points[-1]]
    return f"{arm.label}: TTFT p99 " + " to ".join(
        f"{_ci_text(p.get('ttft_p99'), 1000.0, 0)} ms at {_ci_text(p.get(curves.ACHIEVED), digits=2)} req/s"
        for p in ends
    )


def _latency_rate_figure(result: ABResult, arms: Sequence[curves.ArmCurve]) -> str:
    """Latency percentiles against the achieved request rate, one panel per quantity (TTFT, TPOT, E2E)."""
    rates = curves.is_rate(result.levels)
    objectives = [o for o in (result.slo.objectives if result.slo else ()) if o.percentile is not None]
    header = [f"{n.split('_')[0].upper()} {n.split('_')[1]} ms" for n in curves.LATENCIES]
    rows: list[list[object]] = [["arm", "level", "achieved req/s", *header]]
    panels = []
    for quantity, words in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E")):
        lines = []
        for arm in arms:
            for p, dashed in ((99, False), (50, True)):
                pts = [
                    _point(x, y, 1000.0)
                    for pt in arm.points
                    if (x := pt.get(curves.ACHIEVED)) is not None and (y := pt.get(f"{quantity}_p{p}")) is not None
                ]
                if pts:
                    lines.append(plots.Curve(f"{arm.label} p{p}", arm.index, pts, dashed))
        if lines:
            limits = [(o.limit_s * 1000, f"SLO {o.describe()}") for o in objectives if o.quantity == quantity]
            panels.append(plots.Panel(f"{words} (ms, log scale)", lines, limits, log_y=True))
    for arm in arms:
        for pt in arm.points:
            rows.append(
                [
                    arm.label,
                    level_name(pt.level),
                    _ci_text(pt.get(curves.ACHIEVED), digits=2),
                    *[_ci_text(pt.get(n), 1000.0) for n in curves.LATENCIES],
                ]
            )
    if not panels:
        return '<p class="note" id="fig-latency-rate-missing">Latency against rate: no latency percentiles stored.</p>'

    def place(i: int, load: float) -> float | None:
        return arms[i].at_level(curves.ACHIEVED, load)

    svg = plots.load_panels(
        "fig-latency-rate",
        panels,
        "achieved request rate (req/s, completed)",
        _crossing_marks(result, place),
        simulated=result.simulated,
    )
    summary = "; ".join(_ttft_span(arm) for arm in arms if arm.series("ttft_p99"))
    crossing = _achieved_crossing_words(result, place)
    caption = (
        _sim_prefix(result)
        + "Latency percentiles against the request rate each arm achieved (requests completed per second: "
        + ("the client's fitted completion rate; " if rates else "completed requests / run time at each concurrency; ")
        + "each point one level, solid p99, dashed p50), each point the geometric mean over launches of the launch "
        "values (each the median of its runs) with its 95% CI over launches on both axes (Student's t on the logs; "
        "a bar reaching past the axis is cut at its edge, the numbers below have its ends)"
        + ("; latency counts from each request's scheduled send time. " if rates else ". ")
        + (f"Red dotted: the SLO's limits ({result.slo.describe()}). " if objectives and result.slo else "")
        + (
            f"Dashed vertical: the crossover at the rate the arm achieved there, with its CI ({crossing}). "
            if crossing
            else ""
        )
        + f"{summary}."
    )
    return _figure("fig-latency-rate", svg, caption) + _numbers("table-latency-rate", rows)


def _scheduled(result: ABResult) -> list[tuple[float, float]]:
    """The rate each open-loop level's schedule actually held (the same for every arm: one seeded schedule), by the
    level: what goodput would be if every request were good."""
    out = []
    for level in sorted(result.levels, key=float):
        rl = next((r for arm in result.arms if (r := arm.rate_level(level)) and r.scheduled_rate), None)
        if rl is not None and rl.scheduled_rate is not None:
            out.append((float(level), rl.scheduled_rate))
    return out


def _goodput_rate_figure(result: ABResult, arms: Sequence[curves.ArmCurve], slo: SLO) -> str:
    """Goodput (requests within every SLO limit per second) against the load offered, with the crossover and each
    arm's highest load within the SLO marked."""
    rates = curves.is_rate(result.levels)
    lines, rows = [], [["arm", "level", "goodput req/s", "good tok/s"]]
    for arm in arms:
        pts = []
        for pt in arm.points:
            g = pt.get("goodput")
            rows.append([arm.label, level_name(pt.level), _ci_text(g, digits=2), _ci_text(pt.get("goodput_tok_s"))])
            if g is not None:
                pts.append(
                    plots.Point(
                        x=float(pt.level),
                        y=g.value,
                        x_ci=None,
                        y_ci=(g.lo, g.hi) if g.lo is not None and g.hi is not None else None,
                    )
                )
        if pts:
            lines.append(plots.Curve(arm.label, arm.index, pts))
    if not lines:
        return (
            '<p class="note" id="fig-goodput-rate-missing">Goodput against rate: the runs have no per-request rows to '
            "count good requests from.</p>"
        )
    marks = _crossing_marks(result)
    capacity = []
    for who, x in result.max_within_slo():
        if x.status == "crosses" and x.at is not None and x.pays_below:
            i = result.arms.index(who)
            marks.append(
                plots.Mark(
                    at=x.at,
                    lo=x.lo,
                    hi=x.hi,
                    text=f"{who.label} within SLO up to ~{_load_name(rates, x.at)}",
                    index=i,
                    dotted=True,
                )
            )
            capacity.append(f"{who.label} up to ~{_load_name(rates, x.at)}")
    levels = sorted(float(lv) for lv in result.levels)
    svg = plots.load_panels(
        "fig-goodput-rate",
        [plots.Panel("goodput (req/s within every SLO limit)", lines)],
        "offered rate (req/s)" if rates else "concurrency (streams)",
        marks,
        log_x=True,
        ticks=levels,
        ceiling=("rate scheduled (every request good)", _scheduled(result)) if rates else None,
        simulated=result.simulated,
    )
    peaks = "; ".join(
        f"{arm.label}: highest {g.value:.2f} req/s at {level_phrase(lv)}"
        for arm in arms
        if (s := arm.series("goodput"))
        for lv, g in [max(s, key=lambda pair: pair[1].value)]
    )
    crossing = _crossing_words(result)
    caption = (
        _sim_prefix(result)
        + f"Goodput under the SLO {slo.text} ({slo.describe()}): requests that completed within every "
        "limit per second of the run, against the "
        + (
            "rate offered (grey: the rate the seeded schedule held at each level, what goodput would be with every "
            "request good)"
            if rates
            else "concurrency"
        )
        + "; each point the mean over launches of the launch values (each the median of its runs) with its 95% CI "
        "over launches (Student's t). "
        + (f"Dashed: the crossover ({crossing}) with its CI band. " if crossing else "")
        + (
            f"Dotted: each arm's highest load within the SLO's percentiles ({'; '.join(capacity)}). "
            if capacity
            else ""
        )
        + f"{peaks}."
    )
    return _figure("fig-goodput-rate", svg, caption) + _numbers("table-goodput-rate", rows)


def _pareto_figure(result: ABResult, arms: Sequence[curves.ArmCurve]) -> str:
    """tok/s per user against aggregate tok/s: the trade-off a deployment picks from, with the Pareto front."""
    rates = curves.is_rate(result.levels)
    front = curves.front(arms)
    on_front = {(p.index, float(p.level)) for p in front}
    lines, rows = [], [["arm", "level", "aggregate tok/s", "tok/s per user", "on the front"]]
    for arm in arms:
        pts = []
        for pt in arm.points:
            agg, user = pt.get("aggregate_tok_s"), pt.get("tok_s")
            rows.append(
                [
                    arm.label,
                    level_name(pt.level),
                    _ci_text(agg),
                    _ci_text(user),
                    "yes" if (arm.index, float(pt.level)) in on_front else "-",
                ]
            )
            if agg is not None and user is not None:
                pts.append(_point(agg, user, tag=f"{float(pt.level):g}"))
        if pts:
            lines.append(plots.Curve(arm.label, arm.index, pts))
    if not lines:
        return '<p class="note" id="fig-pareto-missing">Pareto front: no tok/s stored.</p>'
    stars = []
    for who, x in result.crossovers():
        i = result.arms.index(who)
        if x.status != "crosses" or x.at is None:
            continue
        sx, sy = arms[i].at_level("aggregate_tok_s", x.at), arms[i].at_level("tok_s", x.at)
        if sx is not None and sy is not None:
            on = "" if result.metric == DEFAULT_METRIC else f" on {result.metric}"
            stars.append((sx, sy, f"{who.label} crossover{on} ~{_load_name(rates, x.at)}", i))
    svg = plots.pareto_chart(
        "fig-pareto", lines, [(p.aggregate, p.per_user) for p in front], stars, simulated=result.simulated
    )
    listed = ", ".join(
        f"{p.label} @ {level_name(p.level)} ({p.aggregate:.0f} aggregate, {p.per_user:.1f} per user)" for p in front
    )
    caption = (
        _sim_prefix(result)
        + "Each arm's tok/s per user (each request's output tokens / its end-to-end time, averaged) against the "
        "aggregate output tok/s of all requests, one point per level (labelled with its "
        + ("rate in req/s" if rates else "concurrency")
        + "), each the geometric mean over launches with its 95% CI over launches on both axes. Up and to the right is "
        "better: a point on the Pareto front (ringed, joined in grey) is beaten on both by no other arm or level, so "
        "a deployment that wants a given speed per user gets the most aggregate throughput from the front. "
        + (f"A star marks the crossover on the arm's curve ({_crossing_words(result)}). " if stars else "")
        + f"The front, from the highest aggregate: {listed}."
    )
    return _figure("fig-pareto", svg, caption) + _numbers("table-pareto", rows)


def _load_plots(result: ABResult) -> str:
    """The figures over the levels (two or more, of either kind): latency against achieved rate, goodput against
    the load offered (under --slo), and the Pareto front of tok/s per user against aggregate tok/s."""
    if len(result.levels) < 2:
        return ""
    names = [curves.ACHIEVED, *curves.LATENCIES, *curves.THROUGHPUT]
    if result.slo is not None:
        names += ["goodput", "goodput_tok_s"]
    arms = curves.curves(result, names)
    parts = ['<section id="load-plots"><h2>Over the load: latency, goodput and the Pareto front</h2>']
    parts.append(_latency_rate_figure(result, arms))
    if result.slo is not None:
        parts.append(_goodput_rate_figure(result, arms, result.slo))
    parts.append(_pareto_figure(result, arms))
    parts.append("</section>")
    return "".join(parts)


def _representative(arm: ArmResult, level: Level) -> tuple[LaunchResult, RunResult] | None:
    """The timed run closest to the arm's median: one typical run, not the best one."""
    runs = _runs(arm, level)
    median = arm.median_at(level)
    if not runs or median is None:
        return None
    return min(runs, key=lambda lr: abs(lr[1].tok_s - median))


def _timeline_figure(result: ABResult, level: Level, requests: Requests) -> str:
    lines, missing = [], []
    for i, arm in enumerate(result.arms):
        pick = _representative(arm, level)
        done = _arrivals(_request_rows(pick[1], pick[0], requests)) if pick else []
        if pick and done:
            launch, run = pick
            label = f"{arm.label} (block {launch.block + 1}, run {run.index + 1}: {run.tok_s:.1f} tok/s)"
            lines.append(plots.Timeline(label, i, done, sequential=run.concurrency == 1))
        else:
            missing.append(arm.label)
    gap = (
        ""
        if not missing
        else f" No token-arrival profiles stored for {', '.join(missing)} (stored by orch before they were kept, or "
        "imported from a bundle)."
    )
    if not lines:
        return f'<p class="note" id="fig-tokens-missing">Tokens over time: not available.{_e(gap)}</p>'
    seq = all(t.sequential for t in lines)
    return _figure(
        "fig-tokens",
        plots.token_timelines("fig-tokens", lines),
        f"Output tokens received over time in one run of each arm at {level_phrase(level)} (the run closest to the "
        "arm's median). Each point is measured: when 0%, 10%, ..., 100% of a request's tokens had arrived (orch "
        "keeps these 11 instants per request, not every token's); a steeper line is a faster stream, a step is a "
        "pause or a burst. "
        + (
            "Requests are laid end to end (they ran one after another; the short gaps between them are not stored)."
            if seq
            else "Each request is drawn from when it was scheduled (open loop: they overlapped)."
            if isinstance(level, Rate)
            else "Request start times are not stored, so each request is drawn from its own start."
        )
        + gap,
    )


def _latency_figures(result: ABResult, level: Level, requests: Requests) -> list[str]:
    ttft: list[tuple[str, int, list[float]]] = []
    per_request = True
    for i, arm in enumerate(result.arms):
        samples = [t * 1000 for la, r in _runs(arm, level) for t, _, _ in _complete(_request_rows(r, la, requests))]
        if not samples:  # no per-request rows (an older store): the runs' own medians are what is left
            per_request = False
            samples = [r.ttft_s * 1000 for _, r in _runs(arm, level) if r.ttft_s is not None]
        ttft.append((arm.label, i, samples))
    itl = [
        (
            arm.label,
            i,
            {
                f"p{p}": [
                    r.metrics["itl"][f"p{p}"] * 1000
                    for _, r in _runs(arm, level)
                    if (r.metrics.get("itl") or {}).get(f"p{p}") is not None
                ]
                for p in (50, 90, 99)
            },
        )
        for i, arm in enumerate(result.arms)
    ]
    return [
        _figure(
            "fig-ttft",
            plots.strip_box("fig-ttft", ttft, "time to first token (ms)"),
            f"Time to first token at {level_phrase(level)}: "
            + (
                "one point per request (every timed run of every launch)."
                if per_request
                else "per-request values are not stored for this experiment; one point per run (the run's median)."
            ),
        ),
        _figure(
            "fig-itl",
            plots.percentile_points("fig-itl", itl, "inter-token latency (ms)"),
            f"Inter-token latency at {level_phrase(level)}: orch stores each run's ITL percentiles, not the raw "
            "inter-token samples; one point per run and percentile.",
        ),
    ]


def _speculation(result: ABResult) -> str:
    spec = result.speculation()
    if not spec:
        return ""
    base = result.arms[0]
    parts = ["<h2>Speculative decoding: break-even</h2>"]
    for arm, be in spec:
        index = result.arms.index(arm)
        fig_id = f"fig-breakeven-{index}"
        parts.append("<ul>" + "".join(f"<li>{_e(line)}</li>" for line in breakeven_lines(be)) + "</ul>")
        parts.append(
            _figure(
                fig_id,
                plots.breakeven_chart(fig_id, be, arm.label, base.label, index),
                f"{arm.label}: tok/s per stream against accept length at its measured cycle time "
                f"({be.cycle_ms:.1f} ms = accept length / tok/s); it beats {base.label} right of the break-even line"
                + (f"; the target is {be.target_tps:.0f} tok/s" if be.target_tps else "")
                + f". Chain model, {be.steps} draft steps.",
            )
        )
    return "".join(parts)


def _launch_table(result: ABResult) -> str:
    levels = result.levels or [1]
    rows: list[list[object]] = [
        [
            "block",
            "position",
            "arm",
            "launch id",
            *[f"tok/s @ {level_name(c)}" for c in levels],
            "valid runs",
            "invalid runs",
            "ready s",
            "env check",
        ]
    ]
    for la in sorted(result.launches, key=lambda la: (la.block, la.position)):
        values = [la.value_at(c) for c in levels]
        rows.append(
            [
                la.block + 1,
                la.position + 1,
                result.arms[la.arm_index].label,
                la.launch_id,
                *["-" if v is None else f"{v:.1f}" for v in values],
                sum(len(la.timed_at(c)) for c in levels),
                len(la.invalid_runs),
                "-" if la.attached else f"{la.ready_s:.1f}",
                "attached (not verified)"
                if la.attached
                else ("ok" if la.env_report.get("ok", True) is not False else "MISMATCH"),
            ]
        )
    for cut in result.cut_short:
        rows.append(
            [
                cut.block + 1,
                "-",
                result.arms[cut.arm_index].label,
                f"cut short ({cut.status})",
                *["-"] * len(levels),
                "-",
                "-",
                "-",
                "not in the statistics",
            ]
        )
    return _table(rows, "table-launches", numeric_from=99)


def _fact(value: Any, key: str) -> str:
    if value is None or value == []:
        return "-"
    if ("sha" in key or "digest" in key) and isinstance(value, str) and len(value) > 16:
        return value[:16] + "…"
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{value / 2**30:.1f} GiB"
    if key == "boot_time" and isinstance(value, (int, float)):
        return datetime.datetime.fromtimestamp(value, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if isinstance(value, list):
        return "; ".join(", ".join(f"{k}={v}" for k, v in g.items()) if isinstance(g, dict) else str(g) for g in value)
    return str(value)


FINGERPRINT_ROWS = (
    ("engine", ("software", "engine")),
    ("engine version", ("software", "engine_version")),
    ("GPU model", ("gpus", "model")),
    ("GPU count", ("gpus", "count")),
    ("GPU driver", ("gpus", "driver")),
    ("CUDA", ("gpus", "cuda")),
    ("torch", ("software", "torch")),
    ("python", ("software", "python")),
    ("kernel", ("host", "kernel")),
    ("CPU", ("host", "cpu_model")),
    ("profile sha256", ("profile_sha256",)),
    ("workload sha256", ("workload_sha256",)),  # fingerprint.WORKLOAD_KEY
    ("workload digest (path included)", ("workload_digest",)),  # fingerprint.LEGACY_WORKLOAD_KEY: stored before it
    ("orch version", ("orch", "version")),
    ("orch commit", ("orch", "git_sha")),
)


def _dig(d: Any, path: Sequence[str]) -> Any:
    for key in path:
        d = d.get(key) if isinstance(d, dict) else None
    return d


def _host_section(result: ABResult) -> str:
    per_node = {} if len(result.nodes) < 2 else result.host_facts["nodes"]
    shown = {k: v for k, v in result.host_facts.items() if not (per_node and k in ("nodes", "node_mismatches"))}
    facts = [["fact", "value"]] + [[k, _fact(v, k)] for k, v in shown.items()]
    out = f"<h3>Host {_e(result.host_label)}</h3>"
    if any(arm.attached_url for arm in result.arms):
        out += '<p class="note">Host facts are --host\'s, not those of the attached server(s).</p>'
    out += _table(facts, "table-host", 99) if len(facts) > 1 else '<p class="note">No host facts stored.</p>'
    if per_node:
        # One column per node: the facts above are node rank 0's, and a multi-node server is only as even as these.
        keys = list(dict.fromkeys(k for f in per_node.values() for k in f))
        table = [["fact", *per_node]] + [[k, *(_fact(f.get(k), k) for f in per_node.values())] for k in keys]
        out += f"<h3>Nodes (rank order)</h3>{_table(table, 'table-nodes', 99)}"
    prints = [(arm.label, next((la.fingerprint for la in arm.launches if la.fingerprint), None)) for arm in result.arms]
    rows: list[list[object]] = [["field", *[label for label, _ in prints]]]
    for name, path in FINGERPRINT_ROWS:
        values = [_fact(_dig(fp, path), path[-1]) if fp else "-" for _, fp in prints]
        if any(v != "-" for v in values):
            rows.append([name, *values])
    out += "<h3>Launch fingerprints (first launch of each arm)</h3>" + _table(rows, "table-fingerprint", 99)
    return out


def _energy_section(result: ABResult) -> str:
    """Joules per output token per arm and level with their CIs, and what they are; the not-measured line alone
    when no arm has them; nothing for an experiment whose runs never tried."""
    note = energy_note(result)
    if note is None:
        return ""
    parts = ['<section id="energy"><h2>Energy per output token</h2>']
    for lv in result.levels or [1]:
        lines = energy_lines(result, lv)
        if lines:
            parts.append(f"<h3>{_e(lines[0])}</h3>")
            parts.append('<ul class="energy">' + "".join(f"<li>{_e(line)}</li>" for line in lines[1:]) + "</ul>")
    parts.append(f'<p class="note" id="energy-note">{_e(note)}</p></section>')
    return "".join(parts)


def _category_section(result: ABResult) -> str:
    """Each level's results by prompt category (report/lines.category_rows); nothing without categories."""
    parts = []
    for lv in result.levels or [1]:
        bc = by_category(result, lv)
        if bc is None:
            continue
        parts.append(f"<h3>{_e(level_heading(lv))}</h3>")
        parts.append(_table(category_rows(bc), f"table-category-{level_id(lv)}"))
        parts.append(f'<p class="note">{_e(category_heading(bc))}.</p>')
        parts.append("<ul>" + "".join(f"<li>{_e(line)}</li>" for line in category_lines(bc)) + "</ul>")
    parts += [f'<p class="note" id="categories-unsent">{_e(line)}</p>' for line in unsent_lines(result)]
    return '<section id="by-category"><h2>By category</h2>' + "".join(parts) + "</section>" if parts else ""


def _prompt_section(result: ABResult) -> str:
    """Each level's results by prompt, for a small prompt set (report/lines.prompt_rows); nothing otherwise."""
    parts = []
    for lv in result.levels or [1]:
        bp = by_prompt(result, lv)
        if bp is None:
            continue
        parts.append(f"<h3>{_e(level_heading(lv))}</h3>")
        parts.append(_table(prompt_rows(bp), f"table-prompt-{level_id(lv)}"))
        parts.append(f'<p class="note">{_e(prompt_heading(bp))}.</p>')
        if bp.notes:
            parts.append(
                '<ul class="prompt-notes">' + "".join(f"<li>{_e(line)}</li>" for line in prompt_lines(bp)) + "</ul>"
            )
    return '<section id="by-prompt"><h2>By prompt</h2>' + "".join(parts) + "</section>" if parts else ""


def _turn_section(result: ABResult) -> str:
    """A multi-turn workload's numbers by turn per arm (results/turns); nothing without sessions."""
    rows = [["arm", "turn", "requests", "TTFT p50 ms", "tok/s per stream", "prefix cache"]]
    for arm in result.arms:
        for t in arm_turns_at(arm) or []:
            hit = t["cache_hit_rate"]
            rows.append(
                [
                    arm.label,
                    str(t["turn"]),
                    str(t["requests"]),
                    "-" if t["ttft_s"] is None else f"{1000 * t['ttft_s']:.0f}",
                    "-" if t["tok_s"] is None else f"{t['tok_s']:.1f}",
                    "-" if hit is None else f"{100 * hit:.0f} %",
                ]
            )
    if len(rows) == 1:
        return ""
    note = (
        "Medians over the timed runs at the headline level; turn k sends the conversation so far with this "
        "session's own replies, so its prompt grows and the prefix cache holds the turns before it."
    )
    return (
        f'<section id="by-turn"><h2>By turn</h2>{_table(rows, "table-by-turn")}<p class="note">{_e(note)}</p></section>'
    )


def _sweep_note(result: ABResult) -> list[str]:
    """Where --sweep auto's rates came from, under the verdicts."""
    said = "; ".join(line.strip() for line in sweep_lines(result))
    return [f'<p class="note" id="sweep">{_e(said)}</p>'] if said else []


def section_html(section: Section) -> str:
    """A report section (report/sections) as HTML: its heading, table, list and note."""
    parts = [f'<section id="{section.html_id}"><h2>{_e(section.title)}</h2>']
    if section.table:
        parts.append(_table(section.table, f"table-{section.html_id}"))
    if section.items:
        parts.append("<ul>" + "".join(f"<li>{_e(item)}</li>" for item in section.items) + "</ul>")
    if section.note:
        parts.append(f'<p class="note">{_e(section.note)}</p>')
    return "".join(parts) + "</section>"


def ab_html(result: ABResult, requests: Requests | None = None) -> str:
    """The whole report as one HTML document; `requests` adds the store's per-request rows to a stored result."""
    plots.require_matplotlib()
    reqs: Requests = requests or {}
    level = result.levels[0] if result.levels else 1
    d = result.design
    title = f"A/B {result.experiment_id} on {result.host_label}" if len(result.arms) > 1 else f"{result.experiment_id}"
    body = [f"<h1>{_e(title)}</h1>"]
    body.append(
        f'<p class="meta">Status: {_e(result.status)}. Arms: {_e(", ".join(a.label for a in result.arms))}. '
        f"Design: {d.blocks} block(s), launch order {_e(d.order)}"
        + (f" (seed {d.seed})" if d.order == "random" else "")
        + f"; minimum effect of interest ±{result.min_effect * 100:.1f}%.</p>"
    )
    if result.simulated:
        body.append(f'<div class="banner sim" id="banner-simulated">{_e(SIM_BANNER)}</div>')
    body += [f'<div class="banner attached" id="banner-attached">{_e(b)}</div>' for b in attached_banner(result)]
    node = result.node_mismatch()
    if node:
        body.append(f'<div class="banner attached" id="banner-nodes">WARNING: {_e(node)}</div>')
    lines = [
        (c.verdict or "none", comparison_line(c)) for lv in result.levels or [1] for c in result.comparisons_at(lv)
    ]
    body.append('<section id="verdict"><h2>Verdict</h2>')
    body += [f'<p class="note" id="{i}">{_e(t)}.</p>' for i, t in judged_on(result)]
    if lines:
        body.append(
            '<ul class="verdicts">'
            + "".join(f'<li class="v-{_e(v.replace(" ", "-"))}">{_e(text)}</li>' for v, text in lines)
            + "</ul>"
        )
    else:
        body.append('<p class="note">One arm: nothing to compare.</p>')
    body += [f'<p class="note">NOTE: {_e(n)}</p>' for n in result.notes] + _sweep_note(result) + ["</section>"]
    if crossings := crossover_lines(result):
        body.append('<section id="crossover"><h2>Where speculation stops paying</h2><ul class="crossovers">')
        body += [f"<li>{_e(line)}</li>" for line in crossings]
        body.append("</ul>")
        body.append(_load_figure(result))
        body.append("</section>")
    if capacity := slo_capacity_lines(result):
        body.append(f'<section id="slo-capacity"><h2>Highest load within the SLO</h2><p>{_e(capacity[0])}</p><ul>')
        body += [f"<li>{_e(line.strip())}</li>" for line in capacity[1:]]
        body.append("</ul></section>")
    body += [_load_plots(result), '<section id="summary"><h2>Summary</h2>']
    for lv in result.levels or [1]:
        body.append(f"<h3>{_e(level_heading(lv))}</h3>")
        body.append(_table(level_rows(result, lv), f"table-summary-{level_id(lv)}"))
        if rate := rate_lines(result, lv):
            body.append(f'<ul id="rates-{level_id(lv)}">' + "".join(f"<li>{_e(line)}</li>" for line in rate) + "</ul>")
        if result.slo is not None:
            body.append(f"<h3>Goodput at {_e(level_phrase(lv))}</h3>")
            body.append(_table(slo_rows(result, lv), f"table-goodput-{level_id(lv)}"))
            body.append(f'<p class="note">{_e(slo_heading(result, lv))}.</p>')
        if heading := metric_heading(result, lv):
            body.append(f"<h3>{_e(result.metric)} at {_e(level_phrase(lv))}</h3>")
            body.append(_table(metric_rows(result, lv), f"table-metric-{level_id(lv)}"))
            body.append(f'<p class="note">{_e(heading)}.</p>')
    body.append(
        '<p class="note">median: of launch values (each the median of its runs); min/max over runs; CV within and '
        "across launches; vs: mean per-block ratio.</p></section>"
    )
    body += [
        _energy_section(result),
        _category_section(result),
        _prompt_section(result),
        _turn_section(result),
        *(section_html(section) for section in sections(result)),
    ]
    body.append('<section id="plots"><h2>Throughput</h2>')
    body += [_tok_s_figure(result, lv) for lv in result.levels or [1]]
    if len(result.arms) > 1:
        body.append(_ratio_figure(result))
    body.append("<h2>Over time and latency</h2>")
    body.append(_timeline_figure(result, level, reqs))
    body += _latency_figures(result, level, reqs)
    body.append("</section>")
    body.append(f'<section id="speculation">{_speculation(result)}</section>')
    body.append(_accept_section(result) + _outputs_section(result))
    body.append('<section id="launches"><h2>Launches</h2>' + _launch_table(result) + "</section>")
    body.append('<section id="host-section"><h2>Host fingerprint</h2>' + _host_section(result) + "</section>")
    warnings = result.warnings()
    if warnings:
        body.append(
            '<section id="warnings"><h2>Warnings</h2><ul>'
            + "".join(f'<li class="warn">{_e(w)}</li>' for w in warnings)
            + "</ul></section>"
        )
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body.append(f'<footer class="note">orch {_e(__version__)}, {stamp}. One file: no scripts, no network.</footer>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} — orch</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def judged_on(result: ABResult) -> list[tuple[str, str]]:
    """The verdicts' metric (when not tok/s) and the SLO, each with its element id."""
    pairs = (("verdict-metric", metric_line(result)), ("verdict-slo", slo_line(result)))
    return [(i, text) for i, text in pairs if text]


def render(result: ABResult, requests: Requests) -> str:
    """`orch export --format html` and `orch report --html`."""
    return ab_html(result, requests)


def _accept_section(result: ABResult) -> str:
    """Accept length per request as a histogram (report/outputs says the same in words); "" when none reported."""
    found = accept_distributions(result)
    if not found:
        return ""
    index = {arm.label: i for i, arm in enumerate(result.arms)}
    arms = [(d.arm, index[d.arm], d.values, d.per_request_mean, d.token_weighted) for d in found]
    lines = accept_lines(result)
    return (
        '<section id="accept-per-request"><h2>Accept length per request</h2>'
        + f"<p>{_e(lines[0])}</p><ul>"
        + "".join(f"<li>{_e(line)}</li>" for line in lines[1:])
        + "</ul>"
        + _figure(
            "fig-accept",
            plots.accept_histogram("fig-accept", arms),
            "Accept length of each request (timed runs, first level); solid line: the mean of per-request values, "
            "dashed: the token-weighted mean, which long completions pull toward their own value.",
        )
        + "</section>"
    )


def _outputs_section(result: ABResult) -> str:
    """The lossless check (--check-outputs) in words; "" without kept outputs."""
    lines = outputs_lines(result)
    if not lines:
        return ""
    items = "".join(f"<li>{_e(line.strip())}</li>" for line in lines[1:])
    return f'<section id="lossless-check"><h2>Lossless check</h2><p>{_e(lines[0])}</p><ul>{items}</ul></section>'

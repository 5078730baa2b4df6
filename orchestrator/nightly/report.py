"""A night and a series' history for people: one Markdown line per item, one text line per night."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.common.printable import visible
from orchestrator.config.slo import METRICS
from orchestrator.experiment import failon
from orchestrator.nightly import changepoint, history
from orchestrator.nightly.result import (
    ItemReport,
    NightReport,
    SeriesVerdict,
    describe_changes,
    judge,
    pct,
    series_env_ids,
)
from orchestrator.nightly.suite import ACROSS_LEVELS, as_metric
from orchestrator.report.lines import SIM_BANNER
from orchestrator.report.markdown import md_code, md_text

LABELS = {
    "regression": "**REGRESSION**",
    "fail_on": "**FAIL-ON**",
    "failed": "**FAILED**",
    "timeout": "**TIMED OUT**",
    "interrupted": "**INTERRUPTED**",
    "skipped": "**SKIPPED**",
    "environment": "**environment change**",
    "improvement": "improvement",
    "building": "building history",
    "ok": "ok",
}


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def metric_label(metric: str) -> str:
    name, _, at = metric.partition("@")
    label = {
        "tok_s": "tok/s",
        "agg_tok_s": "aggregate tok/s",
        "ttft_p99": "TTFT p99",
        "accept_length": "accept length",
        "goodput": "goodput req/s",
        "crossover": "crossover load",
        "max_rate_slo": "highest load within the SLO",
    }.get(name, name)
    return label + (f" @{at}" if at else "")


def series_label(v: history.SeriesValue) -> str:
    ratio = is_ratio(v)
    return f"{v.arm} {metric_label(v.metric)}" + (" ratio" if ratio else "")


def is_ratio(v: history.SeriesValue) -> bool:
    """A ratio of two arms (shown as 0.912x); a crossover names two arms too, but is a load."""
    return "/" in v.arm and v.metric.partition("@")[0] not in ACROSS_LEVELS


def fmt_series_value(v: history.SeriesValue) -> str:
    """The value as a summary shows it: a censored crossing as the side of the range it lies beyond (`>12`, `<1`,
    `undecided`), never as the bound it is stored with."""
    if v.censored == "above":
        return f">{v.value:.3g}"
    if v.censored == "below":
        return f"<{v.value:.3g}"
    if v.censored is not None:
        return "undecided"
    return fmt_value(v.value, v.metric, is_ratio(v))


def fmt_value(v: float | None, metric: str, ratio: bool = False) -> str:
    if v is None:
        return "—"
    name = metric.partition("@")[0]
    if name in ACROSS_LEVELS:
        return f"{v:.3g}"
    if ratio:
        return f"{v:.3f}x"
    shared = as_metric(name)
    spec = METRICS[shared] if shared is not None else None
    if spec is not None and spec.unit == "ms":  # a latency, stored in seconds (config/slo.MetricSpec.scale)
        return f"{v * spec.scale:.0f} ms"
    if name == "accept_length" or (spec is not None and spec.unit == "req/s"):
        return f"{v:.2f}"
    return f"{v:.1f}"


def fmt_ci(lo: float | None, hi: float | None, metric: str, ratio: bool = False) -> str:
    if metric.partition("@")[0] in ACROSS_LEVELS and (lo is not None or hi is not None):
        # A crossing's CI may reach the end of the range measured: open on that side.
        ends = [fmt_value(x, metric) if x is not None else "open" for x in (lo, hi)]
        return f" [{ends[0]}, {ends[1]}]"
    if lo is None or hi is None:
        return ""
    return f" [{fmt_value(lo, metric, ratio)}, {fmt_value(hi, metric, ratio)}]"


def first_line(text: str | None, limit: int = 300) -> str:
    """An error as one line of a summary: its first line, bounded (the whole error is in the JSON and the store)."""
    line = (text or "no reason recorded").strip().splitlines()[0] if (text or "").strip() else "no reason recorded"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def building(a: changepoint.Assessment) -> str:
    return f"building history: night {a.nights} of this environment, verdicts from night {a.needed}"


def series_text(s: SeriesVerdict) -> str:
    """`baseline tok/s 77.2 [76.9, 77.5]: -6.0 % vs 82.1 (threshold 3 %)` and what decided it."""
    v, a = s.value, s.assessment
    ratio = is_ratio(v)
    ci = fmt_ci(v.lo, v.hi, v.metric, ratio) if v.censored is None else ""
    head = f"{series_label(v)} {fmt_series_value(v)}{ci}"
    if s.status == "environment":
        return f"{s.note or 'see orch history'}; {series_label(v)} {pct(a.change)} ({head})"
    if v.censored is not None:
        # No number to compare: what the night says instead, and against what, when that decided something.
        against = f" (the level before: {fmt_value(a.baseline, v.metric)})" if a.baseline and s.status != "ok" else ""
        return f"{head}: {s.note or 'does not cross in the range measured'}{against}"
    if s.status == "building":
        return f"{head} ({building(a)})"
    if a.baseline is None:
        return head
    text = f"{head}: {pct(a.change)} vs {fmt_value(a.baseline, v.metric, ratio)} (threshold {v.threshold * 100:g} %)"
    return text + (f"; {s.note}" if s.note else "")


def comparison_text(c: dict[str, Any]) -> str:
    ci = c.get("ci95")
    # An interval spanning an order of magnitude is said in words (results/model.Comparison.ci_note).
    interval = f", CI {c['ci_note']}" if c.get("ci_note") else f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
    ratio = c.get("ratio")
    shown = f"{ratio:.3f}x" if isinstance(ratio, (int, float)) else "n/a"
    # An open-loop level is its rate (its concurrency is null): "@2 req/s".
    level = (
        f" @{c['rate']:g} req/s" if c.get("rate") else f" @{c['concurrency']}" if c.get("concurrency", 1) != 1 else ""
    )
    return f"{c.get('arm_label') or c['arm']} vs {c.get('vs_label') or c['vs']}{level}: {shown}{interval} " + (
        c.get("verdict") or "no verdict"
    )


def env_text(series: Sequence[SeriesVerdict]) -> str:
    """An item's environment step: each distinct difference once (with the arms that had it), then what each
    series measured against the level before the step."""
    changes = [c for s in series for c in s.changes]
    arms = list(dict.fromkeys(a for s in series for a in s.value.env_arms))
    if changes:
        head = describe_changes(changes, arms)
    else:  # verdicts made without their differences: their notes, each once
        head = "; ".join(dict.fromkeys(s.note or "see orch history" for s in series))
    moved = []
    for s in series:
        v, a = s.value, s.assessment
        ratio = is_ratio(v)
        value = f"{fmt_series_value(v)}{fmt_ci(v.lo, v.hi, v.metric, ratio) if v.censored is None else ''}"
        before = f" vs {fmt_value(a.baseline, v.metric, ratio)} before" if a.baseline is not None else ""
        moved.append(f"{series_label(v)} {value}: {pct(a.change)}{before}")
    return f"{head}; " + ", ".join(moved)


def item_label(r: ItemReport) -> str:
    """`**FAIL-ON slower**` for an item that pages only because tonight's A/B is what its fail_on names."""
    if r.status == "fail_on":
        return f"**FAIL-ON {','.join(r.fail_on_hit) or '?'}**"
    return LABELS.get(r.status, r.status)


def item_line(r: ItemReport) -> str:
    """The item's Markdown list item: its label, then what it measured in words; every text from outside (the
    item's name and host, errors, arm names, reasons) escaped (md_text, md_code)."""
    label = item_label(r)
    where = f"{md_code(r.item)} ({md_text(r.host, block=False)}{', SIMULATED' if r.simulated else ''})"
    if r.status in ("failed", "timeout", "skipped") or (r.status == "interrupted" and not r.series):
        return f"- {label} {where}: {md_text(first_line(r.error), block=False)}"
    envs = [s for s in r.series if s.status == "environment"]
    # A night that does not cross in the range, as the nights before, says nothing new: `orch history` has it.
    decisive = [
        s
        for s in r.series
        if s.status in ("regression", "improvement") or (s.note and s not in envs and s.value.censored is None)
    ]
    parts = ([env_text(envs)] if envs else []) + [series_text(s) for s in decisive]
    decisive += envs
    failed_relative = bool(r.fail_on_hit)
    if failed_relative:
        # A failed check's text carries the ratio and its CI; "tonight's A/B" because no history is involved.
        for c in (r.fail_on or {}).get("checks") or []:
            if c["exit_code"] != 3:
                continue
            # A FAIL-ON label for one mode names it already; under REGRESSION the hit is said as what it is.
            if r.status != "fail_on":
                lead = f"FAIL-ON {c['mode']}, "
            else:
                lead = f"{c['mode']}, " if len(r.fail_on_hit) > 1 else ""
            parts.append(f"{lead}tonight's A/B: {c['reason']}")
    else:
        first = r.comparisons[0] if r.comparisons else {}
        headline = [
            c
            for c in r.comparisons
            if (c.get("concurrency"), c.get("rate")) == (first.get("concurrency"), first.get("rate"))
        ]
        parts += [comparison_text(c) for c in headline[:3]]
    if not decisive and r.series:
        # The headline value first, unless tonight's A/B verdict is what failed: then that comes first.
        parts.insert(len(parts) if failed_relative else 0, series_text(r.series[0]))
    # A bound on the crossover or the SLO capacity that tonight could not decide is said: silence reads as "held".
    # (An undecided `slower` shows in the A/B's own words above.)
    parts += [
        f"fail_on {c['mode']} undecided: {c['reason']}"
        for c in (r.fail_on or {}).get("checks") or []
        if c.get("exit_code") == 4 and failon.across_levels_metric(str(c.get("mode", "")))
    ]
    noisy = [s for s in r.series if s.too_noisy]
    if noisy:
        s = noisy[0]
        noise = s.assessment.noise or 0.0
        parts.append(
            f"warning: {series_label(s.value)} varies {noise * 100:.1f} % night to night, more than half its "
            f"{s.value.threshold * 100:g} % threshold: expect false alarms (raise the threshold, or blocks and runs)"
        )
    # First: a line that reads "building history" must not hide that its nodes differed.
    parts[:0] = [f"WARNING: {w}" for w in r.warnings]
    return f"- {label} {where}: " + md_text("; ".join(parts), block=False)


def night_markdown(night: NightReport) -> str:
    counts = night.to_dict()["counts"]
    summary = ", ".join(f"{n} {LABELS.get(s, s).strip('*')}" for s, n in counts.items())
    lines = [f"## orch nightly: {md_text(night.suite, block=False)}, {when(night.night_at)}", ""]
    if any(i.simulated for i in night.items):
        lines += [f"> {SIM_BANNER}", ""]
    if night.status == "busy":
        lines.append(f"**NOT RUN**: {md_text(night.error or '', block=False)}; exit {night.exit_code}")
        return "\n".join(lines) + "\n"
    state = {
        "complete": "",
        "deadline": " — stopped at the deadline",
        "interrupted": " — interrupted",
        "failed": " — orch failed (see the error)",
    }.get(night.status, f" — {night.status}")
    lines.append(f"{len(night.items)} item(s): {summary or 'none'}{state}; exit {night.exit_code}")
    lines.append("")
    lines += [item_line(r) for r in night.items]
    lines += [
        "",
        f"night {md_code(night.night_id)} · suite {md_code(night.suite_path)} · `orch history ITEM` for the trend",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- orch history


@dataclass(frozen=True)
class HistoryRow:
    night: history.ItemNight
    value: history.SeriesValue | None
    verdict: SeriesVerdict | None  # what that night's judgement was, from the nights before it
    fail_on: str | None = None  # tonight's A/B failed the item's fail_on (`slower: …`): that night paged FAIL-ON


@dataclass(frozen=True)
class SeriesHistory:
    series: str
    rows: tuple[HistoryRow, ...]
    overall: changepoint.Assessment | None  # over every night: change points and outliers in hindsight

    @property
    def assessed(self) -> list[int]:
        """Indices of the rows the hindsight assessment saw (nights with a measured value; censored ones left out):
        `overall`'s steps and outliers index into this list."""
        return [i for i, r in enumerate(self.rows) if r.value is not None and r.value.censored is None]

    @property
    def latest(self) -> history.SeriesValue | None:
        return next((r.value for r in reversed(self.rows) if r.value is not None), None)


def series_history(nights: Sequence[history.ItemNight], series: str, min_history: int | None) -> SeriesHistory:
    """Each night of a series with what it decided then (from the nights before it, with the suite's min_history
    of that night unless one is given), and the whole series in hindsight."""
    rows = []
    past: list[history.ItemNight] = []
    for night in nights:
        value = night.value(series) if night.status == "complete" else None
        need = min_history if min_history is not None else value.min_history if value is not None else 5
        verdict = judge(value, past, night, need) if value is not None else None
        decided = night.decisions.get(series)
        if verdict is not None and decided is not None and min_history is None:
            # What the night said (a confirmation re-run's outcome included), not a recomputation.
            verdict = dataclasses.replace(verdict, status=decided.get("status") or verdict.status,
                                          note=decided.get("note") or "")  # fmt: skip
        hit = (decided or {}).get("fail_on")
        rows.append(HistoryRow(night, value, verdict, hit if isinstance(hit, str) else None))
        past.append(night)
    latest = next((r.value for r in reversed(rows) if r.value is not None), None)
    # The detector sees only measured values: a censored night (beyond the range, or undecided) is stored at a bound
    # or a placeholder, which is not a level the series was at (as `judge` already treats it, night by night).
    valued = [(r.night, r.value) for r in rows if r.value is not None and r.value.censored is None]
    points = [changepoint.Night(v.value, env) for (_, v), env in zip(valued, series_env_ids(valued), strict=True)]
    overall = (
        changepoint.assess(
            points,
            threshold=latest.threshold,
            higher_is_better=latest.higher_is_better,
            min_history=min_history if min_history is not None else latest.min_history,
        )
        if latest is not None and points
        else None
    )
    return SeriesHistory(series, tuple(rows), overall)


def history_text(item: str, host: str, shown: Sequence[SeriesHistory]) -> str:
    lines = []
    if any(r.night.simulated for s in shown for r in s.rows):
        lines += [SIM_BANNER, ""]
    for s in shown:
        latest = s.latest
        if latest is None:
            continue
        ratio = is_ratio(latest)
        direction = "higher is better" if latest.higher_is_better else "lower is better"
        lines.append(f"{item} on {host} — {series_label(latest)} (threshold {latest.threshold * 100:g} %, {direction})")
        # Indices into the nights hindsight saw: where it puts change points and outliers.
        valued = s.assessed
        steps = {valued[st.index]: st for st in (s.overall.steps if s.overall else ()) if st.index < len(valued)}
        outliers = {valued[i] for i in (s.overall.outliers if s.overall else ()) if i < len(valued)}
        lines.append(f"  {'night':<16}  {'value':>10}  {'95% CI':<22}  {'vs level':>9}  status")
        for i, row in enumerate(s.rows):
            stamp = when(row.night.night_at)
            if row.value is None or row.verdict is None:
                why = first_line(row.night.error or "no value for this series", 100)
                lines.append(f"  {stamp:<16}  {'—':>10}  {'':<22}  {'':>9}  {row.night.status}: {why}")
                continue
            v, verdict = row.value, row.verdict
            ci = fmt_ci(v.lo, v.hi, v.metric, ratio).strip() if v.censored is None else ""
            status = LABELS.get(verdict.status, verdict.status).strip("*")
            if verdict.status == "building":
                status = f"{building(verdict.assessment)}"
            if verdict.note:
                status += f": {verdict.note}"
            if row.fail_on:
                status += f"; FAIL-ON {row.fail_on}"
            marks = []
            if i in steps:
                st = steps[i]
                what = "environment step" if st.kind == "environment" else f"change point ({st.kind})"
                before, after = fmt_value(st.before, v.metric, ratio), fmt_value(st.after, v.metric, ratio)
                marks.append(f"◆ {what}: {before} → {after} ({pct(st.change)})")
            if i in outliers:
                marks.append("· outlier night (did not persist)")
            change = pct(verdict.assessment.change) if verdict.assessment.change is not None else ""
            lines.append(
                f"  {stamp:<16}  {fmt_series_value(v):>10}  {ci:<22}  {change:>9}  {status}"
                + ("  " + "; ".join(marks) if marks else "")
            )
        lines.append("")
    return "\n".join(visible(line) for line in lines).rstrip() + "\n"


def nights_text(item: str, host: str, nights: Sequence[history.ItemNight]) -> str:
    """An item without any value (every night failed): its nights and why."""
    lines = [f"{item} on {host}: no night measured anything", f"  {'night':<16}  status"]
    for n in nights:
        lines.append(f"  {when(n.night_at):<16}  {n.status}: {first_line(n.error, 100)}")
    return "\n".join(visible(line) for line in lines) + "\n"


def history_json(
    item: str, host: str, shown: Sequence[SeriesHistory], nights: Sequence[history.ItemNight] = ()
) -> dict[str, Any]:
    out = []
    for s in shown:
        latest = s.latest
        valued = s.assessed
        out.append(
            {
                "series": s.series,
                "arm": latest.arm if latest else None,
                "metric": latest.metric if latest else None,
                "threshold": latest.threshold if latest else None,
                "higher_is_better": latest.higher_is_better if latest else None,
                "nights": [
                    {
                        "night_id": r.night.night_id,
                        "night_at": r.night.night_at,
                        "item_status": r.night.status,
                        "error": r.night.error,
                        "experiments": list(r.night.experiments),
                        "value": r.value.value if r.value else None,
                        "ci95": [r.value.lo, r.value.hi]
                        if r.value and (r.value.lo is not None or r.value.hi is not None)
                        else None,
                        "censored": r.value.censored if r.value else None,
                        "status": r.verdict.status if r.verdict else None,
                        "change": r.verdict.assessment.change if r.verdict else None,
                        "note": (r.verdict.note or None) if r.verdict else None,
                        "fail_on": r.fail_on,
                    }
                    for r in s.rows
                ],
                "steps": [
                    {
                        "night_id": s.rows[valued[st.index]].night.night_id,
                        "kind": st.kind,
                        "before": st.before,
                        "after": st.after,
                        "change": st.change,
                    }
                    for st in (s.overall.steps if s.overall else ())
                    if st.index < len(valued)
                ],
                "outliers": [s.rows[valued[i]].night.night_id for i in (s.overall.outliers if s.overall else ())],
            }
        )
    simulated = any(n.simulated for n in nights) or any(r.night.simulated for s in shown for r in s.rows)
    each = [
        {"night_id": n.night_id, "night_at": n.night_at, "status": n.status, "error": n.error,
         "experiments": list(n.experiments)}
        for n in nights
    ]  # fmt: skip
    return {"item": item, "host": host, "simulated": simulated, "nights": each, "series": out}

"""The nightly history page's model built from the store: each item's series, levels, steps and gaps, and its state."""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from orchestrator.errors import OrchError
from orchestrator.nightly import history
from orchestrator.nightly.report import (
    LABELS,
    SeriesHistory,
    first_line,
    is_ratio,
    metric_label,
    series_history,
    series_label,
    when,
)
from orchestrator.nightly.result import ITEM_STATUSES, describe_changes, env_changes
from orchestrator.nightly.suite import Metric
from orchestrator.report import nightly_page as model
from orchestrator.results.store import Store

if TYPE_CHECKING:
    from orchestrator.nightly.suite import Item
    from orchestrator.results.model import ABResult
    from orchestrator.results.run import Level

RERUN_OFFSET = 0.18  # a confirmed night's two measurements, either side of the night
STORED_STATUS = {"failed": "failed", "timeout": "timeout", "interrupted": "interrupted", "skipped": "skipped"}


def suite_items(store: Store, suite: str, host: str | None = None) -> list[tuple[str, str]]:
    """(item, host) of every item a suite ran (on one host), in the order they first ran."""
    rows = store.query(
        "SELECT i.item, i.host, MIN(n.night_at) AS first FROM night_items i JOIN nights n ON n.id = i.night_id"
        " WHERE n.suite = ?" + (" AND i.host = ?" if host is not None else "") + " GROUP BY i.item, i.host"
        " ORDER BY first, MIN(i.rowid)",
        (suite, *((host,) if host is not None else ())),
    )
    return [(r["item"], r["host"]) for r in rows]


def known_suites(store: Store) -> list[str]:
    return [r[0] for r in store.query("SELECT DISTINCT suite FROM nights ORDER BY suite")]


def experiments(page: model.Page) -> list[str]:
    """Every experiment id the page names, each once, in page order (what --with-reports writes a report for)."""
    return list(dict.fromkeys(e for item in page.items for row in item.nights for e in row.experiments))


def build(
    store: Store,
    pairs: Sequence[tuple[str, str]],
    *,
    suite: str | None = None,
    title: str | None = None,
    min_history: int | None = None,
    series: Sequence[str] | None = None,
    reports: Mapping[str, str] | None = None,
) -> model.Page:
    """The page of items (item, host) from the store: every series of each (or only those named in `series`), and
    each item's state on the latest night of them all. Tonight is that night's date, never the wall clock."""
    loaded = [(item, host, history.item_nights(store, item, host, suite=suite)) for item, host in pairs]
    loaded = [(i, h, n) for i, h, n in loaded if n]
    tonight = max((n[-1].night_at for _, _, n in loaded), default=None)
    items = [_item(store, item, host, nights, tonight, min_history, series) for item, host, nights in loaded]
    attached = [
        f"ATTACHED: {i.item} on {i.host}: measured on running server(s) orch did not launch on some nights. State NOT "
        "fresh (no restart between blocks), environment NOT verified."
        for i in items
        if i.attached
    ]
    name = title or (f"orch nightly: {suite}" if suite else f"orch history: {', '.join(i.item for i in items)}")
    return model.Page(
        title=name,
        night=when(tonight) if tonight is not None else "no night stored",
        items=tuple(items),
        simulated=any(i.simulated for i in items),
        attached=tuple(attached),
        reports=dict(reports or {}),
    )


def with_reports(page: model.Page, reports: Mapping[str, str]) -> model.Page:
    return model.Page(
        title=page.title,
        night=page.night,
        items=page.items,
        simulated=page.simulated,
        attached=page.attached,
        reports=dict(reports),
    )


def anchor(*parts: str) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9_-]+", "_", p) for p in parts)


def _item(
    store: Store,
    item: str,
    host: str,
    nights: Sequence[history.ItemNight],
    tonight: float | None,
    min_history: int | None,
    only: Sequence[str] | None,
) -> model.Item:
    names = [s for s in dict.fromkeys(s.series for n in nights for s in n.series) if only is None or s in only]
    shown = [series_history(nights, s, min_history) for s in names]
    reruns = _reruns(store, nights)
    series = tuple(_series(item, host, s, nights, reruns) for s in shown)
    rows = tuple(_night_row(k, nights, shown) for k in range(len(nights)))
    last = rows[-1]
    state, label = last.state, last.label
    if tonight is not None and nights[-1].night_at < tonight:
        state, label = "not run", f"not run tonight (last night {last.night}: {last.label})"
    noisiest = max((s for s in series if s.noise is not None), key=lambda s: (s.noise or 0) / s.threshold, default=None)
    warning = next((s.noise_warning for s in series if s.noise_warning), None)
    env_nights = next(
        (r.verdict.assessment.nights for s in shown for r in reversed(s.rows) if r.verdict is not None), None
    )
    if noisiest is not None and noisiest.noise is not None:
        noise = f"{noisiest.noise * 100:.1f} % vs {noisiest.threshold * 100:g} %"
    else:  # the noise is estimated from night-to-night differences within one environment
        noise = "not yet known (too few nights in this environment)" if series else "—"
    return model.Item(
        item=item,
        host=host,
        anchor=anchor("item", item, host),
        state=state,
        label=label,
        night=last.night,
        noise=noise,
        noise_warning=warning,
        env_nights=env_nights,
        experiments=nights[-1].experiments,
        simulated=any(n.simulated for n in nights),
        attached=_attached(store, nights),
        series=series,
        nights=rows,
    )


def _night_row(k: int, nights: Sequence[history.ItemNight], shown: Sequence[SeriesHistory]) -> model.NightRow:
    """What an item's night decided, as the summary said it: the worst of its series, or why it has none."""
    night = nights[k]
    stamp = when(night.night_at)
    if night.status in STORED_STATUS:
        state = STORED_STATUS[night.status]
        return model.NightRow(
            night=stamp,
            state=state,
            label=LABELS[state].strip("*"),
            experiments=night.experiments,
            note=first_line(night.error, 200),
        )
    verdicts = [(s, s.rows[k]) for s in shown if s.rows[k].verdict is not None]
    statuses = {r.verdict.status for _, r in verdicts if r.verdict is not None}
    hits = list(dict.fromkeys(r.fail_on for _, r in verdicts if r.fail_on))
    if "regression" in statuses:
        state = "regression"
    elif hits:
        state = "fail_on"
    else:
        state = next((s for s in ITEM_STATUSES if s in statuses), "ok")
    notes = [
        f"{series_label(r.value)}: {r.verdict.note}"
        for _, r in verdicts
        if r.verdict is not None and r.value is not None and r.verdict.note and r.verdict.status != "environment"
    ]
    envs = list(dict.fromkeys(r.verdict.note for _, r in verdicts if r.verdict and r.verdict.status == "environment"))
    before = next((n for n in reversed(nights[:k]) if n.status == "complete" and n.series), None)
    if envs and before is not None:
        # Each difference once for the item, with the arms that had it, as the summary's line says it.
        arms = list(dict.fromkeys(a for v in night.series for a in v.env_arms))
        found = env_changes(before, night, arms)
        envs = [describe_changes(found, arms)] if found else envs
    modes = [h.split(":", 1)[0] for hit in hits for h in hit.split("; ")]
    label = f"FAIL-ON {','.join(dict.fromkeys(modes))}" if state == "fail_on" else LABELS[state].strip("*")
    note = "; ".join([*(e for e in envs if e), *notes, *(f"FAIL-ON {h}" for h in hits)])
    return model.NightRow(night=stamp, state=state, label=label, experiments=night.experiments, note=note)


def _series(
    item: str,
    host: str,
    s: SeriesHistory,
    nights: Sequence[history.ItemNight],
    reruns: Mapping[str, tuple[dict[str, history.SeriesValue], dict[str, history.SeriesValue]]],
) -> model.Series:
    latest = s.latest
    assert latest is not None  # a series is named by a night that measured it
    ratio = is_ratio(latest)
    valued = [k for k, r in enumerate(s.rows) if r.value is not None]
    assessed = s.assessed  # the nights hindsight saw (censored ones left out): its steps and outliers index these
    overall = s.overall
    steps = [st for st in (overall.steps if overall else ()) if st.index < len(assessed)]
    outliers = [assessed[i] for i in (overall.outliers if overall else ()) if i < len(assessed)]
    points: list[model.Point] = []
    for k in valued:
        v = s.rows[k].value
        assert v is not None
        pair = reruns.get(nights[k].night_id)
        first, second = (pair[0].get(s.series), pair[1].get(s.series)) if pair else (None, None)
        if first is not None and second is not None:
            points += [_point(k - RERUN_OFFSET, first, "first"), _point(k + RERUN_OFFSET, second, "rerun")]
        else:
            points.append(_point(k, v, "night"))
    # Levels between steps, on the nights hindsight saw (never a failed or censored night).
    cuts = [0, *(st.index for st in steps), len(assessed)]
    levels = []
    for a, b in itertools.pairwise(cuts):
        kept = [s.rows[assessed[i]].value for i in range(a, b) if assessed[i] not in outliers]
        xs = [v.value for v in kept if v is not None]
        if b > a and xs:
            levels.append(model.Level(assessed[a], assessed[b - 1], statistics.median(xs)))
    band = None
    if levels:
        cur = levels[-1]
        band = (cur.first, cur.last, cur.value * (1 - latest.threshold), cur.value * (1 + latest.threshold))
    changes = tuple(
        model.Change(x=assessed[st.index], kind=st.kind, before=st.before, after=st.after, change=st.change)
        for st in steps
        if st.kind != "environment"
    )
    env_steps = []
    for st in steps:
        if st.kind != "environment" or st.index == 0:
            continue
        before, after = s.rows[assessed[st.index - 1]], s.rows[assessed[st.index]]
        found = env_changes(before.night, after.night, latest.env_arms)
        text = describe_changes(found, latest.env_arms) if found else (_env_note(after) or "environment changed")
        env_steps.append(model.EnvStep(assessed[st.index], text.replace(" -> ", " → ")))
    gaps = tuple(
        model.Gap(k, _gap_label(r.night)) for k, r in enumerate(s.rows) if r.value is None and r.night is not None
    )
    verdict = next((r.verdict for r in reversed(s.rows) if r.verdict is not None), None)
    noise = verdict.assessment.noise if verdict is not None else None
    warning = None
    if verdict is not None and verdict.too_noisy and noise is not None:
        warning = (
            f"{series_label(latest)} varies {noise * 100:.1f} % night to night, more than half its "
            f"{latest.threshold * 100:g} % threshold: expect false alarms (raise the threshold, or blocks and runs)"
        )
    return model.Series(
        series=s.series,
        anchor=anchor("series", item, host, s.series),
        title=series_label(latest),
        unit=metric_label(latest.metric) + (" ratio" if ratio else ""),
        threshold=latest.threshold,
        higher_is_better=latest.higher_is_better,
        nights=tuple(when(n.night_at) for n in nights),
        points=tuple(points),
        levels=tuple(levels),
        band=band,
        changes=changes,
        env_steps=tuple(env_steps),
        gaps=gaps,
        outliers=tuple(outliers),
        noise=noise,
        noise_warning=warning,
        simulated=any(n.simulated for n in nights),
        ratio=ratio,
    )


def _point(x: float, v: history.SeriesValue, kind: str) -> model.Point:
    return model.Point(x=x, value=v.value, lo=v.lo, hi=v.hi, kind=kind, censored=v.censored)


def _env_note(row: Any) -> str | None:
    note = row.verdict.note if row.verdict is not None else None
    return note if isinstance(note, str) and note else None


def _gap_label(night: history.ItemNight) -> str:
    what = LABELS.get(STORED_STATUS.get(night.status, ""), "").strip("*") or "no value"
    why = first_line(night.error or ("no value for this series" if night.status == "complete" else None), 90)
    return f"{what}: {why}"


def _attached(store: Store, nights: Sequence[history.ItemNight]) -> bool:
    """Whether any experiment of the item had an arm on a server orch did not launch (`attach:` in a profile)."""
    for night in nights:
        for exp in night.experiments:
            row = store.experiment(exp)
            profiles = json.loads(row["config_json"]).get("profiles") if row and row.get("config_json") else None
            if any(isinstance(p, dict) and p.get("attach") for p in profiles or []):
                return True
    return False


@dataclass(frozen=True)
class _Measured:
    """What history.measure reads of an Item (its metrics and levels), for an experiment stored without its suite."""

    metrics: tuple[Metric, ...]
    levels: tuple[Level, ...]


def _reruns(
    store: Store, nights: Sequence[history.ItemNight]
) -> dict[str, tuple[dict[str, history.SeriesValue], dict[str, history.SeriesValue]]]:
    """Per night re-measured to confirm a regression: each of its two measurements' series, as measured alone (the
    night's stored value pools them). A night whose experiments cannot be read back shows its pooled value."""
    from orchestrator.results.load import load_result

    out = {}
    for night in nights:
        if night.status != "complete" or len(night.experiments) < 2 or not night.series:
            continue
        metrics = tuple(_metric(key, v.threshold) for key, v in {v.metric: v for v in night.series}.items())
        measured = []
        try:
            for exp in night.experiments[:2]:
                result: ABResult = load_result(store, exp)
                shape = _Measured(metrics, tuple(result.levels))
                values, _ = history.measure(cast("Item", shape), result, night.series[0].min_history)
                measured.append({v.series: v for v in values})
        except (OrchError, ValueError, KeyError, IndexError):
            continue
        out[night.night_id] = (measured[0], measured[1])
    return out


def _metric(key: str, threshold: float) -> Metric:
    name, _, at = key.partition("@")
    level: float | None = float(at) if at else None
    if level is not None and math.isfinite(level) and level == int(level):
        level = int(level)
    return Metric(name, level, threshold)

"""The nightly history as one self-contained HTML page (inline CSS and SVG, no scripts, no network), from its model."""

from __future__ import annotations

import html
from collections.abc import Sequence

from orchestrator import __version__
from orchestrator.common.printable import visible
from orchestrator.report import plots
from orchestrator.report.html import CSS
from orchestrator.report.lines import SIM_BANNER
from orchestrator.report.nightly_page import STATE_CLASSES, Item, NightRow, Page, Series

PAGE_CSS = """
td.s-bad{color:#cf222e;font-weight:700}td.s-warn{color:#9a6700;font-weight:700}td.s-env{color:#8250df;font-weight:700}
td.s-good{color:#1a7f37}td.s-info{color:#57606a}td.noisy{color:#9a6700;font-weight:600}
section.item{margin-top:28px}code{font-size:12.5px}td.note{font-size:12px;color:#57606a;max-width:520px}
"""


def _e(value: object) -> str:
    """value as HTML text or an attribute's value, its control characters and bidi overrides shown (report/html)."""
    return html.escape(visible(str(value)), quote=True)


def _experiment(exp: str, page: Page) -> str:
    href = page.reports.get(exp)
    code = f"<code>{_e(exp)}</code>"
    return f'<a class="experiment" href="{_e(href)}">{code}</a>' if href else code


def _experiments(ids: Sequence[str], page: Page) -> str:
    return " ".join(_experiment(e, page) for e in ids) or "—"


def _header(page: Page) -> str:
    rows = []
    for item in page.items:
        cls = STATE_CLASSES.get(item.state, "info")
        noise = f'<td class="{"noisy" if item.noise_warning else "n"}">{_e(item.noise)}</td>'
        env = f'<td class="n">{item.env_nights if item.env_nights is not None else "—"}</td>'
        rows.append(
            f'<tr id="row-{_e(item.anchor)}"><td><a href="#{_e(item.anchor)}">{_e(item.item)}</a></td>'
            f"<td>{_e(item.host)}{' (SIMULATED)' if item.simulated else ''}</td>"
            f'<td class="s-{cls}">{_e(item.label)}</td>{noise}{env}'
            f"<td>{_experiments(item.experiments, page)}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("item", "host", "tonight", "noise (night to night vs threshold)", "nights in this environment",
                  "tonight's experiments")
    )  # fmt: skip
    warnings = [
        f'<li class="warn">{_e(i.item)}: warning: {_e(i.noise_warning)}</li>' for i in page.items if i.noise_warning
    ]
    return (
        f'<section id="tonight"><h2>Tonight</h2><table id="table-items"><thead><tr>{head}</tr></thead><tbody>'
        + "".join(rows)
        + "</tbody></table>"
        + (f'<ul id="noise-warnings">{"".join(warnings)}</ul>' if warnings else "")
        + "</section>"
    )


def _caption(s: Series) -> str:
    marks = plots.censored_marks(s)
    measured = [p for p in s.points if p.censored not in marks]
    head = f"{s.title}, night by night: each point is a night's value"
    if any(p.lo is not None or p.hi is not None for p in measured):
        head += " with its 95% CI"
    if s.levels:
        head += (
            "; the black lines are the levels the change-point detector sees (the median of the nights between two "
            "steps)"
        )
    if s.band is not None:
        head += f"; the grey band is the item's threshold (±{s.threshold * 100:g} %) around the current level"
    parts = [head]
    if plots.open_ends(s):
        parts.append(
            "An arrow to the plot's edge is an interval open on that side: it reaches the end of the range measured"
        )
    censored = {p.censored for p in s.points if p.censored in marks}
    if censored & {"above", "below"}:
        sides = [w for c, w in (("above", "▲ at least this"), ("below", "▼ at most this")) if c in censored]
        parts.append(
            "A triangle is a night beyond the range measured: its value is the range's end, a bound, not a "
            "measurement (" + ", ".join(sides) + ")"
        )
    if "undecided" in censored:
        what = (
            "neither staying within the SLO throughout nor leaving it in its bar is excluded"
            if plots.is_load_slo(s)
            else "no crossing seen, but one may lie in its bar"
        )
        parts.append(
            f"A hollow circle is an undecided night, not judged: {what}; it is drawn at the middle of that interval "
            "(a placeholder, not a measurement)"
        )
    if any(p.kind == "rerun" for p in s.points):
        parts.append("A night re-measured to confirm a regression shows both measurements (the diamond is the re-run)")
    if s.changes:
        parts.append(
            "Change points: "
            + "; ".join(
                f"{s.nights[c.x]}: {c.kind} {c.change * 100:+.1f} % ({c.before:.4g} → {c.after:.4g})" for c in s.changes
            )
        )
    if s.env_steps:
        parts.append(
            "Environment steps (a new history): " + "; ".join(f"{s.nights[e.x]}: {e.label}" for e in s.env_steps)
        )
    if s.gaps:
        parts.append("Nights without a value: " + "; ".join(f"{s.nights[g.x]}: {g.label}" for g in s.gaps))
    if s.outliers:
        parts.append("Outlier nights (did not persist): " + ", ".join(s.nights[x] for x in s.outliers))
    return ". ".join(p.rstrip(".") for p in parts) + "."


def _series(s: Series) -> str:
    svg = plots.nightly_series(s.anchor, s)
    labels = (
        [f'<li class="change c-{_e(c.kind)}">{_e(s.nights[c.x])}: {_e(c.kind)} {c.change * 100:+.1f} %</li>'
         for c in s.changes]
        + [f'<li class="env-step">{_e(s.nights[e.x])}: environment step: {_e(e.label)}</li>' for e in s.env_steps]
        + [f'<li class="gap">{_e(s.nights[g.x])}: {_e(g.label)}</li>' for g in s.gaps]
    )  # fmt: skip
    return (
        f'<figure id="{_e(s.anchor)}">{svg}<figcaption id="{_e(s.anchor)}-cap">{_e(_caption(s))}</figcaption>'
        + (f'<ul class="marks">{"".join(labels)}</ul>' if labels else "")
        + "</figure>"
    )


def _nights_table(item: Item, page: Page) -> str:
    def row(r: NightRow) -> str:
        cls = STATE_CLASSES.get(r.state, "info")
        return (
            f'<tr><td>{_e(r.night)}</td><td class="s-{cls}">{_e(r.label)}</td>'
            f'<td>{_experiments(r.experiments, page)}</td><td class="note">{_e(r.note)}</td></tr>'
        )

    return (
        f'<table id="nights-{_e(item.anchor)}" class="nights"><thead><tr><th>night</th><th>state</th>'
        "<th>experiments</th><th>what was decided</th></tr></thead><tbody>"
        + "".join(row(r) for r in reversed(item.nights))
        + "</tbody></table>"
    )


def _item(item: Item, page: Page) -> str:
    cls = STATE_CLASSES.get(item.state, "info")
    head = (
        f'<section class="item" id="{_e(item.anchor)}"><h2>{_e(item.item)} on {_e(item.host)}</h2>'
        f'<p class="meta">Tonight: <span class="s-{cls}">{_e(item.label)}</span>; '
        f"{len(item.nights)} night(s) stored, "
        f"{item.env_nights if item.env_nights is not None else 'no'} in its current environment.</p>"
    )
    if not item.series:
        head += '<p class="note">No night of this item measured anything: each night and why is below.</p>'
    return head + "".join(_series(s) for s in item.series) + _nights_table(item, page) + "</section>"


def render(page: Page) -> str:
    """`orch history --html` and `orch nightly --html-out`: the page as one HTML document."""
    plots.require_matplotlib()
    body = [f"<h1>{_e(page.title)}</h1>"]
    body.append(
        f'<p class="meta">As of the night of {_e(page.night)}; {len(page.items)} item(s). Each item\'s series '
        "below, night by night; what the detector decided each night is in its table.</p>"
    )
    if page.simulated:
        body.append(f'<div class="banner sim" id="banner-simulated">{_e(SIM_BANNER)}</div>')
    body += [f'<div class="banner attached" id="banner-attached">{_e(b)}</div>' for b in page.attached]
    body.append(_header(page))
    body += [_item(item, page) for item in page.items]
    body.append(f'<footer class="note">orch {_e(__version__)}. One file: no scripts, no network.</footer>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(page.title)} — orch</title><style>{CSS}{PAGE_CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )

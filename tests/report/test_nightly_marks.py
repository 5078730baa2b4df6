"""The nightly page's crossover and max_rate_slo series, from hand-built page models to their figures and captions: a
night beyond the range measured (a bound), an undecided night (a placeholder value and the interval it may lie in),
a CI open on one side, and a series of nothing but bounds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.workload import BenchConfig
from orchestrator.nightly import history, page
from orchestrator.nightly.suite import Item, Metric
from orchestrator.report import nightly_html, plots
from orchestrator.report.nightly_page import Level, Point, Series
from orchestrator.results.store import Store
from tests.report.test_nightly_html import DAY, START, parse

pytest.importorskip("matplotlib")

NIGHTS = tuple(f"2026-11-{20 + k} 02:00" for k in range(8))


def series(
    points: Sequence[Point],
    *,
    metric: str = "crossover",
    levels: Sequence[Level] = (),
    band: tuple[int, int, float, float] | None = None,
) -> Series:
    return Series(
        series=f"eagle3/baseline:{metric}",
        anchor=f"series-load-box-{metric}",
        title=f"eagle3/baseline {metric}",
        unit="req/s",
        threshold=0.15,
        higher_is_better=True,
        nights=NIGHTS[: max(round(p.x) for p in points) + 1],
        points=tuple(points),
        levels=tuple(levels),
        band=band,
        changes=(),
        env_steps=(),
        gaps=(),
        outliers=(),
        noise=None,
        noise_warning=None,
    )


def draw(monkeypatch: pytest.MonkeyPatch, s: Series) -> tuple[Any, str]:
    """The series' figure as the page renders it (laid out and written as SVG), and its axes to look into."""
    figures: list[Any] = []
    render = plots._render

    def keep(fig_id: str, size: tuple[float, float], paint: Callable[[Any], None]) -> str:
        def painted(fig: Any) -> None:
            paint(fig)
            figures.append(fig)

        return render(fig_id, size, painted)

    monkeypatch.setattr(plots, "_render", keep)
    svg = plots.nightly_series(s.anchor, s)
    (fig,) = figures
    (ax,) = fig.axes
    return ax, svg


def marks(ax: Any) -> dict[float, tuple[str, str, tuple[float, float] | None]]:
    """Each night drawn by x: its marker, its face colour and its bar's ends (None without one)."""
    from matplotlib.colors import to_hex

    out: dict[float, tuple[str, str, tuple[float, float] | None]] = {}
    for c in ax.containers:
        line, _, bars = c.lines
        ends = {}
        for col in bars:
            for seg in col.get_segments():
                ends[float(seg[0][0])] = (float(seg[0][1]), float(seg[1][1]))
        for x, _ in line.get_xydata():
            out[float(x)] = (line.get_marker(), to_hex(line.get_markerfacecolor()), ends.get(float(x)))
    return out


def arrows(ax: Any) -> list[tuple[float, float, float]]:
    """Each arrow to the plot's edge: its night, the value it starts from and the edge (axes fraction) it ends at."""
    return [
        (t.xy[0], t.xyann[1], t.xy[1])
        for t in ax.texts
        if getattr(t, "arrow_patch", None) is not None and t.arrowprops is not None
    ]


def legend(ax: Any) -> list[str]:
    found = ax.get_legend()
    return [t.get_text() for t in found.get_texts()] if found else []


MIXED = [
    Point(x=0, value=4.4, lo=4.1, hi=4.7),
    Point(x=1, value=4.5, lo=4.2, hi=4.8),
    Point(
        x=2, value=8.0, lo=8.0, hi=None, censored="above"
    ),  # better at every level, up to the highest (8): at least 8
    Point(x=3, value=1.0, lo=None, hi=1.0, censored="below"),  # worse at every level, down to the lowest (1): at most 1
    Point(x=4, value=4.0, lo=2.0, hi=8.0, censored="undecided"),  # sqrt(2 * 8): where a crossing may lie, a placeholder
    Point(x=5, value=4.6, lo=4.13, hi=None),  # crossed, its CI open above (it reaches the highest level)
]


def test_each_censored_night_has_its_own_mark_and_legend(monkeypatch: pytest.MonkeyPatch) -> None:
    s = series(MIXED, levels=(Level(0, 5, 4.5),), band=(0, 5, 4.5 * 0.85, 4.5 * 1.15))
    ax, svg = draw(monkeypatch, s)
    drawn = marks(ax)
    assert drawn[0][:2] == ("o", "#1f77b4") and drawn[1][:2] == ("o", "#1f77b4")  # measured: filled dots
    assert drawn[2][0] == "^" and drawn[3][0] == "v"  # the bounds, each pointing the way the truth lies
    # Undecided: hollow, its bar over the interval a crossing may lie in.
    marker, face, bar = drawn[4]
    assert marker == "o" and face == "#ffffff" and bar == pytest.approx((2.0, 8.0))
    assert drawn[2][2] is None or drawn[2][2][0] == drawn[2][2][1]  # a bound has no bar
    said = legend(ax)
    for words in (
        "night",
        "beyond the range measured: at least this",
        "beyond the range measured: at most this",
        "undecided: a crossing may lie in the bar (not judged)",
    ):
        assert said.count(words) == 1, said
        assert words in svg
    # Seven entries fit above the plot without squeezing it; a load's axis (and a CI open below) stops at 0.
    assert ax.get_position().width > 0.8
    assert ax.get_ylim()[0] == 0.0


def test_a_one_sided_ci_is_a_bar_and_an_arrow_to_the_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    points = [
        Point(x=0, value=4.4, lo=4.1, hi=4.7),
        Point(x=1, value=4.6, lo=4.13, hi=None),
        Point(x=2, value=2.0, lo=None, hi=2.8),
        Point(x=3, value=4.5, lo=4.2, hi=4.8),
    ]
    ax, _ = draw(monkeypatch, series(points, levels=(Level(0, 3, 4.45),), band=(0, 3, 3.8, 5.1)))
    drawn = marks(ax)
    assert drawn[1][2] == pytest.approx((4.13, 4.6)) and drawn[2][2] == pytest.approx((2.0, 2.8))
    assert sorted(arrows(ax)) == [(1, 4.6, 1.0), (2, 2.0, 0.0)]  # the open side: up to the top, down to the bottom


def test_open_ends_of_a_crossing_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A throughput series' night without a CI (one launch) is no open interval; a crossing's CI open on both sides,
    and an undecided night whose interval reaches both ends of the range, are."""
    tok_s = series([Point(x=0, value=80.0, lo=None, hi=None), Point(x=1, value=81.0, lo=80.0, hi=82.0)], metric="tok_s")
    assert not plots.open_ends(tok_s)
    ax, _ = draw(monkeypatch, tok_s)
    assert not arrows(ax)
    load = series(
        [Point(x=0, value=3.0, lo=None, hi=None), Point(x=1, value=2.8, lo=None, hi=None, censored="undecided")]
    )
    assert sorted(arrows(draw(monkeypatch, load)[0])) == [(0, 3.0, 0.0), (0, 3.0, 1.0), (1, 2.8, 0.0), (1, 2.8, 1.0)]


def test_a_series_of_bounds_has_an_axis_around_them(monkeypatch: pytest.MonkeyPatch) -> None:
    s = series([Point(x=k, value=8.0, lo=8.0, hi=None, censored="above") for k in range(5)])
    ax, _ = draw(monkeypatch, s)
    lo, hi = ax.get_ylim()
    assert lo <= 8.0 * 0.85 and hi >= 8.0 * 1.15 and lo > 0, (lo, hi)
    assert legend(ax) == ["beyond the range measured: at least this"]  # no "night": none was measured


def test_the_caption_says_only_what_is_drawn() -> None:
    bounds = nightly_html._caption(series([Point(x=k, value=8.0, lo=8.0, hi=None, censored="above") for k in range(3)]))
    for absent in ("95% CI", "black lines", "grey band", "hollow", "arrow", "▼"):
        assert absent not in bounds, (absent, bounds)
    assert "A triangle is a night beyond the range measured" in bounds and "▲ at least this" in bounds
    mixed = nightly_html._caption(series(MIXED, levels=(Level(0, 5, 4.5),), band=(0, 5, 3.8, 5.2)))
    for present in (
        "with its 95% CI",
        "the black lines are the levels",
        "the grey band is the item's threshold (±15 %)",
        "An arrow to the plot's edge is an interval open on that side",
        "▲ at least this, ▼ at most this",
        "A hollow circle is an undecided night, not judged: no crossing seen, but one may lie in its bar",
    ):
        assert present in mixed, (present, mixed)
    slo = nightly_html._caption(
        series([Point(x=0, value=4.0, lo=2.0, hi=8.0, censored="undecided")], metric="max_rate_slo")
    )
    assert "leaving it in its bar" in slo and "arrow" not in slo and "triangle" not in slo


def test_censored_nights_from_the_store_to_the_page(tmp_path: Path) -> None:
    """Through the model: nights recorded with a crossing, a bound and an undecided one (as history.censored_value
    stores them) reach the figure and its caption as such."""
    store = Store(tmp_path / "nightly.db")
    item = Item(
        name="load",
        profiles=(),
        host="box",
        sim=True,
        bench=BenchConfig(),
        blocks=2,
        order="random",
        metrics=(Metric("crossover", None, 0.15),),
        threshold=0.15,
        timeout_s=3600.0,
    )
    nights = [(4.4, 4.1, 4.7, None), (4.5, 4.13, None, None), (8.0, 8.0, None, "above"), (4.0, 2.0, 8.0, "undecided")]
    for k, (value, lo, hi, censored) in enumerate(nights):
        history.start_night(store, f"n{k}", "s", "s.yaml", "0" * 64, START + k * DAY)
        envs = {arm: {"engine.version": "0.5.9"} for arm in ("baseline", "eagle3")}
        v = history.SeriesValue(
            series="eagle3/baseline:crossover",
            arm="eagle3/baseline",
            metric="crossover",
            value=value,
            lo=lo,
            hi=hi,
            n=2,
            threshold=0.15,
            higher_is_better=True,
            env=history.env_key(envs, ["eagle3", "baseline"]),
            env_arms=("eagle3", "baseline"),
            min_history=3,
            censored=censored,
        )
        history.record_item(
            store,
            f"n{k}",
            item,
            status="complete",
            experiments=(f"e{k}",),
            error=None,
            series=(v,),
            envs=envs,
            simulated=True,
        )
        history.finish_night(store, f"n{k}", "complete", 0, {})
    model = page.build(store, page.suite_items(store, "s"), suite="s")
    (s,) = model.items[0].series
    assert [p.censored for p in s.points] == [None, None, "above", "undecided"]
    fig = parse(nightly_html.render(model)).figures[s.anchor]
    assert "undecided: a crossing may lie in the bar (not judged)" in fig and "at least this" in fig
    assert "A hollow circle is an undecided night" in fig and "An arrow to the plot's edge" in fig

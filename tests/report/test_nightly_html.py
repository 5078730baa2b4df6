"""The nightly history page from a hand-filled store: its model (nightly/page) and its HTML (report/nightly_html)."""

from __future__ import annotations

import dataclasses
import math
import random
from html.parser import HTMLParser
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config.workload import BenchConfig
from orchestrator.nightly import history, page
from orchestrator.nightly.suite import Item, Metric
from orchestrator.report import nightly_html
from orchestrator.results.store import Store

DAY = 86400.0
START = 1795140000.0  # 2026-11-20 around 02:00


class Page(HTMLParser):
    """The text of each figure (its SVG's labels, its caption and list), each table's rows, every id and link."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.figures: dict[str, str] = {}
        self.svgs: dict[str, int] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self.classes: dict[str, list[str]] = {}
        self._figure: str | None = None
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._class: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "a" and a.get("href"):
            self.links.append(str(a["href"]))
        if tag == "figure":
            self._figure = str(a["id"])
            self.figures[self._figure] = ""
        elif tag == "svg" and self._figure:
            self.svgs[self._figure] = self.svgs.get(self._figure, 0) + 1
        elif tag == "table":
            self._table = str(a.get("id"))
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []
        if tag in ("li", "td", "span"):
            self._class.append(str(a.get("class") or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._figure = None
        elif tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._table and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        if tag in ("li", "td", "span") and self._class:
            self._class.pop()

    def handle_data(self, data: str) -> None:
        if self._figure:
            self.figures[self._figure] += data
        if self._cell is not None:
            self._cell.append(data)
        if self._class and self._class[-1]:
            self.classes.setdefault(self._class[-1], []).append(data)


def parse(text: str) -> Page:
    parsed = Page()
    parsed.feed(text)
    return parsed


def fill(store: Store, nights: int = 14) -> None:
    """Two items of a suite: an A/B (both arms' tok/s and their ratio) and a bench item that gets 8 % slower from
    night 5; an engine upgrade on night 9 (both); the bench item fails on night 12 and times out on night 13
    (tonight)."""
    rng = random.Random(3)
    ab = Item(
        name="ab",
        profiles=(),
        host="box",
        sim=True,
        bench=BenchConfig(),
        blocks=3,
        order="random",
        metrics=(Metric("tok_s", None, 0.03),),
        threshold=0.03,
        timeout_s=3600.0,
    )
    bench = Item(
        name="one",
        profiles=(),
        host="box",
        sim=True,
        bench=BenchConfig(),
        blocks=1,
        order="random",
        metrics=(Metric("tok_s", None, 0.02),),
        threshold=0.02,
        timeout_s=3600.0,
    )
    for k in range(nights):
        night_id = f"n{k:03d}"
        history.start_night(store, night_id, "s", "s.yaml", "0" * 64, START + k * DAY)
        version = "0.5.10" if k >= 9 else "0.5.9"
        for item, arms in ((ab, ("base", "spec")), (bench, ("base",))):
            envs = {arm: {"engine.version": version} for arm in arms}
            if item is bench and k in (12, 13):
                status = "failed" if k == 12 else "timeout"
                error = "base: server exited during startup" if k == 12 else "stopped by the item's timeout (1h)"
                history.record_item(
                    store,
                    night_id,
                    item,
                    status=status,
                    experiments=(f"e{k}-x",),
                    error=error,
                    series=(),
                    envs={},
                    simulated=True,
                )
                continue
            slow = 0.92 if item is bench and k >= 5 else 1.0
            series, values = [], {}
            for arm in arms:
                v = {"base": 80.0, "spec": 60.0}[arm] * slow * math.exp(rng.gauss(0, 0.004))
                values[arm] = v
                series.append(
                    history.SeriesValue(
                        series=f"{arm}:tok_s",
                        arm=arm,
                        metric="tok_s",
                        value=v,
                        lo=v * 0.99,
                        hi=v * 1.01,
                        n=3,
                        threshold=item.threshold,
                        higher_is_better=True,
                        env=history.env_key(envs, [arm]),
                        env_arms=(arm,),
                        min_history=3,
                    )
                )
            if len(arms) == 2:
                r = values["spec"] / values["base"]
                series.append(
                    history.SeriesValue(
                        series="spec/base:tok_s",
                        arm="spec/base",
                        metric="tok_s",
                        value=r,
                        lo=r * 0.98,
                        hi=r * 1.02,
                        n=3,
                        threshold=0.03,
                        higher_is_better=True,
                        env=history.env_key(envs, list(arms)),
                        env_arms=arms,
                        min_history=3,
                    )
                )
            history.record_item(
                store,
                night_id,
                item,
                status="complete",
                experiments=(f"e{k}-{item.name}",),
                error=None,
                series=series,
                envs=envs,
                simulated=True,
            )
        history.finish_night(store, night_id, "complete", 0, {})


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "nightly.db")
    fill(s)
    return s


def test_the_model_holds_levels_steps_and_gaps(store: Store) -> None:
    pairs = page.suite_items(store, "s")
    assert pairs == [("ab", "box"), ("one", "box")]
    model = page.build(store, pairs, suite="s")
    assert model.title == "orch nightly: s" and model.simulated and not model.attached
    assert model.night.startswith("2026-12-03")  # the last night's date, not today's
    ab, one = model.items
    assert [s.series for s in ab.series] == ["base:tok_s", "spec:tok_s", "spec/base:tok_s"]
    (tok_s,) = one.series
    assert len(tok_s.nights) == 14 and len(tok_s.points) == 12
    (change,) = tok_s.changes
    assert change.x == 5 and change.kind == "regression" and change.change == pytest.approx(-0.08, abs=0.02)
    (env,) = tok_s.env_steps
    assert env.x == 9 and "0.5.9 → 0.5.10" in env.label
    assert [(g.x, g.label.split(":")[0]) for g in tok_s.gaps] == [(12, "FAILED"), (13, "TIMED OUT")]
    assert "server exited during startup" in tok_s.gaps[0].label
    assert [(lv.first, lv.last) for lv in tok_s.levels] == [(0, 4), (5, 8), (9, 11)]
    assert tok_s.band is not None and tok_s.band[:2] == (9, 11)
    lo, hi = tok_s.band[2:]
    assert hi / lo == pytest.approx(1.02 / 0.98)
    assert one.state == "timeout" and one.label == "TIMED OUT" and ab.state == "ok"
    states = [r.state for r in one.nights]
    assert states[5] == "regression" and states[9] == "environment" and states[12] == "failed", states
    assert "0.5.9 -> 0.5.10" in one.nights[9].note
    # The within-night ratio did not move with the slower box: no change point there, the engine step only.
    ratio = ab.series[2]
    assert ratio.ratio and not ratio.changes and [e.x for e in ratio.env_steps] == [9]


def test_the_page_says_each_element(store: Store, tmp_path: Path) -> None:
    model = page.build(store, page.suite_items(store, "s"), suite="s")
    model = page.with_reports(model, {"e13-ab": "report-e13-ab.html"})
    text = nightly_html.render(model)
    assert "<script" not in text.lower() and "url(http" not in text
    dom = parse(text)
    assert "banner-simulated" in dom.ids and "banner-attached" not in dom.ids
    header = dom.tables["table-items"]
    assert [r[0] for r in header[1:]] == ["ab", "one"] and [r[2] for r in header[1:]] == ["ok", "TIMED OUT"]
    assert {"#item-ab-box", "#item-one-box", "report-e13-ab.html"} <= set(dom.links)
    assert {"item-ab-box", "item-one-box"} <= dom.ids
    fig = dom.figures["series-one-box-base_tok_s"]
    assert dom.svgs["series-one-box-base_tok_s"] == 1 and "series-one-box-base_tok_s-cap" in dom.ids
    for label in (
        "▼ regression -",
        "0.5.9 → 0.5.10",
        "FAILED: base: server exited",
        "TIMED OUT: stopped by",
        "threshold ±2 % around the current level",
        "SIMULATED (orch's simulator",
    ):
        assert label in fig, label
    assert any("FAILED" in x for x in dom.classes["gap"]) and any("0.5.10" in x for x in dom.classes["env-step"])
    nights = dom.tables["nights-item-one-box"]
    assert [r[1] for r in nights[1:4]] == ["TIMED OUT", "FAILED", "building history"]  # newest first
    attached = dataclasses.replace(model, attached=("ATTACHED: ab on box: measured on running server(s) ...",))
    assert "banner-attached" in parse(nightly_html.render(attached)).ids


def test_history_html_cli(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(store.path)
    store.close()
    out = tmp_path / "p.html"
    assert main(["history", "--suite", "s", "--db", db, "--html", str(out)]) == 0
    assert "nightly history page, 2 item(s), 4 series" in capsys.readouterr().err
    assert parse(out.read_text()).figures
    assert main(["history", "--suite", "nope", "--db", db, "--html", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no nightly history for suite 'nope'" in err and "suites with nights: s" in err
    # Without --html, --suite prints every item's history as `orch history ITEM` does.
    assert main(["history", "--suite", "s", "--db", db]) == 0
    printed = capsys.readouterr().out
    assert "ab on box — base tok/s" in printed and "one on box — base tok/s" in printed
    # Of a suite, the items that have the series asked for; none: refused, naming what there is.
    assert main(["history", "--suite", "s", "--db", db, "--arm", "spec/base"]) == 0
    assert "ab on box — spec/base tok/s ratio" in (printed := capsys.readouterr().out) and "one on box" not in printed
    assert main(["history", "--suite", "s", "--db", db, "--arm", "nope"]) == 2
    assert "has no series of arm 'nope'" in capsys.readouterr().err
    assert main(["history", "ab", "--db", db, "--html", "-", "--metric", "tok_s", "--arm", "spec/base"]) == 0
    assert parse(capsys.readouterr().out).figures.keys() == {"series-ab-box-spec_base_tok_s"}

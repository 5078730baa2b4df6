"""The HTML report's load figures (latency against achieved rate, goodput against rate, the Pareto front) of a real
simulated open-loop A/B under --slo, rendered by headless Chromium: each figure drawn (decoded pixels, both arms'
colours), captioned with its numbers, SIMULATED, the crossover marked where the JSON says it crosses."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from orchestrator.report.lines import SIM_BANNER
from orchestrator.report.plots import SIM_MARK
from orchestrator.stats.estimates import pareto_front
from tests.report.test_report_html import chromium, needs_chromium
from tests.report.test_report_html_load import Report, _report

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]

OPEN_SLO = ["--rate", "2,6,12", "--duration", "3", "--runs", "1", "--slo", "ttft_p99=300ms,e2e_p99=1500ms"]
FIGURES = ("fig-latency-rate", "fig-goodput-rate", "fig-pareto")
ARM_RGB = ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E))  # matplotlib's C0 and C1: arm_color(0) and arm_color(1)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Report, Path]]:
    """One open-loop A/B under an SLO at three rates (its launches are most of these tests' time), and its report."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        tmp = tmp_path_factory.mktemp("load-plots")
        for var in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
            monkeypatch.setenv(var, str(tmp / var.lower()))  # conftest's own are per test: this runs before them
        monkeypatch.delenv("ORCH_HOSTS", raising=False)
        monkeypatch.setenv("ORCH_SSH_CONFIG", str(tmp / "no-ssh-config"))
        yield _report(tmp, monkeypatch, *OPEN_SLO), tmp


def _shot(tmp: Path, fig_id: str) -> tuple[int, int, set[int]]:
    """One figure of the report alone on a page (with the report's CSS), screenshot by Chromium and decoded: the
    width and height of what it drew (its non-white pixels' bounding box) and which arms' colours appear."""
    from PIL import Image, ImageChops

    text = (tmp / "report.html").read_text()
    css = re.search(r"<style>.*?</style>", text, re.S)
    start = text.index(f'<figure id="{fig_id}">')
    figure = text[start : text.index("</figure>", start) + len("</figure>")]
    page = tmp / f"{fig_id}.html"
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'>{css.group(0) if css else ''}</head>"
                    f"<body>{figure}</body></html>")  # fmt: skip
    shot = tmp / f"{fig_id}.png"
    chromium(tmp, f"--screenshot={shot}", "--window-size=1150,1000", page.as_uri())
    image = Image.open(shot).convert("RGB")
    box = ImageChops.difference(image, Image.new("RGB", image.size, "white")).getbbox()
    width, height = (box[2] - box[0], box[3] - box[1]) if box else (0, 0)
    colours = image.getcolors(maxcolors=1 << 20) or []
    near = {
        i
        for _, rgb in colours
        for i, ref in enumerate(ARM_RGB)
        if sum(abs(int(c) - r) for c, r in zip(rgb, ref, strict=True)) < 30
    }
    return width, height, near


def test_load_figures_render_with_captions_ids_and_the_simulated_mark(run: tuple[Report, Path]) -> None:
    report, tmp = run
    page = report.page
    assert page.text["banner-simulated"] == SIM_BANNER
    for fig in FIGURES:
        assert fig in page.text, f"{fig} missing ({sorted(i for i in page.text if i.startswith('fig-'))})"
        caption = page.text[f"{fig}-cap"]
        assert caption.startswith("SIMULATED"), caption
        assert SIM_MARK in page.text[fig]  # drawn in the figure itself, so a cropped screenshot still says it
        width, height, arms = _shot(tmp, fig)
        assert width > 600 and height > 300, (fig, width, height)
        assert arms == {0, 1}, (fig, arms)  # both arms drawn
        assert f"table-{fig.removeprefix('fig-')}" in page.rows  # the numbers under each figure
    assert "TTFT p99" in page.text["fig-latency-rate-cap"] and "achieved" in page.text["fig-latency-rate-cap"]
    assert "TTFT p99 <= 300 ms" in page.text["fig-latency-rate"]  # the SLO's limit drawn on its panel
    assert "achieved request rate (req/s, completed)" in page.text["fig-latency-rate"]
    goodput = page.text["fig-goodput-rate-cap"]
    assert "ttft_p99=300ms,e2e_p99=1500ms" in goodput and "TTFT p99 <= 300 ms, E2E p99 <= 1500 ms" in goodput
    assert "offered rate (req/s)" in page.text["fig-goodput-rate"]
    assert "Pareto front" in page.text["fig-pareto-cap"] and "Pareto front" in page.text["fig-pareto"]


def test_the_crossover_is_marked_where_it_crosses(run: tuple[Report, Path]) -> None:
    report, _ = run
    page = report.page
    (x,) = report.doc["crossovers"]
    mark = f"sim-eagle3-fast crossover ~{x['at']:.3g} req/s" if x["status"] == "crosses" else None
    for fig in FIGURES:
        if mark is None:
            assert "crossover ~" not in page.text[fig], (x, fig)
            continue
        if fig == "fig-latency-rate":  # its axis is the achieved rate: the legend says that, the caption the offered
            assert "req/s achieved" in page.text[fig] and mark not in page.text[fig], page.text[fig]
            assert f"~{x['at']:.3g} req/s offered" in page.text[f"{fig}-cap"], page.text[f"{fig}-cap"]
            continue
        assert mark in page.text[fig], (fig, mark)  # the legend entry of the line (the star in the Pareto plot)
        assert f"~{x['at']:.3g} req/s" in page.text[f"{fig}-cap"], page.text[f"{fig}-cap"]


def _value(cell: str) -> float:
    return float(cell.split(" [")[0])


def _geo(values: Iterable[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def test_plotted_numbers_are_the_launch_values_of_the_json(run: tuple[Report, Path]) -> None:
    """The stored experiment's figures (per-request rows read back) agree with the live run's JSON: goodput the mean
    of its launch values, tok/s per user their geometric mean; the ringed points are the non-dominated ones."""
    report, _ = run
    rows = report.page.rows
    arms = {a["label"]: a for a in report.doc["arms"]}
    goodput = rows["table-goodput-rate"]
    assert goodput[0] == ["arm", "level", "goodput req/s", "good tok/s"], goodput[0]
    assert len(goodput) == 1 + 2 * 3
    for label, level, req_s, _ in goodput[1:]:
        rate = float(level.removesuffix(" req/s"))
        (at,) = [lv for lv in arms[label]["by_concurrency"] if lv["rate"] == rate]
        assert _value(req_s) == pytest.approx(statistics.fmean(at["goodput"]["launch_values_req_s"]), abs=0.006)
    pareto = rows["table-pareto"]
    assert pareto[0] == ["arm", "level", "aggregate tok/s", "tok/s per user", "on the front"], pareto[0]
    points = []
    for label, level, agg, user, _ in pareto[1:]:
        rate = float(level.removesuffix(" req/s"))
        (at,) = [lv for lv in arms[label]["by_concurrency"] if lv["rate"] == rate]
        geo = _geo(at["launch_values"])
        assert _value(user) == pytest.approx(geo, abs=0.06), (label, level, user, at["launch_values"])
        aggregate = _geo(
            v["aggregate_tok_s"]
            for launch in report.doc["launches"]
            if launch["label"] == label
            for v in launch["values"]
            if v["rate"] == rate
        )
        assert _value(agg) == pytest.approx(aggregate, rel=0.01), (label, level, agg)
        # The front from the JSON's exact values: two points the table rounds alike are still told apart.
        points.append((aggregate, geo))
    front = set(pareto_front(points))
    assert [r[4] for r in pareto[1:]] == ["yes" if i in front else "-" for i in range(len(points))]
    latency = rows["table-latency-rate"]
    assert latency[0][:4] == ["arm", "level", "achieved req/s", "TTFT p50 ms"], latency[0]
    for row in latency[1:]:
        assert all(_value(c) > 0 for c in row[2:]), row

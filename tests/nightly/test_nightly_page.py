"""The nightly history page (`orch history --suite --html`, `orch nightly --html-out`) in headless Chromium, on the
docs' simulated nights: a confirmed regression, an engine upgrade, a failed night, a FAIL-ON night."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.faults.support import run
from tests.nightly.conftest import DOC_NIGHTS, DocHistory
from tests.nightly.test_nightly_docs import night
from tests.report.test_nightly_html import Page
from tests.report.test_report_html import chromium, needs_chromium, png_size

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium, DOC_NIGHTS]

SUITE = "gpu-box-nightly"
ITEMS = ("eagle3-vs-baseline", "baseline-throughput")
DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "nightly-page.png"


def dom(tmp_path: Path, page: Path) -> Page:
    parsed = Page()
    parsed.feed(chromium(tmp_path, "--dump-dom", page.as_uri()).stdout)
    return parsed


@pytest.fixture
def nights(doc_history: DocHistory) -> Path:
    """The docs' nights (tests/nightly/conftest.doc_history, built once for this and the docs' samples test), three
    nights of history: the directory with the suite, its profiles and nightly.db."""
    return doc_history.where


def test_suite_history_page_in_chromium(nights: Path, tmp_path: Path) -> None:
    out = tmp_path / "history.html"
    db = str(nights / "nightly.db")
    assert main(["history", "--suite", SUITE, "--db", db, "--html", str(out), "--with-reports"]) == 0
    text = out.read_text()
    assert "<script" not in text.lower() and "url(http" not in text
    page = dom(tmp_path, out)

    # Links: in-page anchors, and A/B reports written beside the page (relative), nothing else.
    reports = [h for h in page.links if not h.startswith("#")]
    assert reports and all(re.fullmatch(r"report-\d{8}-\d{6}-[0-9a-f]{6}\.html", h) for h in reports), reports
    for h in set(reports):
        assert "<h1>A/B " in (tmp_path / h).read_text() or "<h1>" in (tmp_path / h).read_text()
    assert all(h[1:] in page.ids for h in page.links if h.startswith("#"))

    # Banners and the night the page is as of: the last night's --now, not the day the test runs.
    assert "banner-simulated" in page.ids and "banner-attached" not in page.ids
    (last,) = re.findall(r"As of the night of (\d{4}-\d\d-\d\d) 02:00", text)
    assert last.startswith("2026-11-"), last

    # The header table: each item, its state tonight, noise, nights in its environment, tonight's experiments.
    header = page.tables["table-items"]
    assert header[0][:3] == ["item", "host", "tonight"] and len(header) == 1 + len(ITEMS)
    rows = {r[0]: r for r in header[1:]}
    assert set(rows) == set(ITEMS)
    assert rows["baseline-throughput"][2] == "FAILED"
    assert (
        rows["eagle3-vs-baseline"][2].startswith("not run tonight")
        and "environment change" in rows["eagle3-vs-baseline"][2]
    )
    assert all(re.fullmatch(r"\d+", r[4]) for r in rows.values()), rows
    for item in ITEMS:
        assert f"item-{item}-local" in page.ids and f"#item-{item}-local" in page.links

    # One figure per series, each an SVG with its caption.
    figures = {k: v for k, v in page.figures.items() if k.startswith("series-")}
    assert len(figures) >= 6 and all(page.svgs.get(k) == 1 for k in figures), page.svgs
    assert all(f"{k}-cap" in page.ids for k in figures)
    tok_s = page.figures["series-baseline-throughput-local-baseline_tok_s"]
    # The regression, confirmed by a re-run (its second point), then the engine upgrade, then the failed night.
    assert "▼ regression -" in tok_s and "re-run" in tok_s
    assert "engine version: 0.5.9 → 0.5.10" in tok_s
    assert "FAILED: baseline: server process" in tok_s
    assert "threshold ±2 % around the current level" in tok_s and "level (median between steps)" in tok_s
    assert "SIMULATED (orch's simulator" in tok_s
    assert any("regression" in x for x in page.classes.get("change c-regression", []))
    assert any("0.5.10" in x for x in page.classes.get("env-step", []))
    assert any("FAILED" in x for x in page.classes.get("gap", []))
    # The A/B's ratio is measured within the night: the slower box moved no level of it.
    ratio = page.figures["series-eagle3-vs-baseline-local-eagle3-3step_baseline_tok_s"]
    assert "regression" not in ratio.split("eagle3-3step/baseline tok/s ratio, night by night")[0]

    # Each item's nights table: every night, what it decided, its experiments linked to their reports.
    nights_table = page.tables["nights-item-baseline-throughput-local"]
    states = [r[1] for r in nights_table[1:]]
    assert states[0] == "FAILED" and states[1] == "environment change" and states[2] == "REGRESSION", states
    assert "confirmed by a re-run" in nights_table[3][3]
    assert "FAIL-ON slower" in [r[1] for r in page.tables["nights-item-eagle3-vs-baseline-local"][1:]]

    shot = tmp_path / "history.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,1600", out.as_uri())
    assert png_size(shot) == (1200, 1600) and shot.stat().st_size > 30_000


def test_one_item_and_nightly_html_out(nights: Path, tmp_path: Path) -> None:
    db = tmp_path / "nightly.db"
    shutil.copy(nights / "nightly.db", db)
    one = tmp_path / "one.html"
    assert main(["history", "baseline-throughput", "--db", str(db), "--html", str(one), "--metric", "tok_s"]) == 0
    page = dom(tmp_path, one)
    assert list(page.tables["table-items"][1][:1]) == ["baseline-throughput"]
    assert [k for k in page.figures if k.startswith("series-")] == ["series-baseline-throughput-local-baseline_tok_s"]
    assert "report-" not in one.read_text()  # no --with-reports: ids are text
    # docs/nightly.md's picture: the header table and a series with every mark (regenerated with ORCH_DOC_SAMPLES).
    shot = tmp_path / "one.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,1250", one.as_uri())
    assert png_size(shot) == (1200, 1250) and shot.stat().st_size > 30_000
    if os.environ.get("ORCH_DOC_SAMPLES"):
        shutil.copy(shot, DOCS_SHOT)

    # The suite's night writes the page after its summary; its date is the night's --now.
    (tmp_path / "night").mkdir()
    out = tmp_path / "night" / "night.html"
    rc, summary, err = night(
        nights / "nightly.yaml", db, "2026-12-05", "--only", "baseline-throughput", "--html-out", str(out),
        "--with-reports",
    )  # fmt: skip
    assert rc == 1 and "**FAILED** `baseline-throughput`" in summary, summary + err
    text = out.read_text()
    assert "As of the night of 2026-12-05 02:00" in text
    page = dom(tmp_path, out)
    rows = {r[0]: r for r in page.tables["table-items"][1:]}
    assert rows["baseline-throughput"][2] == "FAILED" and rows["eagle3-vs-baseline"][2].startswith("not run tonight")
    # --with-reports: the earlier nights' A/B reports beside the page, each linked
    linked = {h for h in page.links if not h.startswith("#")}
    written = {p.name for p in (tmp_path / "night").glob("report-*.html")}
    assert linked and linked == written, (linked, written)
    refused = run("nightly", str(nights / "nightly.yaml"), "--db", str(db), "--with-reports", cwd=tmp_path)
    assert refused.rc == 2 and "--with-reports goes with --html-out FILE" in refused.err, refused.text

    # Refused before anything is read: --with-reports without --html, ITEM with --suite, no ITEM nor --suite.
    for args in (["baseline-throughput", "--with-reports"], ["baseline-throughput", "--suite", SUITE], []):
        done = run("history", *args, "--db", str(db), cwd=tmp_path)
        assert done.rc == 2, done.text
    assert (
        "Missing argument 'ITEM': give an item's name, or --suite NAME"
        in run("history", "--db", str(db), cwd=tmp_path).err
    )

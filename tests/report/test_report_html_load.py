"""`orch report --html` of the load sections, rendered in headless Chromium: crossover, goodput, energy and the
open-loop rate lines of simulated A/Bs of the bundled sim-eagle3-fast against baseline, checked against `--json`."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.report.lines import SIM_BANNER, joules, number
from tests import fake_nvidia_smi
from tests.conftest import free_port
from tests.report.test_report_html import chromium, needs_chromium, self_contained

# Each test runs a 4-launch simulated A/B (30-40 s on the 2-core development VM) before Chromium renders its report.
pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]

ARMS = ("baseline", "sim-eagle3-fast")
SHORT = ["--blocks", "2", "--warmup", "1", "--max-tokens", "64", "--min-run-s", "0"]
CLOSED = ["--concurrency", "1,8", "--runs", "2", "--slo", "ttft_p99=500ms,tpot_p99=20ms"]
OPEN = ["--rate", "2,6", "--duration", "3", "--runs", "1"]
# The crossover line's three outcomes (report/lines.crossover_lines): crosses, does not, cannot tell.
CROSSOVER_WORDS = ("pays below", "pays above", "does not cross", "no crossing")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Page(HTMLParser):
    """The rendered DOM's text by element id: whole text, the `li` items and the table rows (cell texts) under it."""

    def __init__(self) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self.items: dict[str, list[str]] = {}
        self.rows: dict[str, list[list[str]]] = {}
        self._open: list[tuple[str, str | None]] = []  # (tag, id) of each open element
        self._li: list[tuple[str, int]] = []  # the open `li`'s slot in each id'd ancestor's items
        self._cell: tuple[str, int] | None = None  # the open cell's table id and column

    def _ids(self) -> list[str]:
        return [i for _, i in self._open if i]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in VOID:
            return
        el_id = dict(attrs).get("id")
        if el_id:
            self.text.setdefault(el_id, "")
        ids = self._ids() + ([el_id] if el_id else [])
        if tag == "li":
            for i in ids:
                self.items.setdefault(i, []).append("")
            self._li = [(i, len(self.items[i]) - 1) for i in ids]
        table = next((i for t, i in reversed(self._open) if t == "table" and i), None)
        if tag == "tr" and table:
            self.rows.setdefault(table, []).append([])
        elif tag in ("td", "th") and table:
            self.rows[table][-1].append("")
            self._cell = (table, len(self.rows[table][-1]) - 1)
        self._open.append((tag, el_id))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()[0] == tag:
                break
        if tag == "li":
            self._li = []
        elif tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data: str) -> None:
        for i in self._ids():
            self.text[i] += data
        for i, k in self._li:
            self.items[i][k] += data
        if self._cell:
            table, col = self._cell
            self.rows[table][-1][col] += data


@dataclass
class Report:
    """One experiment: its `--json` document and its HTML report as Chromium rendered it."""

    doc: dict[str, Any]
    page: Page


def _report(tmp: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Report:
    """`orch ab baseline sim-eagle3-fast --sim ARGS` under a private HOME with the fake nvidia-smi first on PATH
    (energy is measured), then `orch report last --html`, dumped by headless Chromium."""
    monkeypatch.setenv("HOME", str(tmp))
    monkeypatch.chdir(tmp)  # the bundled profiles, not a checkout's ./profiles
    smi = fake_nvidia_smi.install(tmp / "bin", tmp / "state.json")
    monkeypatch.setenv("PATH", f"{smi}{os.pathsep}{os.environ['PATH']}")
    db = str(tmp / "r.db")
    out, err = io.StringIO(), io.StringIO()  # not capsys: a module-scoped fixture calls this too
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["ab", *ARMS, "--sim", *SHORT, *args, "--port", str(free_port()), "--db", db, "--json"])
    assert code == 0, err.getvalue()[-3000:]
    out_html = tmp / "report.html"
    assert main(["report", "last", "--db", db, "--html", str(out_html)]) == 0
    self_contained(out_html.read_text())
    page = Page()
    page.feed(chromium(tmp, "--dump-dom", out_html.as_uri()).stdout)
    return Report(json.loads(out.getvalue()), page)


def _crossover(report: Report, unit: str) -> str:
    """The one crossover line: both arms named, the load in `unit`, worded as the JSON's status says."""
    (line,) = report.page.items["crossover"]
    assert "where the ratio crosses 1" in report.page.text["fig-load-cap"]  # the ratios over the levels, drawn
    (x,) = report.doc["crossovers"]
    assert line.startswith("crossover: sim-eagle3-fast vs baseline: "), line
    assert any(w in line for w in CROSSOVER_WORDS), line
    wording = {"crosses": "pays below" if x["pays_below"] else "pays above", "undecided": "no crossing"}
    assert wording.get(x["status"], "does not cross") in line, (x, line)
    if x["status"] == "crosses":
        assert f"~{x['at']:.3g}" in line, (x, line)
    assert unit in line, line
    return line


def _energy(report: Report, levels: list[Any]) -> None:
    """J/token per arm at each level as the JSON has it, and the note on what nvidia-smi's figures are."""
    arms = report.page.items["energy"]
    for arm in report.doc["arms"]:
        shown = [line for line in arms if line.startswith(f"{arm['label']}: ")]
        assert len(shown) == len(levels), (arm["label"], arms)
        for line, level in zip(shown, arm["by_concurrency"], strict=True):
            e = level["energy"]
            lo, hi = (joules(v) for v in e["ci95"])
            assert line.startswith(f"{arm['label']}: {joules(e['j_per_token'])} J/token, 95% CI [{lo}, {hi}]"), line
            assert "over 2 launches" in line and "W on 8 GPUs" in line, line
    note = report.page.text["energy-note"]
    assert note.startswith("energy: from nvidia-smi's power.draw.instant"), note
    assert "not a power meter's readings" in note and "SIMULATED" in note, note


def test_closed_loop_crossover_goodput_and_energy_in_chromium(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = _report(tmp_path, monkeypatch, *CLOSED)
    page, doc = report.page, report.doc
    assert page.text["banner-simulated"] == SIM_BANNER

    line = _crossover(report, "concurrency")
    assert "req/s" not in line, line

    for level in (1, 8):
        rows = page.rows[f"table-goodput-c{level}"]
        assert rows[0][:4] == ["arm", "goodput req/s", "good tok/s", "within SLO"], rows[0]
        assert rows[0][-1] == "vs baseline" and "TPOT p99 ms" in rows[0] and "SLO met" in rows[0], rows[0]
        assert [r[0] for r in rows[1:]] == list(ARMS), rows
        for row, arm in zip(rows[1:], doc["arms"], strict=True):
            (at,) = [lv for lv in arm["by_concurrency"] if lv["concurrency"] == level]
            assert row[1] == number(at["goodput"]["median_req_s"], 2), (row, at["goodput"])
    assert page.rows["table-goodput-c1"][1][-1] == "1.000"
    # the load figures over concurrency levels: latency against the requests completed per second, goodput and the
    # Pareto front against the concurrency (tests/report/test_report_html_loadplots.py checks them in depth)
    for fig in ("fig-latency-rate", "fig-goodput-rate", "fig-pareto"):
        assert page.text[f"{fig}-cap"].startswith("SIMULATED"), fig
    assert "completed requests / run time at each concurrency" in page.text["fig-latency-rate-cap"]
    assert "concurrency (streams)" in page.text["fig-goodput-rate"]

    _energy(report, [1, 8])
    for level in (1, 8):
        assert f"energy per output token at concurrency {level} (J/token" in page.text["energy"], page.text["energy"]
    comparisons = [t.split(": ")[0] for t in page.items["energy"] if t.startswith("sim-eagle3-fast vs baseline @ ")]
    assert comparisons == ["sim-eagle3-fast vs baseline @ 1", "sim-eagle3-fast vs baseline @ 8"], page.items["energy"]


@pytest.fixture(scope="module")
def open_loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Report]:
    """One open-loop A/B for the tests below (its launches are most of their time)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        tmp = tmp_path_factory.mktemp("open-loop")
        for var in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
            monkeypatch.setenv(var, str(tmp / var.lower()))  # conftest's own are per test: this runs before them
        monkeypatch.delenv("ORCH_HOSTS", raising=False)
        monkeypatch.setenv("ORCH_SSH_CONFIG", str(tmp / "no-ssh-config"))
        yield _report(tmp, monkeypatch, *OPEN)


def test_open_loop_rate_lines_and_crossover_in_req_s_in_chromium(open_loop: Report) -> None:
    page, doc = open_loop.page, open_loop.doc
    assert page.text["banner-simulated"] == SIM_BANNER
    line = _crossover(open_loop, " req/s")
    assert "concurrency" not in line, line
    for rate in (2, 6):
        items = page.items[f"rates-r{rate}"]
        assert [i.split(" @ ")[0] for i in items] == list(ARMS), items
        for item, arm in zip(items, doc["arms"], strict=True):
            (at,) = [lv for lv in arm["by_concurrency"] if lv["rate"] == rate]
            achieved = at["open_loop"]["achieved_rate"]
            assert item.startswith(f"{arm['label']} @ {rate} req/s: achieved {achieved:.2f} req/s of "), item
            assert f"({rate} offered)" in item and "TTFT p50" in item and "send lag p99" in item, item
        assert f"table-summary-r{rate}" in page.rows
    _energy(open_loop, [2, 6])


def test_open_loop_energy_names_its_levels_as_rates(open_loop: Report) -> None:
    energy = open_loop.page.text["energy"]
    assert "Rate(" not in energy and "concurrency" not in energy, energy
    assert "energy per output token at 2 req/s" in energy and "sim-eagle3-fast vs baseline @ 6 req/s: " in energy


def test_a_sweep_and_the_ab_on_the_highest_load_within_the_slo_in_chromium(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --sweep auto:3: the probe picks the rates; the levels, the crossover and the SLO capacities follow from them
    slo = "ttft_p99=150ms,e2e_p99=1500ms"
    report = _report(tmp_path, monkeypatch, "--sweep", "auto:3", "--duration", "2", "--runs", "1", "--slo", slo)
    doc, page = report.doc, report.page
    sweep = doc["sweep"]
    rates = ", ".join(f"{r:g}" for r in sweep["rates"])
    said = page.text["sweep"]
    assert said.startswith(f"levels from --sweep auto: rates {rates} req/s, from probe experiment {sweep['probe']}")
    assert "stops sending once the server is over-saturated" in said
    for arm in doc["arms"]:
        assert [lv["rate"] for lv in arm["by_concurrency"]] == sweep["rates"]
        assert f"{arm['label']} {sweep['synchronous'][arm['label']]:g} req/s at concurrency 1" in said
    _crossover(report, "req/s")
    shown = page.items.get("slo-capacity", [])
    assert len(shown) == len(doc["max_within_slo"]) + len(doc["max_within_slo_comparisons"]), shown
    (c,) = doc["max_within_slo_comparisons"]
    (line,) = [t for t in shown if t.startswith("sim-eagle3-fast vs baseline, highest load within the SLO: ")]
    if c["bound"] is not None:
        end = c["ci95"][1] if c["bound"] == "upper" else c["ci95"][0]
        word = "below" if c["bound"] == "upper" else "above"
        assert f"{word} {end:.3f}x (the {c['bound']} end of its 95% CI" in line, (c, line)
    elif c["ratio"] is None:
        assert f"not compared: {c['blocks']} block(s)" in line, (c, line)
    else:
        assert f"{c['ratio']:.3f}x, 95% CI [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]" in line, (c, line)

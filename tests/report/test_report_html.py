"""`orch report --html`: a simulated A/B's report rendered in headless Chromium, and the refusals around it."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.client.request import Record
from orchestrator.client.summary import arrival_profile
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import load
from orchestrator.config.workload import BenchConfig
from orchestrator.experiment.ab import run_ab
from orchestrator.hosts.local import LocalHost
from orchestrator.report.html import ab_html
from orchestrator.report.lines import comparison_line
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store
from tests import markers
from tests.conftest import FAST_SIM, NAMESPACE, REPO, WriteProfile, free_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FIGURES = ("fig-tok-s-c1", "fig-ratios", "fig-tokens", "fig-ttft", "fig-itl", "fig-breakeven-1")
TABLES = ("table-summary-c1", "table-launches", "table-host", "table-fingerprint")

# CI installs Debian's chromium (.ci/run), so there a missing browser is a failure, not a skip.
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("CI"),
    reason="chromium is not installed (apt-get install chromium)",
)


class Dom(HTMLParser):
    """What the checks need from a page: figures and whether each holds a plot, tables, banners, verdict lines."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, bool] = {}
        self.ids: set[str] = set()
        self.verdicts: list[str] = []
        self._figure: str | None = None
        self._in_li = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "figure":
            self._figure = str(a.get("id"))
            self.figures[self._figure] = False
        elif tag in ("svg", "img") and self._figure:
            self.figures[self._figure] = True
        elif tag == "li" and (a.get("class") or "").startswith("v-"):
            self._in_li = True
            self.verdicts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._figure = None
        elif tag == "li":
            self._in_li = False

    def handle_data(self, data: str) -> None:
        if self._in_li:
            self.verdicts[-1] += data


def parse(text: str) -> Dom:
    dom = Dom()
    dom.feed(text)
    return dom


def self_contained(text: str) -> None:
    assert "<script" not in text.lower()
    # Only in-page references (#id) and data: URLs; the SVG namespace URIs are names, never fetched.
    assert not re.findall(r'(?:src|href)="(?!#|data:)', text), "the report references something outside itself"
    assert "url(http" not in text


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    markers.require("browser")
    profile = tmp_path / f"chromium-{len(list(tmp_path.iterdir()))}"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=90, check=True)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


@pytest.mark.browser
@needs_chromium
def test_simulated_ab_report_renders_in_chromium(write_profile: WriteProfile, tmp_path: Path) -> None:
    # One GPU's worth of simulated workers, loaded quickly: the launches are most of this test's time.
    sim = {**FAST_SIM, "load_s": 0.1, "warmup_s": 0.1}
    common = {"engine": "sglang", "model_path": "/models/m", "tp_size": 1, "sim": sim}
    spec = {
        "algorithm": "EAGLE3",
        "draft_model_path": "/models/d",
        "num_steps": 3,
        "eagle_topk": 1,
        "num_draft_tokens": 4,
    }
    profiles = [
        load(str(write_profile("baseline", port=free_port(), **common))),
        load(str(write_profile("eagle3", port=free_port(), speculative=spec, **common))),
    ]
    db = tmp_path / "r.db"
    bench = BenchConfig(runs=2, warmup=1, max_tokens=16, warmup_max_tokens=4, min_run_s=0)
    config = ABConfig(bench=bench, simulate=True, namespace=NAMESPACE, grace_s=2, blocks=2, target_tps=200)
    result = run_ab(LocalHost(), profiles, config, Store(db))

    # from the store (per-request rows read back), through the CLI
    out = tmp_path / "report.html"
    assert main(["report", result.experiment_id[:12], "--db", str(db), "--html", str(out)]) == 0
    text = out.read_text()
    self_contained(text)
    assert not list(tmp_path.glob(".report.html.*")), "the temporary file of the atomic write was left behind"

    dom = parse(chromium(tmp_path, "--dump-dom", out.as_uri()).stdout)
    for fig in FIGURES:
        assert dom.figures.get(fig), f"{fig}: missing, or without a plot ({sorted(dom.figures)})"
        assert f"{fig}-cap" in dom.ids
    assert set(TABLES) <= dom.ids and "banner-simulated" in dom.ids and "banner-attached" not in dom.ids
    assert dom.verdicts == [comparison_line(c) for c in result.comparisons]
    shot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,2400", out.as_uri())
    assert png_size(shot) == (1200, 2400) and shot.stat().st_size > 30_000  # plots drew something

    # every stored request has its token-arrival profile: 11 instants from the first token to the last
    stored = Store(db)
    rows = [r for la in result.launches for r in stored.requests(la.launch_id) if not r["run_warmup"]]
    stored.close()
    assert rows and all(r["arrivals_json"] for r in rows)
    for r in rows:
        profile = json.loads(r["arrivals_json"])
        assert len(profile) == 11 and profile == sorted(profile), profile
        assert abs(profile[0] - r["ttft_s"]) < 1e-3 and profile[-1] <= r["e2e_s"] + 1e-6
    assert "y axis from 0" in text  # the tok/s plot starts at zero and says so

    # the live result (per-request data in the runs) gives the same figures
    assert set(FIGURES) <= set(parse(ab_html(result)).figures)
    # export --format html of a result bundle (read without importing it: its per-request rows come along)
    bundle, exported = tmp_path / "exp.orch.json", tmp_path / "export.html"
    assert main(["export", "last", "--db", str(db), "--format", "bundle", "-o", str(bundle)]) == 0
    assert main(["export", str(bundle), "--format", "html", "-o", str(exported)]) == 0
    figures = parse(exported.read_text()).figures
    assert all(figures.get(f) for f in FIGURES), figures


def _hand_built(
    names: tuple[str, ...], blocks: int = 3, concurrency: int = 1, attached: dict[int, str] | None = None
) -> ABResult:
    """An experiment as an older store gives it back (run summaries only, no per-request rows) unless concurrency
    > 1, where each run carries per-request summaries; `attached`: arm index -> URL of a server orch did not launch."""
    launches = []
    for b in range(blocks):
        for k, name in enumerate(names):
            per_request = tuple(
                {
                    "index": j,
                    "tokens": 256,
                    "ttft_s": 0.02 * (j + 1),
                    "e2e_s": 3.0 + 0.1 * j,
                    "error": None,
                    "arrivals_s": [0.02 * (j + 1) + 0.29 * k for k in range(11)],
                }
                for j in range(concurrency if concurrency > 1 else 0)
            )
            runs = tuple(
                RunResult(
                    index=i,
                    warmup=False,
                    tokens=256,
                    seconds=3.2,
                    tok_s=80.0 + 5 * k + 0.3 * i + 0.2 * b,
                    prompt_tokens=30,
                    ttft_s=0.02 + 0.001 * i,
                    concurrency=concurrency,
                    aggregate_tok_s=80.0 + 5 * k,
                    metrics={"itl": {"p50": 0.012, "p90": 0.013, "p99": 0.02}},
                    per_request=per_request,
                )
                for i in range(3)
            )
            url = (attached or {}).get(k)
            fp = {"attached": {"url": url}} if url else None
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"{name}-{b}",
                    runs=runs,
                    ready_s=1.0,
                    env_report={},
                    teardown={},
                    block=b,
                    position=k,
                    arm_index=k,
                    fingerprint=fp,
                )
            )
    design = Design.make(len(names), blocks, "fixed", 0)
    return ABResult(
        experiment_id="e-1",
        simulated=False,
        host="box",
        profiles=names,
        launches=tuple(launches),
        host_facts={"hostname": "box", "gpus": []},
        design=design,
    )


def test_what_is_not_stored_is_said_not_drawn() -> None:
    text = ab_html(_hand_built(("base", "new")))
    self_contained(text)
    dom = parse(text)
    assert "fig-tokens" not in dom.figures and "fig-tokens-missing" in dom.ids
    assert "No token-arrival profiles stored for base, new" in text
    assert "one point per run (the run&#x27;s median)" in text and "not the raw inter-token samples" in text
    assert dom.figures.get("fig-ratios") and "banner-simulated" not in dom.ids
    assert dom.verdicts and "FASTER" in dom.verdicts[0]
    single = parse(ab_html(_hand_built(("only",))))
    assert "fig-ratios" not in single.figures and single.figures.get("fig-tok-s-c1") and not single.verdicts


def test_attached_arms_and_concurrent_requests() -> None:
    text = ab_html(_hand_built(("base", "theirs"), concurrency=4, attached={1: "http://10.0.0.5:8000"}))
    dom = parse(text)
    assert "banner-attached" in dom.ids and "ATTACHED: theirs on http://10.0.0.5:8000" in text
    assert "MIXED COMPARISON" in text and "attached (not verified)" in text
    # concurrent requests overlap and their start times are not stored: each is drawn from its own start
    assert dom.figures.get("fig-tokens") and "each request is drawn from its own start" in text
    assert "one point per request" in text


def test_unwritable_target_is_refused_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The database does not exist: reading it would fail with exit 1, so exit 2 shows the target was checked first.
    db = str(tmp_path / "none.db")
    missing_dir = str(tmp_path / "no" / "such" / "dir" / "r.html")
    assert main(["report", "last", "--db", db, "--html", missing_dir]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["report", "last", "--db", db, "--html", str(tmp_path)]) == 2
    assert main(["export", "last", "--db", db, "--format", "html", "-o", missing_dir]) == 2
    assert main(["report", "last", "--db", db]) == 2  # --html is required


def test_missing_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    target = tmp_path / "r.html"
    assert main(["report", "last", "--db", str(tmp_path / "none.db"), "--html", str(target)]) == 1
    err = capsys.readouterr().err
    assert "pip install 'orch-bench[report]'" in err and "Traceback" not in err and not target.exists()


def test_help_does_not_import_matplotlib() -> None:
    code = (
        "import sys\nfrom orchestrator.cli import main\n"
        "main(['--help']); main(['report', '--help']); main(['export', '--help'])\n"
        "print('matplotlib' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("False") and "--html" in proc.stdout


def test_arrival_profile_is_when_each_tenth_of_the_tokens_had_arrived() -> None:
    rec = Record(index=0, start=1.0, max_tokens=10)
    rec.arrivals = [(1.2, 0), (1.5, 1), (1.6, 1), (1.7, 4), (2.0, 4)]  # an empty first chunk, then a burst of 4
    assert arrival_profile(rec) == [0.5, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7, 1.0, 1.0, 1.0, 1.0]
    rec.arrivals = []
    assert arrival_profile(rec) is None


def test_token_plot_draws_the_stored_profile_and_the_tok_s_axis_starts_at_zero() -> None:
    text = ab_html(_hand_built(("base", "new"), concurrency=2))
    # one line per request through its 11 measured instants, not two points joined by a straight line
    figure = text[text.index('<figure id="fig-tokens"') : text.index("</figure>", text.index('id="fig-tokens"'))]
    assert "when 0%, 10%, ..., 100% of a request&#x27;s tokens had arrived" in figure
    tok_s = text[text.index('<figure id="fig-tok-s-c2"') : text.index('<figure id="fig-ratios"')]
    ticks = re.findall(r">(\d+(?:\.\d+)?)</text>", tok_s)
    assert "0" in ticks, ticks  # the y axis has its zero
    assert "y axis from 0; each arm's median is marked" in tok_s


def test_a_store_from_before_the_arrival_profiles_is_upgraded_and_still_reported(tmp_path: Path) -> None:
    import sqlite3

    from orchestrator.results.schema import MIGRATIONS

    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    for migration in MIGRATIONS[:7]:  # the last schema without requests.arrivals_json
        conn.executescript(migration)
    conn.execute("PRAGMA user_version = 7")
    conn.execute(
        "INSERT INTO experiments (id, kind, created_at, status, simulated, host, arms_json, config_json, orch_version)"
        " VALUES ('e-1', 'ab', 1.0, 'complete', 0, 'box', '[\"base\", \"new\"]', '{}', 'old')"
    )
    conn.execute(
        "INSERT INTO launches (launch_id, experiment_id, arm_index, profile, profile_json, argv_json, env_json,"
        " started_at, status) VALUES ('base-0', 'e-1', 0, 'base', '{}', '[]', '{}', 0, 'complete')"
    )
    conn.execute(
        "INSERT INTO requests (launch_id, run_warmup, run_concurrency, run_idx, idx, tokens, ttft_s, e2e_s)"
        " VALUES ('base-0', 0, 1, 0, 0, 256, 0.02, 3.0)"
    )
    conn.commit()
    conn.close()
    store = Store(db)
    try:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] >= 8
        rows = store.requests("base-0")
    finally:
        store.close()
    assert rows[0]["arrivals_json"] is None and rows[0]["tokens"] == 256
    text = ab_html(_hand_built(("base", "new"), blocks=1), {"base-0": rows})
    assert "fig-tokens-missing" in parse(text).ids and "No token-arrival profiles stored for base, new" in text

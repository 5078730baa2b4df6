"""Untrusted text (dataset categories, arm names from stores and bundles, an attached server's version string) is
shown, never obeyed: no escape sequence, bell, carriage return or bidi override reaches the terminal, a newline forges
no line and splits no table row, the HTML report shows them in its text, attributes and plots, and the Markdown
export carries no HTML, link or table break a renderer would act on."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from markdown_it import MarkdownIt

from orchestrator.agent import waits
from orchestrator.agent.processes import masked_cmdline
from orchestrator.cli import main
from orchestrator.common.printable import visible
from orchestrator.config.profile import load
from orchestrator.errors import InputError, ServerError
from orchestrator.experiment import reproduce
from orchestrator.launch import fingerprint, single
from orchestrator.nightly import report as night_report
from orchestrator.nightly import result as night_result
from orchestrator.report import nightly_html, nightly_page
from orchestrator.report.compare import compare_markdown, compare_text
from orchestrator.report.html import ab_html
from orchestrator.report.markdown import ab_markdown, md_text
from orchestrator.report.text import ab_text
from orchestrator.results import bundle as bundle_mod
from orchestrator.results.compare import compare
from orchestrator.results.model import ABResult
from orchestrator.ui.events import Lines
from tests.conftest import FAST_SIM, REPO, WriteProfile, free_port, run_orch
from tests.experiment.test_reproduce_data import make_bundle, trace_bench, write_trace
from tests.faults.support import FAST, orch_env, run
from tests.faults.test_error_replies import _run_client, _serving
from tests.launch.test_attach import QUICK
from tests.results.test_compare import _result
from tests.results.test_compare_map import store

# A window title, a clipboard write (OSC 52), a clear screen, a bell, a carriage return over the line, a bidi
# override, a C1 CSI, and a newline that starts a line of its own: each must be shown, none obeyed.
FORGED = "FAKE VERDICT: REPRODUCED"
HOSTILE = "cat\x1b]0;" + FORGED + "\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\rover\u202eevil\x9b31m\n" + FORGED + " (all agree)"
RAW = ("\x1b", "\x07", "\r", "\u202e", "\x9b")


def _assert_shown_not_obeyed(text: str) -> None:
    raw = [repr(c) for c in RAW if c in text]
    assert not raw, f"raw {raw} in:\n{text}"
    forged = [line for line in text.splitlines() if line.lstrip().startswith(FORGED)]
    assert not forged, forged


def test_visible_shows_every_control_character() -> None:
    assert visible("a\x1b[2Jb\x07c\rd\ne\tf\x00g\x7fh\x9bi\u202ej\u2066k\u2028l") == (
        "a\\x1b[2Jb\\x07c\\rd\\ne\\tf\\x00g\\u007fh\\u009bi\\u202ej\\u2066k\\u2028l"
    )
    # Text of several lines keeps its lines and tabs; everything else is still shown.
    assert visible("log:\n\tline\x1b]0;t\x07\r\n", lines=True) == "log:\n\tline\\x1b]0;t\\x07\\r\n"
    plain = "baseline vs eagle3-3step @ 4 req/s: 1.05x, 95% CI [0.98, 1.12] ±3 % α ≥ 0.6 — ünïcödé 日本語 עברית"
    assert visible(plain) == plain and visible(plain, lines=True) == plain


# ---------------------------------------------------------------- a result with hostile categories and names

CATEGORIES = (
    HOSTILE,
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[x](javascript:alert(1))",
    "a|b\nc",
)


def _categorised(labels: dict[str, float] | None = None) -> ABResult:
    """An A/B whose requests fall in CATEGORIES (as a dataset would give them), each run's per-request rows stored."""
    result = _result("exp", labels or {"baseline": 83.0, "eagle3-3step": 60.8}, blocks=3)
    per = len(CATEGORIES)
    launches = []
    for la in result.launches:
        runs = tuple(
            dataclasses.replace(
                r,
                requests=per,
                per_request=tuple(
                    {"index": i, "tokens": 64, "e2e_s": 64 / (r.tok_s * (1 + 0.01 * i)), "prompt_tokens": 30}
                    for i in range(per)
                ),
            )
            for r in la.runs
        )
        launches.append(dataclasses.replace(la, runs=runs))
    categories = {(1, 0.0, k): CATEGORIES for k in range(3)}
    return dataclasses.replace(result, launches=tuple(launches), categories=categories)


def _category_table(text: str) -> list[str]:
    """The lines of the terminal report's by-category table: its header, rule and rows."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("by category @")) + 1
    table = []
    for line in lines[start:]:
        if not line.startswith("  ") or line.startswith("  eagle3-3step vs"):
            break
        table.append(line)
    return table


def test_a_category_with_escapes_and_a_newline_keeps_the_terminal_table_whole() -> None:
    text = ab_text(_categorised())
    _assert_shown_not_obeyed(text)
    table = _category_table(text)
    # The header, its rule, and one row per category: a newline in a name splits no row, and each row holds its
    # category as escapes.
    assert len(table) == 2 + len(CATEGORIES), "\n".join(table)
    assert set(table[1].strip()) <= {"-", " "}
    for category in CATEGORIES:
        assert sum(line.startswith("  " + visible(category) + " ") for line in table[2:]) == 1, (category, table)


class _Elements(HTMLParser):
    """Every element a renderer's HTML would create, with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _rendered(markdown: str) -> list[tuple[str, dict[str, str | None]]]:
    """The elements GitHub-like rendering (CommonMark with raw HTML allowed, tables, strikethrough) would create."""
    html = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(markdown)
    parser = _Elements()
    parser.feed(html)
    return parser.tags


# What orch's own Markdown makes; anything else came from the text in it.
ALLOWED = {"h1", "h2", "h3", "p", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td", "strong", "em", "code"}


def _assert_inert(markdown: str) -> list[tuple[str, dict[str, str | None]]]:
    tags = _rendered(markdown)
    assert {tag for tag, _ in tags} <= ALLOWED, [tag for tag, _ in tags if tag not in ALLOWED]
    attrs = [(tag, a) for tag, a in tags if set(a) - {"style"}]  # only a table cell's alignment
    assert not attrs, attrs
    _assert_shown_not_obeyed(markdown)
    return tags


def test_the_markdown_export_renders_no_html_no_link_and_keeps_its_tables() -> None:
    # The arm names too: a profile name read back from a store or a bundle.
    arms = {"![p](javascript:alert(2))": 83.0, "<b onmouseover=alert(3)>x</b>": 60.8}
    md = ab_markdown(_categorised(arms))
    tags = _assert_inert(md)
    # Every table keeps its rows: the level's (header + 2 arms) and the categories' (header + one per category).
    rows = [tag for tag, _ in tags if tag == "tr"]
    assert len(rows) == (1 + 2) + (1 + len(CATEGORIES)), md
    # Shown as the text it is: the category reads back from the rendered page.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in MarkdownIt("commonmark", {"html": True}).enable("table").render(
        md
    )


def test_compare_and_nightly_markdown_are_inert_too() -> None:
    a = _result("A", {"[x](javascript:alert(1))": 83.0, "<script>alert(1)</script>": 60.8})
    c = compare(a, a)
    _assert_inert(compare_markdown(c))
    _assert_shown_not_obeyed(compare_text(c))
    item = night_result.ItemReport(
        item="item`<img src=x onerror=alert(1)>",
        host="gpu<script>",
        kind="bench",
        simulated=False,
        status="failed",
        error=HOSTILE,
    )
    line = night_report.item_line(item)
    _assert_inert(line)
    assert "\n" not in line


@pytest.mark.parametrize(
    ("text", "inert"),
    [
        ("<script>alert(1)</script>", "&lt;script>alert(1)&lt;/script>"),
        ("[x](javascript:alert(1))", "\\[x\\](javascript:alert(1))"),
        ("[ref]: javascript:alert(1)", "\\[ref]: javascript:alert(1)"),
        ("# FAKE", "\\# FAKE"),
        ("a|b\nc", "a\\|b\\\\nc"),
        ("snake_case *em* ~~gone~~ `code`", "snake_case \\*em\\* \\~\\~gone\\~\\~ \\`code\\`"),
        ("95% CI [0.98, 1.12] -> FASTER by ~3 %", "95% CI [0.98, 1.12] -> FASTER by ~3 %"),
        ("eagle3 vs baseline @ 4 req/s: 1.05x", "eagle3 vs baseline @ 4 req/s: 1.05x"),
        ("tok_s@8 up, goodput@4. bench@10.1.2.3:22", "tok_s@8 up, goodput@4. bench@10.1.2.3:22"),
    ],
)
def test_md_text_escapes_what_a_renderer_would_act_on_and_nothing_else(text: str, inert: str) -> None:
    assert md_text(text) == inert


# GFM's extended autolinks (github.github.com/gfm, "Autolinks (extension)"), as GitHub's renderer (cmark-gfm) finds
# them: a www or URL link while the inlines are parsed, so in text between escapes (a backslash escape is a text node
# of its own); an e-mail address (a mailto: or xmpp: one too) after parsing, in the text nodes merged again (escapes
# and entities are text by then), so only an element between its parts breaks it.
WWW_LINK = re.compile(r"(?i)(?<![^\s*_~(\[\]])www\.[A-Za-z0-9_-]")
URL_LINK = re.compile(r"(?i)(?<![A-Za-z])(?:https?|ftp)://[A-Za-z0-9_-]")
EMAIL_LINK = re.compile(r"[A-Za-z0-9.+_-]+@[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)+")
# Markdown's parse without merging escapes back into the text around them (markdown-it's last core rule).
_PARSE = MarkdownIt("commonmark", {"html": True}).enable("table").disable("text_join")


def _gfm_autolinks(markdown: str) -> list[str]:
    """Each extended autolink a GFM renderer would make of the Markdown's text."""
    found: list[str] = []
    for token in _PARSE.parse(markdown):
        merged = [""]
        for child in token.children or []:
            if child.type == "text":
                found += [m.group(0) for m in WWW_LINK.finditer(child.content)]
                found += [m.group(0) for m in URL_LINK.finditer(child.content)]
            if child.type in ("text", "text_special"):
                merged[-1] += child.content
            else:
                merged.append("")
        found += [m.group(0) for text in merged for m in EMAIL_LINK.finditer(text) if m.group(0)[-1] not in "-_"]
    return found


def _read(markdown: str) -> str:
    """The text a reader sees of the rendered Markdown (HTML comments dropped, as renderers that allow HTML do)."""
    parser = _Texts()
    parser.feed(MarkdownIt("commonmark", {"html": True}).render(markdown))
    return "".join(text for _, text in parser.texts).strip()


LINKS = (
    "https://evil.example/login",
    "http://evil.example",
    "ftp://evil.example/f",
    "HTTPS://EVIL.EXAMPLE/X",
    "see www.evil.example/x now",
    "(WWW.evil.example)",
    "ops@evil.example",
    "mailto:ops@evil.example",
    "xmpp:ops@evil.example/chat",
    "a_b+c.d@evil-co.example",
    "run_@evil.example",
    "x@_evil.example",
    "x@a.b9.example:22",
)


@pytest.mark.parametrize("text", LINKS)
def test_md_text_keeps_a_bare_url_www_link_or_address_text_that_reads_the_same(text: str) -> None:
    assert _gfm_autolinks(text), text  # the grammar above finds the link in the bare text
    assert not _gfm_autolinks(md_text(text)), md_text(text)
    assert _read(md_text(text)) == text


def test_the_markdown_export_links_nothing_from_a_name_or_a_category() -> None:
    arms = {"https://evil.example/b": 83.0, "www.evil.example": 60.8}
    result = dataclasses.replace(_categorised(arms), notes=("mail ops@evil.example",))
    result = dataclasses.replace(result, categories={k: LINKS[: len(CATEGORIES)] for k in result.categories or {}})
    md = ab_markdown(result)
    assert not _gfm_autolinks(md), _gfm_autolinks(md)
    _assert_inert(md)


# ---------------------------------------------------------------- through the command line


def _craft_arm_names(db: Path) -> tuple[str, str]:
    """Two stored experiments, then their arm names rewritten in the store to hostile ones (the bundle reader may
    refuse such names; a store is written by whoever has the file)."""
    speeds = {"baseline": 83.0, "eagle3-3step": 60.8}
    ids = ("20261201-000000-aaaaaa", "20261201-000001-bbbbbb")
    for exp_id in ids:
        store(db, _result(exp_id, speeds, blocks=2))
    hostile = ["base" + HOSTILE, "spec\u202eline\r\n" + FORGED]
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE experiments SET arms_json = ?, host = ?", (json.dumps(hostile), "gpu\x1b[2J\n" + FORGED))
        for old, new in zip(speeds, hostile, strict=True):
            conn.execute("UPDATE launches SET profile = ? WHERE profile = ?", (new, old))
    conn.close()
    store(db, _result(PLAIN, {"x": 83.0, "y": 60.8}, blocks=2))
    return ids


PLAIN = "20261201-000002-cccccc"  # arms x and y: nothing in common with the hostile ones


def test_hostile_arm_names_from_a_store_reach_no_terminal(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    a, b = _craft_arm_names(db)
    for args in (
        ("list",),
        ("show", a),
        ("compare", a, b),
        ("export", a, "--format", "md"),
        ("compare", a, PLAIN),  # refused (exit 2): the error names A's arms, as printed by the command line itself
    ):
        proc = run_orch(*args, "--db", str(db), cwd=tmp_path)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, 2, 3, 4), (args, out, err)
        _assert_shown_not_obeyed(out + err)
    assert "no arm of B" in err and "basecat\\x1b]0;FAKE VERDICT" in err, err
    # CSV and JSON stay data: a newline is quoted or escaped as their formats say (read back, the names are exactly
    # as stored); still no raw escape sequence reaches the terminal.
    proc = run_orch("export", a, "--format", "csv", "--db", str(db), cwd=tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and not [c for c in RAW if c in out], out
    proc = run_orch("show", a, "--json", "--db", str(db), cwd=tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert next(arm["label"] for arm in json.loads(out)["arms"]) == "base" + HOSTILE


@contextmanager
def _sim(log: Path, *args: str, **env: str) -> Iterator[str]:
    """The simulator started as someone else would start a server (no orch marker, its own session), with its
    arguments and env."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    environ.update(PYTHONPATH=str(REPO), ORCH_SIM_LOAD_S="0.2", ORCH_SIM_WARMUP_S="0", **env)
    cmd = [sys.executable, "-m", "orchestrator.sim", "--model-path", "/models/test-model", "--port", str(port), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, log.read_text()
            with suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health_generate", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the simulator never became healthy"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the session this test started, by its leader's PID
        proc.wait(10)


def test_an_attached_servers_version_reaches_no_terminal(
    write_profile: WriteProfile, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "r.db")
    path = write_profile(
        "left", engine="sglang", model_path="/models/test-model", tp_size=1, port=free_port(), sim=FAST_SIM
    )
    with _sim(tmp_path / "plain.log") as plain:
        assert main(["bench", str(path), "--attach", plain, *QUICK, "--db", db]) == 0
    # The same simulator, but /server_info says its version is the hostile text.
    with _sim(tmp_path / "hostile.log", ORCH_SIM_VERSION="0.5.9" + HOSTILE) as hostile:
        assert main(["bench", str(path), "--attach", hostile, *QUICK, "--db", db]) == 0
    capfd.readouterr()
    conn = sqlite3.connect(db)
    ids = [row[0] for row in conn.execute("SELECT id FROM experiments ORDER BY created_at")]
    conn.close()
    code = main(["compare", *ids, "--db", db])
    out, err = capfd.readouterr()
    assert code in (0, 3, 4), out + err
    # The version is said (a likely cause), as text: its escapes shown, its newline inside the line.
    assert "engine version: 0.5.9 -> 0.5.9cat\\x1b]0;FAKE VERDICT: REPRODUCED\\x07" in out, out
    _assert_shown_not_obeyed(out + err)


def test_the_command_lines_last_guard_shows_what_no_report_escaped(
    write_profile: WriteProfile, capsys: pytest.CaptureFixture[str]
) -> None:
    # `orch profiles show` prints the launch command with each env value shell-quoted, control characters and all:
    # only the guard on the command line's output (common/printable.VisibleWriter) stands between them and the
    # terminal.
    path = write_profile(
        "titled",
        engine="sglang",
        model_path="/models/test-model",
        tp_size=1,
        port=free_port(),
        env={"MY_TITLE": HOSTILE},
    )
    assert main(["profiles", "show", str(path), "--sim"]) == 0
    out = capsys.readouterr().out
    assert "MY_TITLE='cat\\x1b]0;FAKE VERDICT: REPRODUCED\\x07" in out, out
    assert not [repr(c) for c in RAW if c in out], out


def test_an_attached_servers_model_ids_forge_no_line(
    write_profile: WriteProfile, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # GET /v1/models lists a model id holding escape sequences and a newline before a forged line: the note that
    # the server serves another model than the profile's says so in one line, the id's escapes shown.
    path = write_profile(
        "left", engine="sglang", model_path="/models/test-model", tp_size=1, port=free_port(), sim=FAST_SIM
    )
    with _sim(tmp_path / "models.log", "--served-model-name", "m" + HOSTILE) as url:
        assert main(["bench", str(path), "--attach", url, *QUICK, "--db", str(tmp_path / "r.db")]) == 0
    out, err = capfd.readouterr()
    note = next(line for line in (out + err).splitlines() if "/v1/models lists" in line)
    assert "lists mcat\\x1b]0;FAKE VERDICT: REPRODUCED\\x07" in note and "\\n" + FORGED in note, note
    _assert_shown_not_obeyed(out + err)


# ---------------------------------------------------------------- the HTML report

# Every character a browser would obey or reorder by rather than show: C0 (but the page's own newlines), DEL, C1, the
# bidi embeddings, overrides, isolates and marks, the Arabic letter mark, Unicode's line and paragraph separators.
UNSEEN = "\x00\x08\x0b\x0c\x7f\x85\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u2028\u2029"
RAW_IN_HTML = re.compile(f"[\\x00-\\x09\\x0b-\\x1f{re.escape(UNSEEN)}{re.escape(''.join(RAW))}]")


class _Texts(HTMLParser):
    """Each run of text of an HTML page, with the element it is in."""

    def __init__(self) -> None:
        super().__init__()
        self.tag = ""
        self.texts: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tag = tag

    def handle_data(self, data: str) -> None:
        self.texts.append((self.tag, data))


def _assert_page_shows(page: str, *names: str) -> list[tuple[str, str]]:
    """No raw control or bidi character anywhere in the page (text, attributes, the plots' SVG), no text of the page
    or of a plot that starts a forged line, and each name there in its visible form."""
    raw = sorted({repr(c) for c in RAW_IN_HTML.findall(page)})
    assert not raw, raw
    parser = _Texts()
    parser.feed(page)
    forged = [(tag, text) for tag, text in parser.texts if text.lstrip().startswith(FORGED)]
    assert not forged, forged
    for name in names:
        assert html.escape(visible(name)) in page, name
    return parser.texts


def test_the_html_report_shows_a_stores_hostile_names_in_its_text_and_its_plots(tmp_path: Path) -> None:
    # `orch report ID --html F` from a store whose arm names and host were rewritten with SQLite.
    db = tmp_path / "r.db"
    a, _ = _craft_arm_names(db)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE experiments SET arms_json = ?", (json.dumps(["base" + HOSTILE, "spec" + UNSEEN]),))
        conn.execute(
            "UPDATE launches SET profile = ? WHERE profile = ?", ("spec" + UNSEEN, "spec\u202eline\r\n" + FORGED)
        )
    conn.close()
    out = tmp_path / "r.html"
    assert main(["report", a, "--html", str(out), "--db", str(db)]) == 0
    texts = _assert_page_shows(out.read_text(), "base" + HOSTILE, "spec" + UNSEEN, "gpu\x1b[2J\n" + FORGED)
    # The plots name the arms too (tick labels, legends): as the page does.
    drawn = [text for tag, text in texts if tag == "text"]
    assert visible("base" + HOSTILE) in drawn and visible("spec" + UNSEEN) in drawn, drawn


def test_the_html_reports_categories_notes_and_reasons_are_shown_too() -> None:
    arms = {"base" + UNSEEN: 83.0, "<b onmouseover=alert(3)>x\u202e</b>": 60.8}
    result = dataclasses.replace(
        _categorised(arms), notes=("note" + HOSTILE,), host="gpu" + UNSEEN, host_facts={"kernel": "6.8" + HOSTILE}
    )
    _assert_page_shows(ab_html(result), *CATEGORIES, *arms, "note" + HOSTILE, "gpu" + UNSEEN, "6.8" + HOSTILE)


def test_the_nightly_pages_item_names_hosts_notes_and_marks_are_shown_too() -> None:
    # `orch history --html`: an item's name and host come from the suite file, a night's note and a gap's reason
    # from a failure's message, an environment step's label from what changed (a version a server reported).
    nights = ("2026-12-01", "2026-12-02", "2026-12-03")
    series = nightly_page.Series(
        series="a:tok_s",
        anchor="s-a-tok-s",
        title="a" + UNSEEN + " tok/s",
        unit="tok/s",
        threshold=0.05,
        higher_is_better=True,
        nights=nights,
        points=(
            nightly_page.Point(x=0, value=80.0, lo=None, hi=None),
            nightly_page.Point(x=1, value=81.0, lo=None, hi=None),
        ),
        levels=(),
        band=None,
        changes=(),
        env_steps=(nightly_page.EnvStep(x=1, label="sglang 0.5.9" + HOSTILE),),
        gaps=(nightly_page.Gap(x=2, label="failed: " + HOSTILE),),
        outliers=(),
        noise=None,
        noise_warning=None,
    )
    item = nightly_page.Item(
        item="item" + HOSTILE,
        host="gpu" + UNSEEN,
        anchor="item-1",
        state="failed",
        label="FAILED",
        night=nights[-1],
        noise="—",
        noise_warning="noisy" + UNSEEN,
        env_nights=2,
        experiments=(),
        simulated=False,
        attached=False,
        series=(series,),
        nights=(nightly_page.NightRow(night=nights[-1], state="failed", label="FAILED", experiments=(), note=HOSTILE),),
    )
    page = nightly_page.Page(title="nightly" + UNSEEN, night=nights[-1], items=(item,), simulated=False, attached=())
    _assert_page_shows(
        nightly_html.render(page), "item" + HOSTILE, "gpu" + UNSEEN, HOSTILE, "noisy" + UNSEEN, "a" + UNSEEN + " tok/s"
    )


# ---------------------------------------------------------------- what a server (or anyone's process) says, quoted


def test_a_servers_error_reply_is_one_field_of_the_requests_error() -> None:
    # The reason phrase and the body of an error answer are quoted in the request's error, which orch prints in
    # a run line, stores and reports: one line, its escapes shown.
    head = b"HTTP/1.1 500 Oops\x1b]0;T\x07\r\n"
    body = HOSTILE.encode()
    with _serving(head + b"Content-Length: %d\r\n\r\n" % len(body) + body) as srv:
        error = str(_run_client(srv.port, "generate")["error"])
    assert error.startswith("HTTP 500 Oops\\x1b]0;T\\x07: cat\\x1b]0;FAKE VERDICT"), error
    assert "\n" not in error, error
    _assert_shown_not_obeyed(error)


def test_a_servers_message_while_loading_and_its_log_tail_are_shown_not_obeyed(write_profile: WriteProfile) -> None:
    # What the agent hears from the server while it loads (an error message in its probe's answer) ...
    message = json.dumps({"error": {"message": HOSTILE}}).encode()
    reply = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n" % len(message) + message
    with _serving(reply) as srv:
        ready, state = waits.probe_once("127.0.0.1", srv.port, {"method": "GET", "path": "/health"}, 30.0)
    assert not ready and state.startswith("HTTP 500: cat\\x1b]0;FAKE VERDICT"), state
    _assert_shown_not_obeyed(state)
    # ... and what orch makes of the agent's answers: the state said in a line of its own, the log's tail quoted in
    # the error (its lines kept: a log has lines; nothing else obeyed).
    prof = load(str(write_profile("p", engine="sglang", model_path="/models/m", tp_size=1, port=free_port())))
    launch = single.Launch(
        launch_id="t:1",
        profile=prof.name,
        pid=1,
        pgid=1,
        port=prof.port,
        log_path="/nonexistent/p.log",
        argv=(),
        env={},
        simulated=True,
        started_at=0.0,
    )
    heard = {"state": "HTTP 500: " + HOSTILE, "log": "loading\n" + HOSTILE, "changed": True}
    host = _Agent({"ready": False, "why": "exited", "log_tail": "loading\n" + HOSTILE}, heard)
    lines: list[str] = []
    with pytest.raises(ServerError) as failed:
        single.wait_ready(host, launch, prof, timeout_s=1, events=Lines(lines.append))  # type: ignore[arg-type]
    said = next(line for line in lines if "answers;" in line)
    assert "\n" not in said and "says HTTP 500: cat\\x1b]0;FAKE" in said, said
    _assert_shown_not_obeyed(said)
    error = str(failed.value)
    assert "Last lines of /nonexistent/p.log:\nloading\ncat\\x1b]0;FAKE VERDICT" in error, error
    assert not [repr(c) for c in RAW if c in error], error


class _Agent:
    """A host whose agent answers wait_ready with `result`, after one progress event `heard`."""

    name = "stub"

    def __init__(self, result: dict[str, object], heard: dict[str, object]) -> None:
        self.result, self.heard = result, heard

    def call(self, op: str, **kw: Any) -> dict[str, object]:
        assert op == "wait_ready", op
        kw["on_progress"](self.heard)
        return self.result


def test_a_fingerprints_difference_is_one_line() -> None:
    # A version or an argv item from the server or its host, said as a likely cause (compare, reproduce, --fail-on).
    version = fingerprint.Difference(
        field="software.engine_version", before="0.5.9", after="0.5.9" + HOSTILE, category="engine", weight=100
    )
    argv = fingerprint.Difference(
        field="argv", before=["--x", "1"], after=["--x", "1" + HOSTILE], category="argv", weight=50
    )
    for d in (version, argv):
        line = d.describe()
        assert "\n" not in line and "cat\\x1b]0;FAKE VERDICT" in line, line
        _assert_shown_not_obeyed(line)
    mismatch = fingerprint.node_mismatches({"a": {"sglang": "0.5.9"}, "b": {"sglang": "0.5.9" + HOSTILE}})
    assert mismatch and all("\n" not in m for m in mismatch), mismatch
    _assert_shown_not_obeyed("\n".join(mismatch))


def test_anyones_command_line_is_one_field() -> None:
    # A port owner or a GPU process of someone else's, named in a refusal: its argv is theirs to choose.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", HOSTILE], stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        # Until the exec shows its argv: between fork and exec a loaded machine can show the child with an empty
        # command line (seen in CI: cmdline() == []).
        while not (psutil.Process(proc.pid).cmdline() or [""])[-1].startswith("cat\x1b"):
            assert time.monotonic() < deadline, "the child never ran"
            time.sleep(0.05)
        shown = masked_cmdline(psutil.Process(proc.pid), limit=1000)
    finally:
        proc.kill()  # this test's own child, by its PID
        proc.wait(10)
    assert "\n" not in shown and "cat\\x1b]0;FAKE VERDICT" in shown, shown
    _assert_shown_not_obeyed(shown)


# ---------------------------------------------------------------- refusals that quote what a file says

SIGNED = "signature: good signature by alice@example.com"
FORGE = "x\n" + SIGNED  # after a newline in a name: a line orch never wrote


def _assert_no_forged_line(text: str) -> None:
    forged = [line for line in text.splitlines() if line.startswith(SIGNED)]
    assert not forged, text


@pytest.fixture(scope="module")
def sent_bundle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A simulator experiment exported as a bundle, as its JSON."""
    root = tmp_path_factory.mktemp("sender")
    (root / "profiles").mkdir()
    profile = {"engine": "sglang", "model_path": "/models/m", "tp_size": 1, "ready_timeout_s": 30, "sim": FAST_SIM}
    (root / "profiles" / "p.yaml").write_text(yaml.safe_dump({**profile, "port": free_port()}))
    env = orch_env(root / "home")
    ran = run("bench", "p", "--sim", "--runs", "1", "--max-tokens", "16", *FAST, cwd=root, env=env)
    assert ran.rc == 0, ran.text
    path = root / "sent.orch.json"
    exported = run("export", "last", "--format", "bundle", "-o", str(path), cwd=root, env=env)
    assert exported.rc == 0, exported.text
    bundle: dict[str, Any] = json.loads(path.read_text())
    return bundle


def _forgeries(bundle: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The bundle with FORGE in one place at a time (its digest recomputed, as anyone can): every key and text value
    of a profile (and of its env, sim and speculative blocks), of the experiment and of its config."""
    content = bundle["content"]
    places: list[tuple[str, dict[str, Any]]] = [
        ("profiles[0]", content["profiles"][0]),
        *((f"profiles[0].{k}", v) for k, v in content["profiles"][0].items() if isinstance(v, dict)),
        ("experiment", content["experiment"]),
        ("config", content["config"]),
    ]
    for where, obj in places:
        for key in list(obj):
            for kind in ("key", "value"):
                if kind == "value" and not isinstance(obj[key], str):
                    continue
                forged = json.loads(json.dumps(bundle))
                at = _at(forged["content"], where)
                if kind == "key":
                    at[key + FORGE] = at.pop(key)
                else:
                    at[key] += FORGE
                forged["digest"] = bundle_mod.digest_of(forged)
                yield f"{where}: the {kind} {key}", forged


def _at(content: dict[str, Any], where: str) -> dict[str, Any]:
    head, _, key = where.partition(".")
    obj: dict[str, Any] = content["profiles"][0] if head == "profiles[0]" else content[head]
    return obj[key] if key else obj


def test_no_name_or_value_in_a_bundle_forges_a_line(
    sent_bundle: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `orch show FILE` (import and export read a bundle the same way): refused or shown, whatever a field holds, and
    # never with a line the file wrote. A refusal quotes the name as one field.
    path = tmp_path / "forge.orch.json"
    refused = 0
    for what, forged in _forgeries(sent_bundle):
        path.write_text(json.dumps(forged))
        code = main(["show", str(path)])
        out, err = capsys.readouterr()
        assert code in (0, 2), (what, out, err)
        _assert_no_forged_line(out + err)
        refused += code == 2
    assert refused >= 20, refused  # the profile's unknown keys, at least


def test_a_csv_header_a_profile_key_and_a_stores_table_are_quoted_on_one_line(
    write_profile: WriteProfile, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A quoted CSV column name holding a newline: refused before anything is launched.
    profile = write_profile("p", engine="sglang", model_path="/models/m", tp_size=1, port=free_port(), sim=FAST_SIM)
    data = tmp_path / "d.csv"
    data.write_text(f'"prompt{FORGE}",b\nx,y\n')
    assert main(["bench", str(profile), "--sim", "--prompts", str(data), "--db", str(tmp_path / "r.db")]) == 2
    err = capsys.readouterr().err
    assert "(columns: promptx\\nsignature: good signature by alice@example.com, b)" in err, err
    _assert_no_forged_line(err)
    # A profile's field name (an unknown one, one of env's).
    path = write_profile("q", text=json.dumps({"engine": "sglang", "model_path": "/m", "tp_size": 1, FORGE: 1,
                                              "env": {"A" + FORGE: "1"}}))  # fmt: skip
    assert main(["profiles", "validate", str(path)]) == 2
    said = "".join(capsys.readouterr())
    assert "'x\\nsignature: good signature by alice@example.com': unknown field" in said, said
    assert "env.'Ax\\nsignature: good" in said, said
    _assert_no_forged_line(said)
    # Another program's SQLite file given as --db: its table names.
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute(f'CREATE TABLE "{FORGE}" (a)')  # SQL quotes the name, newline and all
    conn.close()
    assert main(["list", "--db", str(db)]) in (1, 2)
    err = capsys.readouterr().err
    assert "not an orch results database (it has tables x\\nsignature" in err, err
    _assert_no_forged_line(err)


def test_a_bundles_data_names_are_one_field_of_reproduces_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A trace too big to carry, its name (and path) holding a newline: reproduce asks for a copy, naming it.
    trace = write_trace(tmp_path / f"t{FORGE}.jsonl")
    monkeypatch.setattr(bundle_mod, "MAX_PROMPT_BYTES", 100)
    bundle = make_bundle(trace_bench(trace))
    trace.unlink()
    with pytest.raises(InputError) as refused:
        reproduce.bundle_data(bundle, source="b.orch.json")
    message = str(refused.value)
    assert "replayed trace tx\\nsignature: good" in message and "\n" not in message, message

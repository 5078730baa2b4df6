"""A report section added in one place (report/sections.register) appears in every format: the terminal report,
Markdown, HTML and JSON (issue 38 item 3)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.report import sections
from orchestrator.report.sections import Section
from orchestrator.results.model import ABResult

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "docs" / "examples" / "llamacpp-prefix-cache.orch.json"


def _launches(result: ABResult) -> Section:
    rows = [("arm", "launches")] + [(arm.label, str(len(arm.launches))) for arm in result.arms]
    return Section(
        key="launch_count",
        title="Launches per arm",
        table=tuple(rows),
        items=(f"{len(result.arms)} arms <compared>",),
        note="a test-only section",
        data={arm.label: len(arm.launches) for arm in result.arms},
    )


@pytest.fixture
def registered() -> Iterator[None]:
    sections.register(_launches)
    yield
    sections.unregister(_launches)


def _out(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    assert main(args) == 0
    return capsys.readouterr().out


def test_a_section_registered_once_is_in_every_format(
    registered: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "r.db")
    _out(capsys, ["import", str(BUNDLE), "--db", db])
    text = _out(capsys, ["show", "last", "--db", db])
    assert "  Launches per arm:" in text and "  2 arms <compared>" in text and "  a test-only section" in text
    assert any(line.split() == ["cpu-baseline", "2"] for line in text.splitlines()), text
    md = _out(capsys, ["export", "last", "--format", "md", "--db", db])
    assert "## Launches per arm" in md and "| cpu-baseline | 2 |" in md and "_a test-only section_" in md
    assert "\n\n- 2 arms &lt;compared>\n\n_a test-only section_\n" in md  # escaped, each block apart
    doc = json.loads(_out(capsys, ["show", "last", "--json", "--db", db]))
    assert doc["launch_count"] == {"cpu-baseline": 2, "cpu-pld": 2}
    html = tmp_path / "r.html"
    _out(capsys, ["export", "last", "--format", "html", "-o", str(html), "--db", db])
    page = html.read_text()
    assert '<section id="launch-count"><h2>Launches per arm</h2><table id="table-launch-count">' in page
    assert "<li>2 arms &lt;compared&gt;</li>" in page and '<p class="note">a test-only section</p>' in page


def test_without_it_no_format_has_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "r.db")
    _out(capsys, ["import", str(BUNDLE), "--db", db])
    assert "Launches per arm" not in _out(capsys, ["show", "last", "--db", db])
    assert "launch_count" not in json.loads(_out(capsys, ["show", "last", "--json", "--db", db]))

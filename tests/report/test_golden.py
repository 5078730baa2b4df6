"""The reports of the docs' examples (docs/examples/*.orch.json, real runs) are byte for byte what they were when these
golden files were made: a change to how a report is built (report/sections, the formats' renderers) that changes
what a reader sees shows here, named by example, format and (JSON, HTML) part.

Text and Markdown are kept whole (tests/report/golden/NAME.txt, .md); JSON as a digest per top-level key and HTML as
a digest per section (its SVG figures left out: matplotlib's output is not this test's business), in NAME.digests.
After an intended change, `ORCH_GOLDEN_UPDATE=1 pytest tests/report/test_golden.py` rewrites them; say in the commit
which output changed and why."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "docs" / "examples").glob("*.orch.json"))
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("ORCH_GOLDEN_UPDATE") == "1"


def _digest(value: Any) -> str:
    data = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def _html_parts(page: str) -> dict[str, str]:
    """The page by section (its id), SVGs and the footer's time stamp taken out."""
    page = re.sub(r"<svg.*?</svg>", "<svg/>", page, flags=re.DOTALL)
    page = re.sub(r"<footer.*?</footer>", "<footer/>", page, flags=re.DOTALL)
    parts = re.split(r'(?=<section id=")', page)
    out = {"(head)": _digest(parts[0])}
    for part in parts[1:]:
        key = part[len('<section id="') : part.index('"', len('<section id="'))]
        out[key] = _digest(part)
    return out


def _out(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    assert main(args) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("bundle", EXAMPLES, ids=[p.name.removesuffix(".orch.json") for p in EXAMPLES])
def test_the_docs_examples_render_as_they_did(bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = bundle.name.removesuffix(".orch.json")
    db = str(tmp_path / "r.db")
    _out(capsys, ["import", str(bundle), "--db", db])
    text = _out(capsys, ["show", "last", "--db", db])
    md = _out(capsys, ["export", "last", "--format", "md", "--db", db])
    doc = json.loads(_out(capsys, ["show", "last", "--json", "--db", db]))
    html = tmp_path / "r.html"
    _out(capsys, ["export", "last", "--format", "html", "-o", str(html), "--db", db])
    digests = {"json": {k: _digest(v) for k, v in doc.items()}, "html": _html_parts(html.read_text())}
    files = {f"{name}.txt": text, f"{name}.md": md, f"{name}.digests": json.dumps(digests, indent=1, sort_keys=True)}
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        for file, content in files.items():
            (GOLDEN / file).write_text(content)
        return
    assert text == (GOLDEN / f"{name}.txt").read_text(), f"{name}: the terminal report changed"
    assert md == (GOLDEN / f"{name}.md").read_text(), f"{name}: the Markdown report changed"
    was = json.loads((GOLDEN / f"{name}.digests").read_text())
    for fmt in ("json", "html"):
        changed = sorted(k for k in was[fmt].keys() | digests[fmt].keys() if was[fmt].get(k) != digests[fmt].get(k))
        assert changed == [], f"{name}: the {fmt} report changed in {changed}"

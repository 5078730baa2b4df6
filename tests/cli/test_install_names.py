"""Install commands in the docs, profiles and messages name the distribution, orch-bench: `orch` on PyPI is not us."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# `orch[report]`, `pip install orch`, `pipx install 'orch[llamacpp]'`; not orch-bench, not `install orch into`.
WRONG = re.compile(r"(?<![\w-])orch\[|\bpipx?\s+install\s+(?:-\S+\s+)*['\"]?orch(?![\w-])(?!\s+into)")


def _texts() -> list[Path]:
    files = [REPO / "README.md", REPO / "Makefile", REPO / "pyproject.toml"]
    files += sorted((REPO / "docs").rglob("*.md")) + sorted((REPO / "profiles").glob("*.yaml"))
    files += sorted((REPO / "orchestrator").rglob("*.py")) + sorted((REPO / "orchestrator").rglob("*.yaml"))
    return files


def test_no_install_line_names_orch_instead_of_orch_bench() -> None:
    hits = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in _texts()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if WRONG.search(line)
    ]
    assert hits == []


def test_the_pattern_catches_the_wrong_names_and_spares_the_right_ones() -> None:
    for wrong in ("pip install 'orch[report]'", "pipx install orch", "pip install -U orch", "`orch[llamacpp]`"):
        assert WRONG.search(wrong), wrong
    for right in ("pip install 'orch-bench[report]'", "pipx install orch-bench", "install orch into it (editable)",
                  "pip install -e '.[report]'", "pip uninstall --yes orch", "orch report last"):  # fmt: skip
        assert not WRONG.search(right), right

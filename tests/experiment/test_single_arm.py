"""A single-arm `orch bench`: its report, Markdown and CSV, and block and run numbers counted from 1."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli import main

Capsys = pytest.CaptureFixture[str]
SimProfiles = Callable[..., dict[str, Path]]


def test_single_arm_report_and_block_numbers(
    sim_profiles: SimProfiles, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim_profiles()
    # ./profiles/baseline.yaml (a free port), not the bundled baseline on 8000, which a user's orch may be using.
    monkeypatch.chdir(tmp_path)
    db = str(tmp_path / "r.db")
    args = ["--sim", "--runs", "1", "--warmup", "0", "--max-tokens", "16", "--grace", "2", "--min-run-s", "0"]
    assert main(["bench", "baseline", "--blocks", "2", *args, "--db", db]) == 0
    out = capsys.readouterr().out
    assert "========== benchmark of baseline (" in out and "A/B" not in out
    header = next(line for line in out.splitlines() if line.strip().startswith("arm "))
    assert header.split()[-1] == "accept" and "vs" not in header.split()
    assert "vs: mean per-block ratio" not in out
    assert "block 1: baseline" in out and "block 2: baseline" in out and "block 0" not in out

    assert main(["export", "last", "--format", "md", "--db", db]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# Benchmark of baseline, ") and "| vs " not in md

    assert main(["export", "last", "--format", "csv", "--db", db]) == 0
    csv_blocks = sorted({line.split(",")[5] for line in capsys.readouterr().out.splitlines()[1:]})
    assert csv_blocks == ["1", "2"]

    assert main(["show", "last", "--json", "--db", db]) == 0
    doc = json.loads(capsys.readouterr().out)
    launches = doc["launches"]
    assert sorted(x["block_number"] for x in launches) == [1, 2]
    assert all(x["block_number"] == x["block"] + 1 and x["position_number"] == 1 for x in launches)
    runs = doc["arms"][0]["runs"]
    assert sorted(r["block_number"] for r in runs) == [1, 2] and {r["run_number"] for r in runs} == {1}

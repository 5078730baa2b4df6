"""A night says when an item's nodes differed, and where an interrupted Slurm item stood (no sshd, no Slurm)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.nightly import fanout, history, night
from orchestrator.nightly import report as report_nightly
from orchestrator.nightly import suite as suite_mod
from orchestrator.results.store import Store
from tests.conftest import WriteProfile
from tests.experiment.test_failon import result as make_result
from tests.nightly.test_nightly import sim_profile, write_suite

MISMATCH = "GPU model: node-a has NVIDIA H100, node-b has NVIDIA H200"
QUEUED = "slurm:p: asked Slurm for 2 nodes, 60 min: allocation 12 is queued (PENDING, reason Resources) for 0s"
GRANTED = "slurm:p: Slurm granted allocation 12 in partition p after 3s (time limit 60 min)"


def _runner(write_profile: WriteProfile, tmp_path: Path, host: str) -> tuple[night.NightRunner, suite_mod.Item]:
    sim_profile(write_profile, "check")
    suite = suite_mod.load(str(write_suite(tmp_path, [{"name": "check", "bench": "check", "host": host}])))
    runner = night.NightRunner(suite=suite, store=Store(tmp_path / "n.db"), night_at=time.time())
    history.start_night(runner.store, runner.night_id, suite.name, str(suite.path), suite.sha256, runner.night_at)
    return runner, suite.items[0]


def test_an_item_on_nodes_that_differ_says_so_in_its_line_and_json(
    write_profile: WriteProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, item = _runner(write_profile, tmp_path, "local")
    facts = {"nodes": {}, "node_mismatches": [MISMATCH]}
    measured = dataclasses.replace(make_result({"check": 80.0}, blocks=3), host="pair", host_facts=facts)
    monkeypatch.setattr(runner, "_measure_once", lambda *_: measured)
    report = runner._item(item, time.monotonic() + 60)
    assert report.status == "building"
    warning = f"the nodes of pair differ (launched anyway with --allow-node-mismatch): {MISMATCH}"
    assert report.to_dict()["warnings"] == [warning]
    line = report_nightly.item_line(report)
    assert line.startswith(f"- building history `check` (local, SIMULATED): WARNING: {warning}; check tok/s"), line
    # Nodes alike: no warning, and the JSON item says so.
    alike = dataclasses.replace(measured, host_facts={"nodes": {}})
    monkeypatch.setattr(runner, "_measure_once", lambda *_: alike)
    report = runner._item(item, time.monotonic() + 60)
    assert report.to_dict()["warnings"] == [] and "WARNING" not in report_nightly.item_line(report)


@pytest.mark.parametrize(
    ("said", "why"),
    [
        ([QUEUED], "interrupted while queued for its allocation"),
        ([QUEUED, GRANTED], "interrupted while it ran"),
        ([], "interrupted while it ran"),  # not on Slurm: nothing to wait for
    ],
)
def test_an_item_interrupted_in_slurms_queue_says_it_never_ran(
    said: list[str], why: str, write_profile: WriteProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, item = _runner(write_profile, tmp_path, "slurm:p")

    def open_host(config: Any, *, nodes: int, events: Any) -> Any:
        for line in said:
            events.line(line)
        raise KeyboardInterrupt

    monkeypatch.setattr(night, "open_host", open_host)
    with pytest.raises(KeyboardInterrupt):
        runner._item(item, time.monotonic() + 60)
    assert runner._cut is not None and runner._cut.status == "interrupted" and runner._cut.error == why


def test_a_fan_out_child_that_left_no_report_is_judged_by_what_it_printed() -> None:
    state = None
    for line in (f"[check] {QUEUED}", "[check] something else"):
        state = fanout.allocation_state(line, state)
    assert fanout.interrupted_why(state) == "interrupted while queued for its allocation"
    state = fanout.allocation_state(f"[check] {GRANTED}", state)
    assert fanout.interrupted_why(state) == "interrupted while it ran"
    assert fanout.interrupted_why(None) == "interrupted"  # it said nothing: not claimed to have run

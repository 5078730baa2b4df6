"""`fan_out: true` against a real one-node Slurm cluster: two items as two allocations alive at once, both stored and
reported; Ctrl-C and an item's timeout each release every allocation."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.agent import ops
from orchestrator.nightly import suite as suite_mod
from orchestrator.nightly.suite import SuiteError
from tests import slurmcluster
from tests.conftest import NAMESPACE, REPO, WriteProfile
from tests.hosts.test_slurmhost import VENV_BIN, needs_cluster
from tests.nightly.test_nightly import DEFAULTS, sim_profile
from tests.slurmcluster import PARTITION, SlurmCluster

NIGHT = [sys.executable, "-m", "orchestrator", "nightly", "suite.yaml", "--db", "n.db", "--now", "2026-11-01T02:00"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from slurmcluster.for_module()


def _jobs(cluster: SlurmCluster) -> list[str]:
    return cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split()


def _fan_suite(
    cluster: SlurmCluster, write_profile: WriteProfile, tmp_path: Path, workload: dict[str, Any], **item: Any
) -> dict[str, str]:
    """Two items on two non-exclusive one-GPU Slurm hosts (both allocations fit on the one node at once); returns
    the environment orch runs in."""
    for name in ("one", "two"):
        sim_profile(write_profile, name)
    entry = {"scheduler": "slurm", "partition": PARTITION, "exclusive": False, "gres": "gpu:1", "time_limit_min": 5}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"c1": entry, "c2": entry}}))
    # On one node orch's host lock lets one session measure at a time: `wait` lets the second item queue for it.
    (tmp_path / "suite.yaml").write_text(
        yaml.safe_dump(
            {
                "suite": "fan", "deadline": "10m", "wait": "60s", "min_history": 3, "fan_out": True,
                "defaults": {**DEFAULTS, "workload": {**DEFAULTS["workload"], **workload}},
                "items": [
                    {"name": "one", "bench": "one", "host": "c1", **item},
                    {"name": "two", "bench": "two", "host": "c2", **item},
                ],
            },
            sort_keys=False,
        )
    )  # fmt: skip
    return cluster.env({**os.environ, "PYTHONPATH": str(REPO), "PATH": VENV_BIN + os.pathsep + os.environ["PATH"]})


def _night_items(tmp_path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(tmp_path / "n.db") as db:
        return db.execute("SELECT item, status FROM night_items ORDER BY item").fetchall()


def _assert_nothing_left(cluster: SlurmCluster) -> None:
    assert _jobs(cluster) == []
    cluster.wait_no_processes()
    assert ops.op_find(NAMESPACE) == []


def _start(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        NIGHT, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # SIGINT comes from the test only
    )  # fmt: skip


def _until_two_allocations(cluster: SlurmCluster, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while len(_jobs(cluster)) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "two allocations never existed at once"
        time.sleep(0.2)


@pytest.mark.slurm
@needs_cluster
def test_two_slurm_items_run_as_two_allocations_at_once(
    cluster: SlurmCluster, write_profile: WriteProfile, tmp_path: Path
) -> None:
    env = _fan_suite(cluster, write_profile, tmp_path, {"runs": 1})
    seen: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen.append(len(_jobs(cluster)))
            time.sleep(0.2)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        proc = subprocess.run(
            NIGHT, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, start_new_session=True
        )
    finally:
        stop.set()
        watcher.join()
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert max(seen) == 2, f"never two allocations at once (seen {sorted(set(seen))}):\n{text}"
    assert "its own allocation, in parallel" in text and "Traceback" not in text
    assert "[one] " in proc.stderr and "[two] " in proc.stderr  # the children's progress, forwarded
    assert "building history `one`" in proc.stdout and "building history `two`" in proc.stdout, proc.stdout
    assert proc.stdout.index("`one`") < proc.stdout.index("`two`")  # the suite's order, whoever ended first
    assert _night_items(tmp_path) == [("one", "complete"), ("two", "complete")]
    with sqlite3.connect(tmp_path / "n.db") as db:
        assert db.execute("SELECT COUNT(*) FROM experiments WHERE status = 'complete'").fetchone()[0] == 2
    _assert_nothing_left(cluster)


@pytest.mark.slurm
@needs_cluster
def test_ctrl_c_stops_every_item_and_releases_every_allocation(
    cluster: SlurmCluster, write_profile: WriteProfile, tmp_path: Path
) -> None:
    env = _fan_suite(cluster, write_profile, tmp_path, {"runs": 50, "max_tokens": 100})
    proc = _start(tmp_path, env)
    _until_two_allocations(cluster, proc)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    rows = _night_items(tmp_path)
    assert rows == [("one", "interrupted"), ("two", "interrupted")], rows  # each stopped by its own child
    _assert_nothing_left(cluster)


@pytest.mark.slurm
@needs_cluster
def test_an_item_past_its_timeout_is_stopped_and_its_allocation_released(
    cluster: SlurmCluster, write_profile: WriteProfile, tmp_path: Path
) -> None:
    env = _fan_suite(cluster, write_profile, tmp_path, {"runs": 200, "max_tokens": 100}, timeout="4s")
    proc = _start(tmp_path, env)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 1, out  # an item that could not finish: exit 1, as without fan-out
    assert out.count("**TIMED OUT**") == 2 and "Traceback" not in out, out
    assert _night_items(tmp_path) == [("one", "timeout"), ("two", "timeout")]
    _assert_nothing_left(cluster)


def test_fan_out_must_be_a_boolean(tmp_path: Path, write_profile: WriteProfile) -> None:
    sim_profile(write_profile, "one")
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"fan_out": "slurm", "items": [{"name": "one", "bench": "one", "sim": True}]}))
    with pytest.raises(SuiteError, match=r"fan_out: expected true or false, got 'slurm'"):
        suite_mod.load(str(suite))


@pytest.mark.slurm
@needs_cluster
def test_sigterm_with_sigint_ignored_still_stops_every_child(
    cluster: SlurmCluster, write_profile: WriteProfile, tmp_path: Path
) -> None:
    # `orch nightly &` from a script (or some cron wrappers) starts orch with SIGINT ignored, and its children inherit
    # that: the SIGINT the night forwards must still stop each child, or its allocation outlives the night.
    env = _fan_suite(cluster, write_profile, tmp_path, {"runs": 50, "max_tokens": 100})
    proc = subprocess.Popen(
        NIGHT, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    _until_two_allocations(cluster, proc)
    time.sleep(2)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out
    assert time.monotonic() - began < 30, out  # each child stopped by the signal, not killed after STOP_WAIT_S
    assert "Traceback" not in out and "was stopped" not in out, out
    assert _night_items(tmp_path) == [("one", "interrupted"), ("two", "interrupted")]
    _assert_nothing_left(cluster)

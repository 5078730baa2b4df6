"""`fan_out: true` against a real one-node Slurm cluster: two items, two allocations alive at once, both reported."""

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

import pytest
import yaml

from orchestrator import hostside
from orchestrator import suite as suite_mod
from orchestrator.suite import SuiteError
from tests.conftest import NAMESPACE, REPO, WriteProfile
from tests.slurmcluster import PARTITION, SlurmCluster
from tests.test_nightly import DEFAULTS, sim_profile
from tests.test_slurmhost import VENV_BIN, needs_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    c = SlurmCluster.start()
    try:
        yield c
    finally:
        leaked = c.stop()
    assert not leaked, f"the test cluster had to clean up after the tests: {leaked}"


def _jobs(cluster: SlurmCluster) -> list[str]:
    return cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split()


@needs_cluster
def test_two_slurm_items_run_as_two_allocations_at_once(
    cluster: SlurmCluster, write_profile: WriteProfile, tmp_path: Path
) -> None:
    for name in ("one", "two"):
        sim_profile(write_profile, name)
    # Not exclusive, one GPU each: both allocations fit on the one node at the same time.
    entry = {"scheduler": "slurm", "partition": PARTITION, "exclusive": False, "gres": "gpu:1", "time_limit_min": 5}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"c1": entry, "c2": entry}}))
    suite = tmp_path / "suite.yaml"
    # Both allocations land on one node, where orch's host lock lets one session measure at a time: `wait` covers it.
    suite.write_text(
        yaml.safe_dump(
            {
                "suite": "fan", "deadline": "10m", "wait": "60s", "min_history": 3, "fan_out": True,
                "defaults": {**DEFAULTS, "workload": {**DEFAULTS["workload"], "runs": 1}},
                "items": [{"name": "one", "bench": "one", "host": "c1"}, {"name": "two", "bench": "two", "host": "c2"}],
            },
            sort_keys=False,
        )
    )  # fmt: skip
    env = cluster.env({**os.environ, "PYTHONPATH": str(REPO), "PATH": VENV_BIN + os.pathsep + os.environ["PATH"]})
    seen: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen.append(len(_jobs(cluster)))
            time.sleep(0.2)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator", "nightly", str(suite), "--db", "n.db", "--now", "2026-11-01T02:00"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, start_new_session=True,
        )  # fmt: skip
    finally:
        stop.set()
        watcher.join()
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert max(seen) == 2, f"never two allocations at once (seen {sorted(set(seen))}):\n{text}"
    assert "its own allocation, in parallel" in text and "Traceback" not in text
    assert "building history `one`" in proc.stdout and "building history `two`" in proc.stdout, proc.stdout
    with sqlite3.connect(tmp_path / "n.db") as db:
        rows = db.execute("SELECT item, status FROM night_items ORDER BY item").fetchall()
        experiments = db.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
    assert rows == [("one", "complete"), ("two", "complete")] and experiments == 2
    assert _jobs(cluster) == []
    cluster.wait_no_processes()
    assert hostside.op_find(NAMESPACE) == []
    assert not list(Path("/tmp").glob(f"orch-fanout-*/{'one'}.report"))
    print(f"fan-out night took {time.monotonic() - t0:.1f}s")


def test_fan_out_must_be_a_boolean(tmp_path: Path, write_profile: WriteProfile) -> None:
    sim_profile(write_profile, "one")
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"fan_out": "slurm", "items": [{"name": "one", "bench": "one", "sim": True}]}))
    with pytest.raises(SuiteError, match=r"fan_out: expected true or false, got 'slurm'"):
        suite_mod.load(str(suite))


@needs_cluster
def test_ctrl_c_stops_every_item_and_releases_every_allocation(
    cluster: SlurmCluster, write_profile: WriteProfile, tmp_path: Path
) -> None:
    for name in ("one", "two"):
        sim_profile(write_profile, name)
    entry = {"scheduler": "slurm", "partition": PARTITION, "exclusive": False, "gres": "gpu:1", "time_limit_min": 5}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"c1": entry, "c2": entry}}))
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "suite": "fan", "deadline": "10m", "wait": "60s", "min_history": 3, "fan_out": True,
                "defaults": {**DEFAULTS, "workload": {**DEFAULTS["workload"], "runs": 50, "max_tokens": 100}},
                "items": [{"name": "one", "bench": "one", "host": "c1"}, {"name": "two", "bench": "two", "host": "c2"}],
            },
            sort_keys=False,
        )
    )  # fmt: skip
    env = cluster.env({**os.environ, "PYTHONPATH": str(REPO), "PATH": VENV_BIN + os.pathsep + os.environ["PATH"]})
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "nightly", str(suite), "--db", "n.db", "--now", "2026-11-01T02:00"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while len(_jobs(cluster)) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "two allocations never existed at once"
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    with sqlite3.connect(tmp_path / "n.db") as db:
        rows = db.execute("SELECT item, status FROM night_items ORDER BY item").fetchall()
    assert [r[0] for r in rows] == ["one", "two"] and {r[1] for r in rows} <= {"interrupted", "skipped"}, rows
    assert _jobs(cluster) == []
    cluster.wait_no_processes()
    assert hostside.op_find(NAMESPACE) == []

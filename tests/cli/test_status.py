"""`orch status`: one line per launch with its profile from the store, and what a refused `--host` retries."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import ops
from orchestrator.cli import main
from orchestrator.cli.launches import age_text, launch_started, stored_profiles, summarize, table
from tests.conftest import NAMESPACE, free_port

Capsys = pytest.CaptureFixture[str]
SimProfiles = Callable[..., dict[str, Path]]


# ---------------------------------------------------------------- orch status


def _proc(pid: int, pgid: int, lid: str, ports: list[int], owner_state: str = "dead") -> dict[str, Any]:
    return {"pid": pid, "pgid": pgid, "cmdline": "x", "launch_id": lid, "owner_state": owner_state, "ports": ports}


def test_status_summary_is_one_line_per_launch() -> None:
    old, new = "ns:20260101T100000-aaaaaaaa", "ns:20260101T110000-bbbbbbbb"
    workers = [_proc(12, 10, new, []), _proc(10, 10, new, [8000]), _proc(11, 10, new, [])]
    procs = [*workers, _proc(20, 20, old, [], "alive")]
    now = launch_started(new)
    assert now is not None
    launches = summarize(procs, {new: "eagle3-3step"}, now=now + 75)
    # The store was read and does not know the old launch, which names no profile itself: another store's.
    assert [x["launch_id"] for x in launches] == [old, new]  # oldest first
    latest = launches[1]
    assert latest["pid"] == 10 and latest["ports"] == [8000] and latest["processes"] == 3
    assert latest["profile"] == "eagle3-3step" and latest["age_s"] == 75
    lines = table(launches)
    assert lines[0].split() == ["profile", "launch", "PID", "port", "age", "state"]
    assert lines[1].split()[:7] == ["(another", "results", "store)", old, "20", "-", "1h01m"]
    # The store could not be read: unknown, not "another store's".
    assert table(summarize(procs, None, now=now + 75))[1].split()[:2] == ["?", old]
    assert "not listening yet, in use by a running orch session" in lines[1]
    assert lines[2].split()[:5] == ["eagle3-3step", new, "10", "8000", "1m15s"]
    assert "serving, left behind: its orch session is gone (`orch down` stops it)" in lines[2]
    assert [age_text(s) for s in (None, 5, 3675, 90000)] == ["?", "5s", "1h01m", "1d01h"]
    assert launch_started("ns:attach-without-stamp") is None


def test_status_profiles_come_from_the_database_and_never_fail(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    assert stored_profiles(db, ["a"]) == {}  # no file
    db.write_text("not a database")
    assert stored_profiles(db, ["a"]) is None  # it cannot say
    db.unlink()
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE launches (launch_id TEXT, profile TEXT)")
    conn.executemany("INSERT INTO launches VALUES (?, ?)", [("a", "baseline"), ("b", "eagle3")])
    conn.commit()
    conn.close()
    assert stored_profiles(db, ["a", "c"]) == {"a": "baseline"}


def test_status_of_a_live_launch(sim_profiles: SimProfiles, capsys: Capsys, tmp_path: Path) -> None:
    from orchestrator.config.profile import load
    from orchestrator.hosts.local import LocalHost
    from orchestrator.launch import single

    prof = load(str(sim_profiles()["baseline"]))
    launched = single.launch(LocalHost(), prof, simulate=True, namespace=NAMESPACE)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until the simulator listens on its port
            assert main(["status", "--db", str(tmp_path / "none.db")]) == 0
            out = capsys.readouterr().out
            if f" {prof.port} " in out:
                break
            time.sleep(0.2)
        lines = [line for line in out.splitlines() if launched.launch_id in line]
        assert len(lines) == 1, out  # the workers of the launch are not listed one by one
        # The launch names its profile itself (ORCH_PROFILE), although this store never recorded it.
        assert lines[0].split()[:4] == ["baseline", launched.launch_id, str(launched.pid), str(prof.port)]
        assert "-v lists each" in out
        assert main(["status", "-v"]) == 0
        out = capsys.readouterr().out
        assert f"{launched.launch_id}  PID {launched.pid} (pgid {launched.pgid}) ports {prof.port}" in out
    finally:
        ops.op_down(NAMESPACE, grace_s=2)


# ---------------------------------------------------------------- retry messages


def test_connect_retries_say_what_is_retried(caplog: pytest.LogCaptureFixture, capsys: Capsys) -> None:
    port = free_port()  # nothing listens there: every attempt is refused
    with caplog.at_level(logging.WARNING, logger="orch.ssh"):
        assert main(["status", "--host", f"nobody@127.0.0.1:{port}"]) == 1
    retries = [r.getMessage() for r in caplog.records if "connecting again" in r.getMessage()]
    assert len(retries) == 2, caplog.text  # three attempts, two waits between them
    assert retries[0].startswith(f"nobody@127.0.0.1:{port}: the SSH connection to nobody@127.0.0.1:{port} failed")
    assert " failed on attempt 1 of 3: connection refused" in retries[0] and "on attempt 2 of 3: " in retries[1]
    assert "cannot connect to" in capsys.readouterr().err

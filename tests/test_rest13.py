"""Issue 13 section 4, the rest: `orch status` per launch, single-arm reports, block numbering, completion."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator import hostside
from orchestrator.cli import main
from orchestrator.cli.launches import age_text, launch_started, stored_profiles, summarize, table
from tests.conftest import NAMESPACE, REPO, free_port

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
    from orchestrator import server
    from orchestrator.hosts.local import LocalHost
    from orchestrator.profile import load

    prof = load(str(sim_profiles()["baseline"]))
    launched = server.launch(LocalHost(), prof, simulate=True, namespace=NAMESPACE)
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
        hostside.op_down(NAMESPACE, grace_s=2)


# ---------------------------------------------------------------- single-arm reports, block numbers


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


# ---------------------------------------------------------------- shell completion


def _complete(words: str, cwd: Path) -> list[str]:
    """What bash completion offers for the words (click's bash_complete protocol: 'type,value' lines)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "_ORCH_COMPLETE": "bash_complete", "COMP_WORDS": words}
    env["COMP_CWORD"] = str(len(words.split()) - (0 if words.endswith(" ") else 1))
    proc = subprocess.run([sys.executable, "-m", "orchestrator"], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return proc.stdout.splitlines()


def test_completion_of_experiment_ids_and_profile_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "r.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE experiments (id TEXT, created_at REAL, status TEXT, arms_json TEXT)")
    rows = [("20260101-1-aaa", 1.0, "complete", '["baseline", "eagle3"]'), ("20260102-2-bbb", 2.0, "failed", "[]")]
    conn.executemany("INSERT INTO experiments VALUES (?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()
    newest_first = ["plain,last", "plain,20260102-2-bbb", "plain,20260101-1-aaa"]
    assert _complete(f"orch show --db {db} ", tmp_path) == newest_first
    assert _complete(f"orch export --db {db} 20260101", tmp_path) == ["plain,20260101-1-aaa"]
    assert _complete(f"orch report --db {db} l", tmp_path) == ["plain,last"]
    assert _complete(f"orch show --db {db} ./res", tmp_path) == ["file,./res"]  # a bundle file
    assert _complete(f"orch show --db {tmp_path / 'missing.db'} x", tmp_path) == ["file,x"]  # never an error
    (tmp_path / "broken.db").write_text("not sqlite")
    assert _complete(f"orch show --db {tmp_path / 'broken.db'} ", tmp_path) == ["plain,last"]

    import click

    from orchestrator.cli.complete import profile_names

    monkeypatch.chdir(REPO)
    ctx = click.Context(click.Command("x"))
    names = [item.value for item in profile_names(ctx, click.Argument(["p"]), "eagle3")]
    assert names == ["eagle3-2step", "eagle3-3step"]
    assert profile_names(ctx, click.Argument(["p"]), "zz-none") == []

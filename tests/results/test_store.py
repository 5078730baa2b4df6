"""The results store: each run visible the moment it is written, and files it must not open refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from orchestrator.errors import StoreError
from orchestrator.results.schema import SCHEMA_VERSION
from orchestrator.results.store import Store


def _run(i: int) -> dict[str, object]:
    return {
        "index": i,
        "warmup": False,
        "tokens": 2048,
        "seconds": 24.9,
        "tok_s": 82.2,
        "prompt_tokens": 30,
        "ttft_s": 0.05,
        "spec_accept_length": None,
        "spec_verify_ct": None,
        "valid": True,
        "invalid_reason": None,
    }


def test_store_roundtrip_and_each_run_visible_immediately(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    store = Store(db)
    store.create_experiment("e1", kind="ab", simulated=True, host="local", arms=["a"], config={}, orch_version="t")
    store.add_launch(
        "l1", experiment_id="e1", arm_index=0, profile="a", profile_dict={}, argv=["x"], env={}, pid=1, started_at=0.0
    )
    store.add_run("l1", _run(0))
    # A second connection (another process, a crash) sees the run without any close or flush.
    other = sqlite3.connect(db)
    assert other.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1
    assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.update_launch("l1", status="complete", env_report_json={"ok": True})
    store.finish_experiment("e1", "complete")
    assert store.experiment("e1")["status"] == "complete"  # type: ignore[index]
    assert store.launches("e1")[0]["env_report_json"] == '{"ok": true}'
    assert [r["idx"] for r in store.runs("l1")] == [0]
    with pytest.raises(StoreError, match="cannot update launch fields"):
        store.update_launch("l1", pid=3)
    store.close()
    Store(db).close()  # reopening an up-to-date file migrates nothing


def test_store_refuses_newer_schema_and_garbage(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    c = sqlite3.connect(db)
    c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    c.close()
    with pytest.raises(StoreError, match="newer than this orch understands"):
        Store(db)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match=r"junk\.db is not an SQLite database"):
        Store(junk)


def test_a_store_before_open_loop_keeps_its_runs_and_takes_rate_levels(tmp_path: Path) -> None:
    """Schema 9 keys runs and requests by rate too (0 for closed loop): an older file's rows survive the rebuild, and
    two rates' runs of one launch no longer collide."""
    from orchestrator.results.run import RunResult
    from orchestrator.results.schema import MIGRATIONS

    db = tmp_path / "old.db"
    c = sqlite3.connect(db)
    for migration in MIGRATIONS[:8]:
        c.executescript(migration)
    c.execute("PRAGMA user_version = 8")
    c.execute(
        "INSERT INTO experiments (id, kind, created_at, status, simulated, host, arms_json, config_json, orch_version)"
        " VALUES ('e1', 'ab', 0, 'complete', 1, 'local', '[\"a\"]', '{}', 't')"
    )
    c.execute(
        "INSERT INTO launches (launch_id, experiment_id, arm_index, profile, profile_json, argv_json, env_json,"
        " started_at, status) VALUES ('l1', 'e1', 0, 'a', '{}', '[]', '{}', 0, 'complete')"
    )
    c.execute(
        "INSERT INTO runs (launch_id, idx, warmup, concurrency, tokens, seconds, tok_s, prompt_tokens, valid,"
        " finished_at, metrics_json) VALUES ('l1', 0, 0, 4, 100, 1.0, 50.0, 10, 1, 0, '{}')"
    )
    c.execute(
        "INSERT INTO requests (launch_id, run_warmup, run_concurrency, run_idx, idx, tokens, arrivals_json)"
        " VALUES ('l1', 0, 4, 0, 0, 25, '[0.1]')"
    )
    c.commit()
    c.close()
    store = Store(db)
    [row] = store.runs("l1")
    assert row["rate"] == 0 and row["concurrency"] == 4 and row["tok_s"] == 50.0
    run = RunResult.from_row(row)
    assert run.rate is None and run.level == 4
    [req] = store.requests("l1")
    assert req["run_rate"] == 0 and req["arrivals_json"] == "[0.1]" and req["scheduled_s"] is None
    for rate in (2.0, 8.0):  # two open-loop levels, run 0 of each: one key each
        store.add_run("l1", {**_run(0), "concurrency": 0, "rate": rate, "per_request": [{"index": 0, "tokens": 5}]})
    levels = [RunResult.from_row(r).level for r in store.runs("l1")]
    assert levels == [4, 2.0, 8.0] and [type(v).__name__ for v in levels] == ["int", "Rate", "Rate"]
    store.close()

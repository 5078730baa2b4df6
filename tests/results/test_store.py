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


# ---------------------------------------------------------------- one launch per slot, one owner per resume


def _experiment(store: Store, exp_id: str = "e1") -> None:
    store.create_experiment(exp_id, kind="ab", simulated=True, host="h", arms=["a", "b"], config={}, orch_version="t")


def _launch(store: Store, launch_id: str, *, block: int = 0, arm: int = 0, exp_id: str = "e1") -> None:
    store.add_launch(launch_id, experiment_id=exp_id, arm_index=arm, block=block, profile="ab"[arm], profile_dict={},
                     argv=[], env={}, pid=1, started_at=0.0)  # fmt: skip


def test_a_slot_holds_one_launch_that_counts(tmp_path: Path) -> None:
    """A second running or complete launch of one block's arm cannot be written (two sessions running one
    experiment would have it counted twice); a launch cut short does not hold its slot, so a resume re-runs it."""
    store = Store(tmp_path / "r.db")
    _experiment(store)
    _launch(store, "l1")
    with pytest.raises(StoreError, match=r"experiment e1 already has a launch of arm 1 in block 1 running or complete"):
        _launch(store, "l2")
    store.update_launch("l1", status="complete")
    with pytest.raises(StoreError, match="so that no launch is counted twice"):
        _launch(store, "l2")
    _launch(store, "l3", arm=1)  # another arm, another block: their own slots
    _launch(store, "l4", block=1)
    store.update_launch("l3", status="interrupted")
    _launch(store, "l5", arm=1)  # the cut-short launch stays stored; its slot runs again
    assert [(r["launch_id"], r["status"]) for r in store.launches("e1")] == [
        ("l1", "complete"), ("l3", "interrupted"), ("l4", "running"), ("l5", "running"),
    ]  # fmt: skip
    store.close()


def test_duplicate_launches_of_an_older_store_are_kept_marked_and_counted_once(tmp_path: Path) -> None:
    """Schema 10 makes a slot's counted launch unique. A store where two sessions ran one experiment at once keeps
    every launch; the first complete one of a slot stands, the rest are `duplicate`: stored, not in the statistics."""
    from orchestrator.results.load import stored_launches
    from orchestrator.results.schema import MIGRATIONS

    db = tmp_path / "old.db"
    c = sqlite3.connect(db)
    for migration in MIGRATIONS[:9]:
        c.executescript(migration)
    c.execute("PRAGMA user_version = 9")
    c.execute(
        "INSERT INTO experiments (id, kind, created_at, status, simulated, host, arms_json, config_json, orch_version)"
        " VALUES ('e1', 'ab', 0, 'complete', 1, 'h', '[\"a\", \"b\"]', '{}', 't')"
    )
    rows = [  # (launch, block, arm, status), in the order two sessions recorded them
        ("a0", 0, 0, "complete"), ("b0", 0, 0, "complete"),  # both sessions ran block 1's arm 1
        ("a1", 0, 1, "running"), ("b1", 0, 1, "complete"),  # one was killed mid-launch (never reaped)
        ("a2", 1, 0, "failed"), ("b2", 1, 0, "complete"),  # a failed launch and its re-run: no duplicate
        ("a3", 1, 1, "complete"),
    ]  # fmt: skip
    for launch_id, block, arm, status in rows:
        c.execute(
            "INSERT INTO launches (launch_id, experiment_id, arm_index, block, position, profile, profile_json,"
            " argv_json, env_json, started_at, status) VALUES (?, 'e1', ?, ?, ?, 'a', '{}', '[]', '{}', 0, ?)",
            (launch_id, arm, block, arm, status),
        )
    c.commit()
    c.close()
    store = Store(db)
    status = {r["launch_id"]: r["status"] for r in store.launches("e1")}
    assert status == {
        "a0": "complete", "b0": "duplicate", "a1": "duplicate", "b1": "complete", "a2": "failed", "b2": "complete",
        "a3": "complete",
    }  # fmt: skip
    errors = {r["launch_id"]: r["error"] for r in store.launches("e1")}
    assert "a second orch session ran this launch" in errors["b0"] and errors["a0"] is None
    counted, cut = stored_launches(store, "e1")
    assert sorted(la.launch_id for la in counted) == ["a0", "a3", "b1", "b2"]
    assert sorted(c.status for c in cut) == ["duplicate", "duplicate", "failed"]
    with pytest.raises(StoreError, match="already has a launch of arm 1 in block 1"):
        _launch(store, "c0")
    store.close()


def test_imported_duplicate_launches_are_kept_as_the_migration_keeps_them(tmp_path: Path) -> None:
    """A bundle exported by an older orch from such a store imports (never a raw UNIQUE error), one launch counted."""
    store = Store(tmp_path / "r.db")
    exp = {"id": "e1", "kind": "ab", "created_at": 0.0, "status": "complete", "simulated": 1, "host": "h",
           "arms_json": '["a"]', "config_json": "{}", "orch_version": "t"}  # fmt: skip
    launch = {"experiment_id": "e1", "arm_index": 0, "block": 0, "position": 0, "profile": "a", "profile_json": "{}",
              "argv_json": "[]", "env_json": "{}", "started_at": 0.0}  # fmt: skip
    store.import_experiment(
        exp,
        [{**launch, "launch_id": "x", "status": "running"}, {**launch, "launch_id": "y", "status": "complete"},
         {**launch, "launch_id": "z", "status": "complete"}],
        [],
        [],
    )  # fmt: skip
    assert [(r["launch_id"], r["status"]) for r in store.launches("e1")] == [
        ("x", "duplicate"), ("y", "complete"), ("z", "duplicate"),
    ]  # fmt: skip
    store.close()


def test_of_two_sessions_resuming_one_experiment_only_one_takes_it_over(tmp_path: Path) -> None:
    """Both read the experiment interrupted; the takeover is one UPDATE from the state each read, so the second
    finds it taken and runs nothing. The winner's takeover also settles launches its gone owner left running."""
    db = tmp_path / "r.db"
    store = Store(db)
    _experiment(store)
    _launch(store, "l1")
    store.finish_experiment("e1", "interrupted", "interrupted by the user")
    first, second = Store(db), Store(db)
    seen_first, seen_second = first.experiment("e1"), second.experiment("e1")
    assert seen_first is not None and seen_second is not None and seen_second["status"] == "interrupted"
    first.reopen_experiment("e1", seen_first)
    with pytest.raises(StoreError, match=r"experiment e1 was taken over by another orch session .*it is running now"):
        second.reopen_experiment("e1", seen_second)
    now = store.experiment("e1")
    assert now is not None and now["status"] == "running" and now["error"] is None
    assert [r["status"] for r in store.launches("e1")] == ["interrupted"]  # its slot may run again
    for s in (store, first, second):
        s.close()


def test_last_is_the_experiment_recorded_last_whatever_the_clock_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An experiment recorded while the clock was a year ahead is not `last` (nor listed first) once a later one is
    recorded: newest first is the store's own order, not created_at."""
    import time

    from orchestrator.cli.complete import stored_ids

    db = tmp_path / "r.db"
    store = Store(db)
    real = time.time
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: real() + 365 * 86400)
        _experiment(store, "20271204-000000-future")
    _experiment(store, "20261204-000000-now")
    assert store.find_experiment("last")["id"] == "20261204-000000-now"
    assert [e["id"] for e in store.experiments()] == ["20261204-000000-now", "20271204-000000-future"]
    with pytest.raises(StoreError, match=r"newest first: 20261204-000000-now, 20271204-000000-future"):
        store.find_experiment("20")
    assert [i for i, _ in stored_ids(str(db))] == ["20261204-000000-now", "20271204-000000-future"]  # completion
    store.close()

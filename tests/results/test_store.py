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

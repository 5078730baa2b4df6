"""Pure statistics on known data, and the SQLite store's versioning and write-as-you-go behaviour."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from orchestrator.errors import StoreError
from orchestrator.results.schema import SCHEMA_VERSION
from orchestrator.results.store import Store
from orchestrator.stats.estimates import ratio, summarize


def test_summarize_known_values() -> None:
    s = summarize([82.1, 82.3, 82.2, 82.3, 82.1])
    assert s.n == 5
    assert s.mean == pytest.approx(82.2)
    assert s.median == pytest.approx(82.2)
    assert (s.min, s.max) == (82.1, 82.3)
    assert s.stdev == pytest.approx(0.1)
    assert s.cv == pytest.approx(0.1 / 82.2)
    one = summarize([5.0])
    assert one.stdev == 0.0 and one.cv == 0.0
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    with pytest.raises(ValueError, match="NaN"):
        summarize([1.0, float("nan")])


def test_ratio() -> None:
    assert ratio(60.0, 82.2) == pytest.approx(0.7299, abs=1e-4)
    with pytest.raises(ValueError):
        ratio(1.0, 0.0)


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


# ------------------------------------------------------------------ speculative decoding arithmetic


def test_chain_model_and_its_inverse() -> None:
    from orchestrator.common.acceptance import alpha_for_accept_length, chain_accept_length

    assert chain_accept_length(0.0, 3) == 1.0  # only the bonus token
    assert chain_accept_length(1.0, 3) == 4.0
    assert chain_accept_length(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    for alpha in (0.1, 0.5436890126920764, 0.9):
        assert alpha_for_accept_length(chain_accept_length(alpha, 3), 3) == pytest.approx(alpha, abs=1e-9)
    assert alpha_for_accept_length(4.5, 3) is None and alpha_for_accept_length(0.5, 3) is None
    with pytest.raises(ValueError):
        chain_accept_length(1.5, 3)


def test_breakeven_reproduces_the_seed() -> None:
    from orchestrator.stats.estimates import breakeven, spec_from_run

    be = breakeven(82.2, 30.0, 3, target_tps=150)
    assert be.baseline_token_ms == pytest.approx(12.165, abs=1e-3)
    assert be.breakeven_tau == pytest.approx(2.466, abs=1e-3)  # the seed's 30 / 12.2 ≈ 2.46
    assert be.breakeven_alpha is not None and 0.6 < be.breakeven_alpha < 0.7
    assert be.target_tau == pytest.approx(4.5) and be.target_alpha is None  # > k + 1 = 4: not reachable
    # measured: 60 tok/s at accept length 2.0 means a 33.3 ms cycle, so break-even rises to 2.74
    run = spec_from_run(82.2, 60.0, 2.0, 3)
    assert run.cycle_ms == pytest.approx(33.33, abs=0.01) and run.breakeven_tau == pytest.approx(2.74, abs=0.01)
    assert run.measured_alpha == pytest.approx(0.5437, abs=1e-3)


def test_breakeven_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    assert main(["breakeven", "--baseline-tps", "82.2", "--cycle-ms", "30", "--steps", "3", "--target-tps", "150"]) == 0
    out = capsys.readouterr().out
    assert "break-even accept length: 30.0 / 12.17 = 2.466 tokens per cycle" in out
    assert "for 150 tok/s: accept length 4.50; NOT reachable with 3 draft steps" in out
    assert main(["breakeven", "--baseline-tps", "0", "--cycle-ms", "30", "--steps", "3"]) == 2

"""`orch nightly` end to end on the simulator: nights of noise, a real slowdown, an environment change, a failing
item, the deadline, an overlapping night and Ctrl-C, each with its exit code; then `orch history`."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.agent import lock as hostlock
from orchestrator.hosts.lock import host_lock_path, night_lock_path
from tests.conftest import FAST_SIM, NAMESPACE, WriteProfile, free_port
from tests.faults.support import assert_nothing_left, assert_plain, run, start, stored

DEFAULTS: dict[str, Any] = {
    "host": "local",
    "sim": True,
    "timeout": "90s",
    "gpu_wait": 0,
    "grace": 2,
    "workload": {"runs": 2, "warmup": 0, "max_tokens": 48, "min_run_s": 0},
}


def sim_profile(write_profile: WriteProfile, name: str, **knobs: Any) -> Path:
    return write_profile(
        name, engine="sglang", model_path="/models/m", tp_size=1, port=free_port(), ready_timeout_s=60,
        sim={**FAST_SIM, "launch_noise": 0.003, **knobs},
    )  # fmt: skip


def write_suite(where: Path, items: list[dict[str, Any]], **top: Any) -> Path:
    path = where / "suite.yaml"
    data = {"suite": "e2e", "deadline": "10m", "wait": "5s", "min_history": 3, "defaults": DEFAULTS, **top}
    path.write_text(yaml.safe_dump({**data, "items": items}, sort_keys=False))
    return path


def night(suite: Path, db: Path, date: str, *extra: str) -> tuple[int, str, str]:
    out = run("nightly", str(suite), "--db", str(db), "--now", f"{date}T02:00", *extra, cwd=suite.parent, timeout=300)
    assert_plain(out.text)
    return out.rc, out.out, out.err


@pytest.mark.slow
def test_nights_of_noise_a_slowdown_an_environment_change_and_a_failing_item(
    write_profile: WriteProfile, tmp_path: Path
) -> None:
    slow = tmp_path / "slowdown"
    sim_profile(write_profile, "check", slowdown_file=str(slow))
    sim_profile(write_profile, "broken", fault="exit-during-load")
    suite = write_suite(
        tmp_path, [{"name": "broken", "bench": "broken"}, {"name": "check", "bench": "check", "threshold": "3%"}]
    )
    db = tmp_path / "nightly.db"

    # Three nights build the history; the fourth is judged against it. Noise raises nothing.
    for day in (1, 2, 3):
        rc, out, _ = night(suite, db, f"2026-11-0{day}", "--only", "check")
        assert rc == 0 and "building history `check`" in out and "SIMULATED" in out, out
    rc, out, err = night(suite, db, "2026-11-04", "--only", "check")
    assert rc == 0 and "- ok `check`" in out, out + err

    # A 6 % slowdown the fingerprint cannot see (a degraded box), with a failing item before it: the failure is
    # reported, the rest still runs, the slowdown is confirmed by a re-run and reported. Exit 3.
    slow.write_text("1.06")
    rc, out, err = night(suite, db, "2026-11-05")
    assert rc == 3, out + err
    assert "**FAILED** `broken`" in out and "**REGRESSION** `check`" in out, out
    assert "confirmed by a re-run" in out and "check tok/s" in out, out
    line = next(x for x in out.splitlines() if "REGRESSION" in x and "`check`" in x)
    assert "threshold 3 %" in line and any(f"-{d}." in line for d in (5, 6, 7)), line

    # A new engine version, and slower still: an environment change, never a regression. Exit 0.
    sim_profile(write_profile, "check", slowdown_file=str(slow), version="0.5.10")
    slow.write_text("1.10")
    rc, out, err = night(suite, db, "2026-11-06", "--only", "check", "--json")
    assert rc == 0, out + err
    doc = json.loads(out)
    (item,) = doc["items"]
    assert item["status"] == "environment" and doc["simulated"] is True and doc["exit_code"] == 0
    (series,) = [s for s in item["series"] if s["series"] == "check:tok_s"]
    assert series["status"] == "environment" and "engine version: 0.5.9 -> 0.5.10" in series["note"]
    # Slower than the level before the upgrade (the 6 %-slow night is part of what it is measured against); only the
    # sign is asserted, as a loaded CI machine moves one simulated night by a couple of percent (once -1.9 %).
    assert series["change"] < 0

    # Only the failing item: a harness error. Exit 1.
    rc, out, err = night(suite, db, "2026-11-07", "--only", "broken")
    assert rc == 1 and "**FAILED** `broken`" in out, out + err

    nights = stored(db, "SELECT status, exit_code FROM nights ORDER BY night_at")
    assert [n[1] for n in nights] == [0, 0, 0, 0, 3, 0, 1] and {n[0] for n in nights} == {"complete"}
    # Night 5 ran the check twice (the confirmation), both stored as experiments of that night.
    (exps,) = stored(db, "SELECT experiments_json FROM night_items WHERE item = 'check' AND status = 'complete'"
                         " AND night_id = (SELECT id FROM nights ORDER BY night_at LIMIT 1 OFFSET 4)")  # fmt: skip
    assert len(json.loads(str(exps[0]))) == 2

    hist = run("history", "check", "--db", str(db), "--metric", "tok_s", cwd=tmp_path)
    assert hist.rc == 0, hist.text
    lines = hist.out.splitlines()
    assert "SIMULATED" in lines[0] and any("check on local — check tok/s (threshold 3 %" in x for x in lines)
    rows = [x for x in lines if x.lstrip().startswith("2026-11-")]
    assert len(rows) == 6  # the night with only the broken item has no value of this series
    assert "building history: night 1 of this environment, verdicts from night 4" in rows[0] and "ok" in rows[3]
    assert "REGRESSION: confirmed by a re-run" in rows[4] and "environment change: engine version" in rows[5]
    assert "◆ change point (regression)" in rows[4] and "◆ environment step" in rows[5]
    doc = json.loads(run("history", "check", "--db", str(db), "--json", cwd=tmp_path).out)
    (series_doc,) = [s for s in doc["series"] if s["series"] == "check:tok_s"]
    assert [n["status"] for n in series_doc["nights"]][3:] == ["ok", "regression", "environment"]
    assert [s["kind"] for s in series_doc["steps"]] == ["regression", "environment"]
    # Every night of this item failed: history lists the nights and why, one line each.
    broken = run("history", "broken", "--db", str(db), cwd=tmp_path)
    assert broken.rc == 0 and "no night measured anything" in broken.out, broken.text
    failed = [x for x in broken.out.splitlines() if "failed: broken: server process" in x]
    assert len(failed) == 2 and all(len(x) < 160 for x in failed), broken.out
    nope = run("history", "nope", "--db", str(db), cwd=tmp_path)
    assert nope.rc == 2 and "items with history: broken, check" in nope.err, nope.text
    assert_nothing_left()


def test_the_deadline_stops_the_night_cleanly(write_profile: WriteProfile, tmp_path: Path) -> None:
    sim_profile(write_profile, "hang", fault="hang-during-load")
    sim_profile(write_profile, "fine")
    suite = write_suite(
        tmp_path, [{"name": "hangs", "bench": "hang"}, {"name": "after", "bench": "fine"}], deadline="4s"
    )
    db = tmp_path / "n.db"
    rc, out, err = night(suite, db, "2026-11-01", "--markdown-out", str(tmp_path / "night.md"))
    assert rc == 1, out + err
    assert "**TIMED OUT** `hangs`" in out and "stopped by the night's deadline" in out, out
    assert "**SKIPPED** `after`" in out and "stopped at the deadline" in out, out
    assert (tmp_path / "night.md").read_text() == out
    assert stored(db, "SELECT status, exit_code FROM nights") == [("deadline", 1)]
    assert stored(db, "SELECT status FROM experiments") == [("interrupted",)]
    assert_nothing_left()


def test_an_item_stopped_at_its_timeout_leaves_the_next_items_timeout_working(
    write_profile: WriteProfile, tmp_path: Path
) -> None:
    """Each item's timer stops it with the night's own signal; the first stop taken must not make orch deaf to the
    next (orch's handler takes one stop and only counts the signals after it, until the night goes on)."""
    sim_profile(write_profile, "hang", fault="hang-during-load")
    items = [{"name": "first", "bench": "hang", "timeout": "3s"}, {"name": "second", "bench": "hang", "timeout": "3s"}]
    suite = write_suite(tmp_path, items)
    db = tmp_path / "n.db"
    rc, out, err = night(suite, db, "2026-11-01")
    assert rc == 1, out + err
    assert "**TIMED OUT** `first`" in out and "**TIMED OUT** `second`" in out, out
    assert out.count("stopped by the item's timeout (3s)") == 2, out
    assert stored(db, "SELECT item, status FROM night_items ORDER BY item") == [
        ("first", "timeout"),
        ("second", "timeout"),
    ]
    assert_nothing_left()


def test_a_second_night_waits_then_gives_up(write_profile: WriteProfile, tmp_path: Path) -> None:
    sim_profile(write_profile, "fine")
    suite = write_suite(tmp_path, [{"name": "a", "bench": "fine"}], wait="1s")
    holder = {"suite": "the-first-night", "pid": 4242, "user": "cron", "machine": "box", "since": "02:00"}
    lock = night_lock_path(NAMESPACE)
    assert hostlock.op_lock(lock, holder)["acquired"]
    try:
        rc, out, err = night(suite, tmp_path / "n.db", "2026-11-01", "--markdown-out", str(tmp_path / "night.md"))
    finally:
        hostlock.op_unlock(lock)
    assert rc == 1, out + err
    assert "another night still runs on this machine (suite the-first-night" in err and "after waiting 1s" in err
    # Said where cron mails and where a webhook script posts from, like any night: a lost night is not silent.
    assert "**NOT RUN**: another night still runs" in out and (tmp_path / "night.md").read_text() == out
    assert not (tmp_path / "n.db").exists() or stored(tmp_path / "n.db", "SELECT count(*) FROM nights") == [(0,)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_night_tears_down_and_says_what_ran(
    write_profile: WriteProfile, tmp_path: Path, sig: signal.Signals
) -> None:
    sim_profile(write_profile, "slow", load_s=30)
    suite = write_suite(tmp_path, [{"name": "slow", "bench": "slow"}, {"name": "next", "bench": "slow"}])
    db = tmp_path / "n.db"
    proc = start("nightly", str(suite), "--db", str(db), cwd=tmp_path)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "waiting for readiness" in line or "launch 1/1" in line:
            break
    proc.send_signal(sig)
    rest = proc.communicate(timeout=60)[0]
    text = "".join(seen) + rest
    assert proc.returncode == 130, text
    assert "**INTERRUPTED** `slow`" in text and "**SKIPPED** `next`" in text, text
    assert stored(db, "SELECT status, exit_code FROM nights") == [("interrupted", 130)]
    assert_nothing_left()


def test_a_busy_host_fails_the_item_saying_how_a_night_queues(write_profile: WriteProfile, tmp_path: Path) -> None:
    """Another session holds the host: the item fails (after the suite's wait), told in a night's terms (its
    `wait:`), not the `--wait` of the command line, and the night goes on."""
    sim_profile(write_profile, "fine")
    suite = write_suite(tmp_path, [{"name": "a", "bench": "fine"}], wait="1s")
    holder = {"session": "another", "pid": os.getpid(), "user": "me", "machine": "box", "since": "02:00"}
    lock = host_lock_path(NAMESPACE)
    assert hostlock.op_lock(lock, holder)["acquired"]
    try:
        rc, out, err = night(suite, tmp_path / "n.db", "2026-11-01")
    finally:
        hostlock.op_unlock(lock)
    assert rc == 1, out + err
    assert "local is busy: another orch session holds it" in out, out
    assert "The suite's wait: sets how long a night queues. (The lock goes away" in out and "--wait" not in out, out
    assert stored(tmp_path / "n.db", "SELECT item, status FROM night_items") == [("a", "failed")]

"""orch started with SIGINT ignored (`orch nightly &` in a script, some cron wrappers): the night's own timers still
stop an item, and SIGTERM still stops `orch nightly` and `orch ab` cleanly (exit 130, nothing left running)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import WriteProfile
from tests.faults.support import assert_nothing_left, orch_env, stored
from tests.nightly.test_nightly import sim_profile, write_suite


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:  # a failed assertion must not leave an orch running
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _start(procs: list[subprocess.Popen[str]], *args: str, cwd: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args], cwd=cwd, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=orch_env(), stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    procs.append(proc)
    return proc


def _until(proc: subprocess.Popen[str], *marks: str) -> str:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if any(m in line for m in marks):
            break
    return "".join(seen)


def test_the_deadline_stops_a_night_started_with_sigint_ignored(
    write_profile: WriteProfile, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    # The night's timers stop an item the way Ctrl-C would; a self-sent SIGINT would be lost here.
    sim_profile(write_profile, "hang", fault="hang-during-load")
    suite = write_suite(tmp_path, [{"name": "hangs", "bench": "hang"}], deadline="3s")
    db = tmp_path / "n.db"
    proc = _start(started, "nightly", str(suite), "--db", str(db), cwd=tmp_path)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 1, out
    assert "**TIMED OUT** `hangs`" in out and "stopped by the night's deadline" in out, out
    assert stored(db, "SELECT status, exit_code FROM nights") == [("deadline", 1)]
    assert_nothing_left()


def test_sigterm_stops_a_night_started_with_sigint_ignored(
    write_profile: WriteProfile, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    sim_profile(write_profile, "slow", load_s=30)
    suite = write_suite(tmp_path, [{"name": "slow", "bench": "slow"}])
    db = tmp_path / "n.db"
    proc = _start(started, "nightly", str(suite), "--db", str(db), cwd=tmp_path)
    seen = _until(proc, "waiting for readiness", "launch 1/1")
    proc.send_signal(signal.SIGTERM)
    text = seen + proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, text
    assert "**INTERRUPTED** `slow`" in text and "Traceback" not in text, text
    assert stored(db, "SELECT status, exit_code FROM nights") == [("interrupted", 130)]
    assert_nothing_left()


def test_sigterm_stops_an_ab_started_with_sigint_ignored(
    write_profile: WriteProfile, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    for name in ("a", "b"):
        sim_profile(write_profile, name)
    db = tmp_path / "r.db"
    args = ("--sim", "--runs", "50", "--max-tokens", "40", "--warmup", "0", "--db", str(db))
    proc = _start(started, "ab", "a", "b", *args, cwd=tmp_path)
    seen = _until(proc, "Run 2/50")
    proc.send_signal(signal.SIGTERM)
    text = seen + proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, text
    assert "Interrupted" in text and "Traceback" not in text, text
    assert stored(db, "SELECT status FROM experiments") == [("interrupted",)]
    assert_nothing_left()

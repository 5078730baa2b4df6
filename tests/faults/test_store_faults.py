"""The results store under faults: a killed orch, foreign, corrupt, newer, read-only, locked and full files."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from orchestrator.agent import ops, processes
from orchestrator.errors import StoreError
from orchestrator.results.schema import SCHEMA_VERSION
from orchestrator.results.store import Store
from tests.conftest import NAMESPACE, StepClock, run_orch, wait_for_line

SimProfiles = Callable[..., dict[str, Path]]
FAST = ("--max-tokens", "16", "--warmup", "0", "--grace", "2", "--min-run-s", "0")


def orch(*args: str, cwd: Path, timeout: float = 90) -> tuple[int, str, str]:
    proc = run_orch(*args, cwd=cwd)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def assert_clean_error(code: int, err: str, *needles: str) -> None:
    """One `Error:` line naming what is wrong; never a traceback, never an unexpected error."""
    assert code == 1, err
    assert "Error:" in err and "Traceback" not in err and "unexpected" not in err, err
    for needle in needles:
        assert needle in err, err


def port_of(tmp_path: Path) -> int:
    return int(yaml.safe_load((tmp_path / "profiles" / "base.yaml").read_text())["port"])


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def make_experiment(db: Path, exp_id: str = "e1", owner: dict[str, object] | None = None) -> None:
    """A stored experiment with one running launch; its owner replaced by `owner` when given."""
    store = Store(db)
    store.create_experiment(exp_id, kind="ab", simulated=True, host="local", arms=["a"], config={}, orch_version="t")
    store.add_launch(
        f"{exp_id}-l",
        experiment_id=exp_id,
        arm_index=0,
        profile="a",
        profile_dict={},
        argv=[],
        env={},
        pid=1,
        started_at=time.time(),
    )
    store.close()
    if owner is not None:
        c = sqlite3.connect(db)
        with c:
            c.execute("UPDATE experiments SET owner_json = ? WHERE id = ?", (json.dumps(owner), exp_id))
        c.close()


def statuses(db: Path) -> tuple[list[tuple[str, str, str | None]], list[tuple[str, str | None]]]:
    c = sqlite3.connect(db)
    try:
        exps = c.execute("SELECT id, status, error FROM experiments ORDER BY id").fetchall()
        launches = c.execute("SELECT status, error FROM launches ORDER BY launch_id").fetchall()
    finally:
        c.close()
    return exps, launches


def dead_pid() -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(proc.pid).create_time()
    proc.wait()
    return proc.pid, created


# ------------------------------------------------------------------ a killed orch


def test_experiments_of_a_dead_owner_are_reaped_and_no_others(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    pid, created = dead_pid()
    me = psutil.Process()
    make_experiment(db, "dead", {"pid": pid, "create_time": created, "host": socket.gethostname()})
    make_experiment(db, "reused", {"pid": me.pid, "create_time": me.create_time() - 100, "host": socket.gethostname()})
    make_experiment(db, "alive")  # this process: its real owner
    make_experiment(db, "elsewhere", {"pid": pid, "create_time": created, "host": "another-machine"})
    make_experiment(db, "old-orch")
    with sqlite3.connect(db) as c:
        c.execute("UPDATE experiments SET owner_json = NULL WHERE id = 'old-orch'")
    store = Store(db)
    store.close()
    exps, _ = statuses(db)
    by_id = {e[0]: e for e in exps}
    assert by_id["dead"][1] == "interrupted"
    assert by_id["dead"][2] is not None and by_id["dead"][2].startswith(f"orch was killed (PID {pid} is gone)")
    assert by_id["reused"][1] == "interrupted"
    assert by_id["reused"][2] is not None and "now belongs to another process" in by_id["reused"][2]
    for untouched in ("alive", "elsewhere", "old-orch"):
        assert by_id[untouched][1:] == ("running", None), untouched
    c = sqlite3.connect(db)
    launch_status = dict(c.execute("SELECT experiment_id, status FROM launches").fetchall())
    c.close()
    assert launch_status == {
        "dead": "interrupted",
        "reused": "interrupted",
        "alive": "running",
        "elsewhere": "running",
        "old-orch": "running",
    }


def test_a_wall_clock_step_never_reaps_a_live_owners_experiment(tmp_path: Path, stepped_clock: StepClock) -> None:
    """Owners are told apart by start ticks since boot: after the clock steps (psutil's create_time moves with it),
    another session opening the store leaves live owners' experiments running and still reaps a reused PID's."""
    db = tmp_path / "r.db"
    here = socket.gethostname()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        mine = processes.identity(psutil.Process())
        make_experiment(db, "mine")  # this process, as create_experiment records it
        make_experiment(db, "other", {**processes.identity(psutil.Process(other.pid)), "host": here})
        make_experiment(db, "reused", {**mine, "start_ticks": mine["start_ticks"] - 100, "host": here})
        for seconds in (3600.0, -86400.0 * 365):
            stepped_clock(seconds)
            Store(db).close()
            exps, _ = statuses(db)
            by_id = {e[0]: e[1:] for e in exps}
            assert by_id["mine"] == by_id["other"] == ("running", None), by_id
            assert by_id["reused"][0] == "interrupted" and "now belongs to another process" in str(by_id["reused"][1])
    finally:
        other.kill()
        other.wait()
    Store(db).close()
    assert statuses(db)[0][1][1] == "interrupted"  # "other", now really gone


def test_an_owner_of_another_boot_is_reaped_though_its_pid_and_ticks_repeat(tmp_path: Path) -> None:
    """An experiment's owner recorded before a reboot whose PID and start ticks a process of this boot happens to
    have (here: this very process, under another boot id) is gone, and said so; a record without a boot id (an
    older orch) is judged as before."""
    db = tmp_path / "r.db"
    here = socket.gethostname()
    mine = processes.identity(psutil.Process())
    assert "boot_id" in mine  # Linux: the tests' platform
    make_experiment(db, "before-reboot", {**mine, "boot_id": "5a1c0e8e-0000-4000-8000-000000000001", "host": here})
    make_experiment(db, "this-boot", {**mine, "host": here})
    make_experiment(db, "no-boot-id", {**{k: v for k, v in mine.items() if k != "boot_id"}, "host": here})
    Store(db).close()
    exps, _ = statuses(db)
    by_id = {e[0]: e[1:] for e in exps}
    assert by_id["before-reboot"][0] == "interrupted", by_id
    assert "the machine has rebooted since" in str(by_id["before-reboot"][1])
    assert by_id["this-boot"] == by_id["no-boot-id"] == ("running", None), by_id


def test_resume_records_the_new_owner(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    pid, created = dead_pid()
    make_experiment(db, "e", {"pid": pid, "create_time": created, "host": socket.gethostname()})
    store = Store(db)
    seen = store.experiment("e")
    assert seen is not None and seen["status"] == "interrupted"
    store.reopen_experiment("e", seen)
    store.close()
    store = Store(db)  # its owner is alive now: reopening the store must not reap it
    assert store.experiment("e")["status"] == "running"  # type: ignore[index]
    owner = json.loads(store.experiment("e")["owner_json"])  # type: ignore[index]
    assert owner["pid"] == os.getpid()
    store.close()


def test_sigkill_mid_run_leaves_an_interrupted_experiment(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    db = tmp_path / "r.db"
    proc = run_orch("bench", "baseline", "--sim", "--runs", "50", *FAST, "--db", str(db), cwd=tmp_path)
    try:
        wait_for_line(proc, "Run 1/50")
        proc.kill()  # SIGKILL: no finally runs, nothing is recorded
        proc.wait(timeout=30)
        assert statuses(db)[0][0][1] == "running"  # what the file says until someone looks
        code, out, err = orch("list", "--db", str(db), cwd=tmp_path)
        assert code == 0, err
        assert "interrupted" in out and "running" not in out, out
        (exp,), (launch,) = statuses(db)
        assert exp[1] == "interrupted" and f"PID {proc.pid} is gone" in (exp[2] or "")
        assert launch[0] == "interrupted"
        code, out, err = orch("show", "last", "--db", str(db), cwd=tmp_path)
        assert_clean_error(code, err, "experiment interrupted after 0 of 1 launches")
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        code, out, err = orch("down", "--grace", "2", cwd=tmp_path)  # the simulator it left behind
    assert code == 0, err
    assert ops.op_find(NAMESPACE) == []


# ------------------------------------------------------------------ files that are not (our) results databases


def _cli_all_fail(db: Path, tmp_path: Path, *needles: str) -> None:
    """list, show and a bench each give a clean error naming the file, and no server is left running."""
    for args in (("list",), ("show", "last"), ("bench", "baseline", "--sim", "--runs", "2", *FAST)):
        code, _, err = orch(*args, "--db", str(db), cwd=tmp_path)
        assert_clean_error(code, err, str(db), *needles)
    assert ops.op_find(NAMESPACE) == []


def test_foreign_database_with_an_orch_schema_version(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    db = tmp_path / "theirs.db"
    c = sqlite3.connect(db)
    c.executescript("CREATE TABLE experiments (name TEXT); CREATE TABLE notes (x); PRAGMA user_version = 3;")
    c.close()
    before = db.read_bytes()
    _cli_all_fail(db, tmp_path, "is not an orch results database", "missing", "use another --db")
    assert db.read_bytes() == before  # refused before anything was written


def test_foreign_database_without_a_version(tmp_path: Path) -> None:
    db = tmp_path / "theirs.db"
    c = sqlite3.connect(db)
    c.executescript("CREATE TABLE experiments (name TEXT);")
    c.close()
    code, _, err = orch("list", "--db", str(db), cwd=tmp_path)
    assert_clean_error(code, err, "is not an orch results database (it has tables experiments")
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == 0


def test_random_bytes(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    db = tmp_path / "junk.db"
    db.write_bytes(os.urandom(8192))
    _cli_all_fail(db, tmp_path, "is not an SQLite database", "move it aside")


def test_truncated_orch_database(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    store = Store(db)
    store.create_experiment("e1", kind="ab", simulated=True, host="local", arms=["a"], config={}, orch_version="t")
    store.add_launch(
        "l1",
        experiment_id="e1",
        arm_index=0,
        profile="a",
        profile_dict={"x": "y" * 50000},
        argv=[],
        env={},
        pid=1,
        started_at=0.0,
    )
    store.finish_experiment("e1", "complete")
    store.close()
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    for args in (("list",), ("show", "e1")):
        code, _, err = orch(*args, "--db", str(db), cwd=tmp_path)
        assert_clean_error(code, err, str(db), "corrupt")


def test_newer_orch_database(sim_profiles: SimProfiles, tmp_path: Path) -> None:
    sim_profiles()
    db = tmp_path / "new.db"
    c = sqlite3.connect(db)
    c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    c.close()
    _cli_all_fail(db, tmp_path, "newer than this orch understands", "upgrade orch")


# ------------------------------------------------------------------ read-only, locked, full


@pytest.fixture
def immutable() -> Iterator[Callable[[Path], None]]:
    """chattr +i: a file even root cannot write (tests run as root, which ignores chmod)."""
    marked: list[Path] = []

    def mark(path: Path) -> None:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here (needs root and a file system that supports it)")
        marked.append(path)

    yield mark
    for path in marked:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def test_read_only_store_is_readable_and_a_run_is_refused(
    sim_profiles: SimProfiles, tmp_path: Path, immutable: Callable[[Path], None]
) -> None:
    sim_profiles()
    db = tmp_path / "r.db"
    pid, created = dead_pid()
    make_experiment(db, "killed", {"pid": pid, "create_time": created, "host": socket.gethostname()})
    immutable(db)
    code, out, err = orch("list", "--db", str(db), cwd=tmp_path)
    assert code == 0, err
    assert "killed" in out and "interrupted" in out and "running" not in out  # dead, even if the file cannot say so
    code, _, err = orch("show", "killed", "--db", str(db), cwd=tmp_path)
    assert "Traceback" not in err and "unexpected" not in err, err
    code, _, err = orch("bench", "baseline", "--sim", "--runs", "2", *FAST, "--db", str(db), cwd=tmp_path)
    assert_clean_error(code, err, str(db), "read-only", "use another --db")
    assert ops.op_find(NAMESPACE) == [] and port_free(port_of(tmp_path))
    assert statuses(db)[0][0][1] == "running"  # nothing was (or could be) written


def test_locked_store_is_waited_for_then_refused(
    sim_profiles: SimProfiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim_profiles()
    db = tmp_path / "r.db"
    make_experiment(db)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        monkeypatch.setenv("ORCH_DB_BUSY_TIMEOUT_S", "1")
        started = time.monotonic()
        _cli_all_fail(db, tmp_path, "locked by another process", "still busy after 1s")
        assert time.monotonic() - started >= 3  # each command waited for the lock before giving up
    finally:
        holder.kill()
        holder.wait()
    assert port_free(port_of(tmp_path))
    monkeypatch.delenv("ORCH_DB_BUSY_TIMEOUT_S")
    assert orch("list", "--db", str(db), cwd=tmp_path)[0] == 0  # usable again once the other writer is gone


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: a real full disk (ENOSPC → SQLITE_FULL)."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root in a container that allows it)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
    return filler


def test_disk_full_mid_run_keeps_finished_runs_and_tears_down(
    sim_profiles: SimProfiles, tmp_path: Path, small_disk: Path
) -> None:
    sim_profiles()
    db = small_disk / "r.db"
    proc = run_orch("bench", "baseline", "--sim", "--runs", "40", *FAST, "--db", str(db), cwd=tmp_path)
    seen: list[str] = []
    try:
        wait_for_line(proc, "Run 2/40", seen)
        filler = fill(small_disk)
        _, err = proc.communicate(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
    assert_clean_error(proc.returncode, err, str(db), "disk is full", "everything recorded before is kept")
    assert ops.op_find(NAMESPACE) == [] and port_free(port_of(tmp_path))
    filler.unlink()
    store = Store(db)  # writable again: whatever the killed session could not record is settled now
    (exp,) = store.experiments()
    assert exp["status"] in ("failed", "interrupted")
    (launch,) = store.launches(exp["id"])
    assert launch["status"] in ("failed", "interrupted")
    runs = store.runs(launch["launch_id"])
    assert len(runs) >= 2  # every run printed before the disk filled up is stored, whole
    for run in runs:
        assert len([r for r in store.requests(launch["launch_id"]) if r["run_idx"] == run["idx"]]) == run["requests"]
    store.close()


def test_the_first_store_on_a_full_disk_says_so_and_leaves_nothing(
    sim_profiles: SimProfiles, tmp_path: Path, small_disk: Path
) -> None:
    """Creating a results database with 32 KiB free: the schema's first steps fit, the rest does not. orch says it
    cannot create the database because the disk is full (not "while upgrading its schema from version 1 to 2") and
    leaves no partial file; a store that was there before is never touched."""
    sim_profiles()
    kept = small_disk / "kept.db"
    make_experiment(kept)
    filler = fill(small_disk)
    os.truncate(filler, filler.stat().st_size - 32 * 1024)
    before = sorted(p.name for p in small_disk.iterdir())
    db = small_disk / "r.db"
    with pytest.raises(StoreError) as raised:
        Store(db)
    message = str(raised.value)
    assert message.startswith(f"cannot create the results database {db}: the disk is full"), message
    assert "upgrading" not in message and "nothing was left there" in message
    assert sorted(p.name for p in small_disk.iterdir()) == before  # no r.db, no temp file, no journal
    code, _, err = orch("bench", "baseline", "--sim", "--runs", "2", *FAST, "--db", str(db), cwd=tmp_path)
    assert_clean_error(code, err, f"cannot create the results database {db}: the disk is full")
    assert sorted(p.name for p in small_disk.iterdir()) == before
    assert ops.op_find(NAMESPACE) == [] and port_free(port_of(tmp_path))
    store = Store(kept)  # the store that was there: read as it was
    assert [e["id"] for e in store.experiments()] == ["e1"]
    store.close()
    filler.unlink()
    Store(db).close()  # with room again, created whole
    assert statuses(db) == ([], [])

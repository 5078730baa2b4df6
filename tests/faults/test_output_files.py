"""Output files (-o, --html, --markdown-out, bundles): what stands at the path is never blindly replaced."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import files
from orchestrator.cli import main
from orchestrator.results.store import Store, default_path
from tests.conftest import FAST_SIM, REPO, free_port

Captured = pytest.CaptureFixture[str]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny simulated A/B in its own database, and its result bundle."""
    root = tmp_path_factory.mktemp("outputs")
    profile = {"engine": "sglang", "model_path": "/models/m", "tp_size": 1, "port": free_port(), "sim": FAST_SIM}
    (root / "profiles").mkdir()
    (root / "profiles" / "a.yaml").write_text(yaml.safe_dump(profile))
    (root / "profiles" / "b.yaml").write_text(yaml.safe_dump({**profile, "port": free_port()}))
    xdg = {v: str(root / "xdg" / v.lower()) for v in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME")}
    env = {**os.environ, **xdg, "PYTHONPATH": str(REPO)}
    db = root / "results.db"
    args = ("ab", "a", "b", "--sim", "--blocks", "2", "--runs", "2", "--warmup", "0", "--max-tokens", "16")
    args += ("--min-run-s", "0", "--grace", "2", "--gpu-wait", "0", "--db", str(db))
    for cmd in (args, ("export", "last", "--db", str(db), "--format", "bundle", "-o", str(root / "x.orch.json"))):
        done = subprocess.run([sys.executable, "-m", "orchestrator", *cmd], cwd=root, env=env, text=True,
                              capture_output=True, timeout=180, stdin=subprocess.DEVNULL)  # fmt: skip
        assert done.returncode == 0, done.stderr
    return {"db": db, "bundle": root / "x.orch.json"}


def export(stored: dict[str, Path], *args: str) -> int:
    return main(["export", "last", "--db", str(stored["db"]), *args])


def test_a_symlink_at_the_path_is_refused_and_what_it_points_to_untouched(
    stored: dict[str, Path], tmp_path: Path, capsys: Captured
) -> None:
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    link = tmp_path / "out.csv"
    link.symlink_to(victim)
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to(tmp_path / "nowhere.csv")
    for path, fmt in ((link, "csv"), (dangling, "csv"), (link, "bundle"), (link, "json")):
        assert export(stored, "--format", fmt, "-o", str(path)) == 2
        err = capsys.readouterr().err
        assert f"-o {path}: is a symbolic link" in err and "wrote" not in err
        assert path.is_symlink()
    assert victim.read_text() == "keep me\n" and not (tmp_path / "nowhere.csv").exists()
    assert main(["report", str(stored["bundle"]), "--html", str(link)]) == 2  # refused before rendering anything
    assert link.is_symlink() and victim.read_text() == "keep me\n"


def test_a_named_pipe_is_written_through_never_replaced(stored: dict[str, Path], tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert export(stored, "--format", "csv", "-o", str(fifo)) == 0
    finally:
        if reader.is_alive():  # unblock the reader whatever happened; not blocking: it may be past its read already
            with contextlib.suppress(OSError):  # ENXIO: no reader has the pipe open any more
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    rows = got[0].decode().splitlines() if got else []
    assert len(rows) > 1 and all("," in row for row in rows)  # the whole CSV came through the pipe


def test_a_named_pipe_nobody_reads_is_an_error_not_a_hang(
    stored: dict[str, Path], tmp_path: Path, capsys: Captured, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "READER_WAIT_S", 0.2)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert export(stored, "--format", "csv", "-o", str(fifo)) == 1
    err = capsys.readouterr().err
    assert f"{fifo}: cannot write the export: a named pipe with no reader" in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_character_device_is_written_through_and_stays_a_device(
    stored: dict[str, Path], tmp_path: Path, capsys: Captured
) -> None:
    # A private null device node (root only), never the real /dev/null: a broken orch would replace the device.
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root")
    assert export(stored, "--format", "csv", "-o", str(null)) == 0
    assert f"wrote {null}" in capsys.readouterr().err
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.lstat(null).st_rdev == os.makedev(1, 3)


def test_dash_means_stdout(stored: dict[str, Path], tmp_path: Path, capsys: Captured, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    assert export(stored, "--format", "csv", "-o", "-") == 0
    assert "," in capsys.readouterr().out
    assert export(stored, "--format", "bundle", "-o", "-") == 0
    assert '"content"' in capsys.readouterr().out
    assert not (tmp_path / "-").exists() and not list(tmp_path.iterdir())


def test_the_results_database_is_never_written_over(stored: dict[str, Path], tmp_path: Path, capsys: Captured) -> None:
    db = tmp_path / "copy.db"
    shutil.copy(stored["db"], db)
    before = db.read_bytes()
    for args in (
        ["export", "last", "--db", str(db), "--format", "csv", "-o", str(db)],
        ["export", "last", "--db", str(db), "--format", "bundle", "-o", str(db)],
        ["report", "last", "--db", str(db), "--html", str(db)],
    ):
        assert main(args) == 2
        assert f"{db}: is {db}, which this command reads" in capsys.readouterr().err
    # The default store, and any other SQLite file: an export is never a database.
    default = default_path()
    default.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(stored["db"], default)
    assert main(["export", "last", "--format", "csv", "-o", str(default)]) == 2
    assert main(["export", "last", "--db", str(default), "--format", "json", "-o", str(db)]) == 2
    assert "is a SQLite database" in capsys.readouterr().err
    assert db.read_bytes() == before
    with sqlite3.connect(default) as conn:
        assert conn.execute("SELECT count(*) FROM experiments").fetchone()[0] == 1


def test_another_stores_journal_wal_and_shm_are_never_written_over(
    stored: dict[str, Path], tmp_path: Path, capsys: Captured
) -> None:
    """Another results store in WAL mode, its last commit still only in its -wal: an output onto its -wal, -shm or
    (not yet existing) -journal is refused, naming the option and path, and the store keeps its committed rows."""
    other = tmp_path / "other.db"
    Store(other).close()
    conn = sqlite3.connect(other)  # held open: the -wal and -shm stay, as while another orch writes
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        with conn:
            conn.execute("INSERT INTO meta (key, value) VALUES ('committed', 'in the wal only')")
        wal, shm, journal = (Path(f"{other}{suffix}") for suffix in ("-wal", "-shm", "-journal"))
        before = {p: p.read_bytes() for p in (wal, shm)}
        assert wal.stat().st_size > 0 and not journal.exists()
        for target, says in (
            (wal, "is a SQLite write-ahead log"),
            (shm, f"is the -shm file of the SQLite database {other}"),
            (journal, f"is the -journal file of the SQLite database {other}"),
        ):
            for fmt in ("csv", "json", "bundle"):
                assert export(stored, "--format", fmt, "-o", str(target)) == 2
                assert f"-o {target}: {says}" in capsys.readouterr().err
            assert main(["report", "last", "--db", str(stored["db"]), "--html", str(target)]) == 2
            assert f"--html {target}: {says}" in capsys.readouterr().err
        assert {p: p.read_bytes() for p in (wal, shm)} == before and not journal.exists()
    finally:
        conn.close()
    with sqlite3.connect(other) as check:
        assert check.execute("SELECT value FROM meta WHERE key = 'committed'").fetchall() == [("in the wal only",)]
    # A file merely named like one, with no database beside it, is an ordinary output.
    assert export(stored, "--format", "csv", "-o", str(tmp_path / "notes.db-wal")) == 0


def test_the_input_bundle_is_never_written_over(stored: dict[str, Path], tmp_path: Path, capsys: Captured) -> None:
    bundle = tmp_path / "in.orch.json"
    shutil.copy(stored["bundle"], bundle)
    before = bundle.read_bytes()
    assert main(["export", str(bundle), "--format", "csv", "-o", str(bundle)]) == 2
    assert "which this command reads" in capsys.readouterr().err
    assert bundle.read_bytes() == before


def test_a_regular_file_is_still_replaced_whole(stored: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    out.write_text("old\n")
    assert export(stored, "--format", "csv", "-o", str(out)) == 0
    assert out.read_text().count(",") > 1 and not out.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]  # no temporary file left


def test_nightly_outputs_follow_the_same_rule(tmp_path: Path, capsys: Captured) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "p.yaml").write_text(
        yaml.safe_dump({"engine": "sglang", "model_path": "/m", "tp_size": 1, "port": free_port(), "sim": FAST_SIM})
    )
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"suite": "s", "items": [{"name": "a", "bench": "p", "sim": True}]}))
    victim = tmp_path / "precious.md"
    victim.write_text("keep me\n")
    link = tmp_path / "night.md"
    link.symlink_to(victim)
    assert main(["nightly", str(suite), "--check", "--markdown-out", str(link)]) == 2
    assert f"--markdown-out {link}: is a symbolic link" in capsys.readouterr().err
    assert main(["nightly", str(suite), "--check", "--json-out", str(suite)]) == 2
    assert f"--json-out {suite}: is {suite}, which this command reads" in capsys.readouterr().err
    assert victim.read_text() == "keep me\n" and "suite: s" in suite.read_text()

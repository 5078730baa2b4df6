"""Lock files in the shared /tmp: whatever someone planted at the lock's name is never written through."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.agent import lock as hostlock
from orchestrator.agent.processes import HostSideError
from orchestrator.errors import HostError
from orchestrator.hosts.local import LocalHost
from orchestrator.hosts.lock import host_lock_path, night_lock_path
from tests.conftest import FAST_SIM, NAMESPACE, free_port
from tests.faults.support import assert_plain, run, stored

HOLDER = {"session": "test", "pid": 1}


@pytest.fixture
def host_lock() -> Iterator[Path]:
    """This test session's host lock path (its own namespace), cleared before and after."""
    path = Path(host_lock_path(NAMESPACE))
    path.unlink(missing_ok=True)
    yield path
    hostlock.op_unlock(str(path))
    path.unlink(missing_ok=True)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "precious"
    path.write_text("keep me\n")
    return path


def test_a_symlink_planted_at_the_host_lock_is_refused_not_followed(
    host_lock: Path, victim: Path, tmp_path: Path
) -> None:
    host_lock.symlink_to(victim)
    out = run("down", cwd=tmp_path)  # takes the host lock first, like orch ab
    assert out.rc == 1, out.text
    assert_plain(out.text)
    assert f"lock file {host_lock} is a symbolic link" in out.err and f"rm {host_lock}" in out.err
    assert victim.read_text() == "keep me\n" and host_lock.is_symlink()


def test_a_symlink_planted_at_the_night_lock_is_refused_not_followed(victim: Path, tmp_path: Path) -> None:
    lock = Path(night_lock_path(NAMESPACE))
    lock.unlink(missing_ok=True)
    lock.symlink_to(victim)
    try:
        (tmp_path / "profiles").mkdir()
        profile = {"engine": "sglang", "model_path": "/m", "tp_size": 1, "port": free_port(), "sim": FAST_SIM}
        (tmp_path / "profiles" / "p.yaml").write_text(yaml.safe_dump(profile))
        (tmp_path / "suite.yaml").write_text("suite: s\nitems: [{name: a, bench: p, sim: true}]\n")
        out = run("nightly", "suite.yaml", "--db", str(tmp_path / "n.db"), cwd=tmp_path)
    finally:
        lock.unlink()
    assert out.rc == 1, out.text
    assert_plain(out.text)
    assert f"lock file {lock} is a symbolic link" in out.err
    assert victim.read_text() == "keep me\n"
    assert stored(tmp_path / "n.db", "SELECT count(*) FROM nights") == [(0,)]  # refused before the night began


def test_a_hard_link_a_fifo_or_a_directory_at_the_lock_is_refused(host_lock: Path, victim: Path) -> None:
    host = LocalHost()
    os.link(victim, host_lock)
    with pytest.raises(HostError, match="has 2 hard links"):
        host.call("lock", path=str(host_lock), holder=HOLDER, wait_s=0)
    assert victim.read_text() == "keep me\n"
    host_lock.unlink()
    os.mkfifo(host_lock)
    with pytest.raises(HostError, match="is not a regular file"):
        host.call("lock", path=str(host_lock), holder=HOLDER, wait_s=0)
    assert stat.S_ISFIFO(os.lstat(host_lock).st_mode)
    host_lock.unlink()
    host_lock.mkdir()
    try:
        with pytest.raises(HostError, match="is not a regular file"):
            host.call("lock", path=str(host_lock), holder=HOLDER, wait_s=0)
    finally:
        host_lock.rmdir()


def test_another_users_private_file_is_refused_a_shared_one_is_used(
    host_lock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As root, orch could write any file: another user's lock file only when its owner shared it, as orch does.
    host_lock.write_text("theirs\n")
    host_lock.chmod(0o644)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # now the file is someone else's (and /tmp still root's)
    with pytest.raises(HostSideError, match="belongs to another user"):
        hostlock.op_lock(str(host_lock), HOLDER)
    assert host_lock.read_text() == "theirs\n"
    host_lock.chmod(0o666)
    assert hostlock.op_lock(str(host_lock), HOLDER)["acquired"]
    assert '"session": "test"' in host_lock.read_text()


def test_a_lock_in_a_directory_others_can_rename_in_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by all, not sticky: anyone could swap the lock file under a session
    with pytest.raises(HostSideError, match="not sticky"):
        hostlock.op_lock(str(shared / "x.lock"), HOLDER)
    shared.chmod(0o1777)
    assert hostlock.op_lock(str(shared / "x.lock"), HOLDER)["acquired"]
    hostlock.op_unlock(str(shared / "x.lock"))


def test_the_lock_file_is_created_shared_and_reused(host_lock: Path) -> None:
    assert hostlock.op_lock(str(host_lock), HOLDER)["acquired"]
    assert stat.S_IMODE(os.stat(host_lock).st_mode) == 0o666  # every user of the host meets the same lock
    hostlock.op_unlock(str(host_lock))
    assert hostlock.op_lock(str(host_lock), HOLDER)["acquired"]

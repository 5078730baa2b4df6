"""The host lock of an agent orch abandons on purpose (Ctrl-C mid-request) passes to the session's next agent
through a keeper, never back to the kernel, where another session waiting for the host could take it."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.agent.lock import op_lock, op_unlock

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets are Linux's")


def abandoned_agent(path: Path, session: str, keep_s: float) -> None:
    """An agent of `session` that takes the lock, hands it to a keeper and exits, as serve() does on ABANDON."""
    code = textwrap.dedent(
        f"""
        from orchestrator.agent.lock import keep_for_successor, op_lock
        assert op_lock({str(path)!r}, {{"session": {session!r}}})["acquired"]
        keep_for_successor({keep_s})
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=Path(__file__).parents[2])


def free(path: Path) -> bool:
    """Whether another process could take the lock now (a third session polling for the host)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_the_next_agent_of_the_session_takes_the_lock_over_and_nobody_else_can_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "orch-test.lock"
    abandoned_agent(path, "session-a", keep_s=60)
    assert not free(path)  # the abandoned agent is gone; its keeper holds the lock
    other = op_lock(str(path), {"session": "session-b"}, wait_s=0, reclaim=True)
    assert not other["acquired"] and other["holder"]["session"] == "session-a"  # another session is not handed it
    got = op_lock(str(path), {"session": "session-a"}, wait_s=10, reclaim=True)
    try:
        assert got["acquired"]
        assert not free(path)  # held, and by this process now: the keeper has gone
        assert f'"agent_pid": {os.getpid()}' in path.read_text()
    finally:
        assert op_unlock(str(path))
    assert free(path)


def test_a_keeper_nobody_asks_releases_the_lock_when_its_time_is_up(tmp_path: Path) -> None:
    """orch died right after abandoning its agent: the host is free again after the keeper's time, as it was at once
    before (the kernel releasing a dead agent's flock)."""
    path = tmp_path / "orch-test.lock"
    abandoned_agent(path, "session-a", keep_s=1.0)
    assert not free(path)
    deadline = time.monotonic() + 30
    while not free(path):
        assert time.monotonic() < deadline, "the keeper never let the lock go"
        time.sleep(0.1)

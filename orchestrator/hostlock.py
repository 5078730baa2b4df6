"""The host lock on the host's side (shipped with the agent, stdlib + psutil): one orch session per host."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from typing import Any

import psutil

from orchestrator.teardown import _wait_gone

# One orch session per host: an flock held by the agent process for as long as it lives. If orch or its SSH
# connection dies, the agent sees EOF and exits, and the kernel releases the lock: nothing stale to clean up.
_LOCKS: dict[str, int] = {}


def op_lock(path: str, holder: dict[str, Any], wait_s: float = 0.0, reclaim: bool = False) -> dict[str, Any]:
    """Take the host lock (waiting up to wait_s). With reclaim, a lock held by an older agent of the *same* orch
    session (left behind by a silent network drop) is taken back by ending that agent."""
    if path in _LOCKS:
        return {"acquired": True, "holder": holder}
    fd = _open_lock_file(path)
    deadline = time.monotonic() + wait_s
    reclaimed = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            current: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                current = json.loads(os.pread(fd, 65536, 0).decode() or "{}")
            if reclaim and not reclaimed and holder.get("session") and current.get("session") == holder["session"]:
                reclaimed = True
                _end_stale_agent(current.get("agent_pid"))
                continue
            if time.monotonic() >= deadline:
                os.close(fd)
                return {"acquired": False, "holder": current}
            time.sleep(0.2)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({**holder, "agent_pid": os.getpid()}).encode(), 0)
    _LOCKS[path] = fd
    return {"acquired": True, "holder": holder}


def _open_lock_file(path: str) -> int:
    # The lock lives in a host-wide directory (/tmp) so that every session on the host meets it, whatever its
    # HOME or workdir, other users' included: created world-writable, and opened without O_CREAT when it exists
    # (fs.protected_regular refuses O_CREAT on another user's file in a sticky directory).
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        return os.open(path, os.O_RDWR)
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return os.open(path, os.O_RDWR)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)  # the umask must not lock other users out
    return fd


def _end_stale_agent(pid: Any) -> None:
    # Only a process that is verifiably an orch agent (this file in --serve mode, same user) is ever ended here.
    if not isinstance(pid, int) or pid in (os.getpid(), os.getppid()) or pid <= 1:
        return
    try:
        proc = psutil.Process(pid)
        cmd = proc.cmdline()
        if proc.uids().real != os.getuid() or "--serve" not in cmd or not any(a.endswith("hostside.py") for a in cmd):
            return
        proc.terminate()
        if _wait_gone([proc], 5.0):
            proc.kill()
            _wait_gone([proc], 5.0)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return


def op_unlock(path: str) -> bool:
    fd = _LOCKS.pop(path, None)
    if fd is None:
        return False
    os.ftruncate(fd, 0)
    os.close(fd)  # closing the last descriptor releases the flock
    return True

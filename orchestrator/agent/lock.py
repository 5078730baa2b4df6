"""The host lock on the host's side (shipped with the agent, stdlib + psutil): one orch session per host."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from typing import Any

import psutil

from orchestrator.agent.processes import HostSideError
from orchestrator.agent.teardown import wait_gone

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
    # (fs.protected_regular refuses O_CREAT on another user's file in a sticky directory). Anyone may plant
    # something at that name first, and orch often runs as root: so never through a symbolic link (O_NOFOLLOW),
    # and only into a file that writing gives nobody anything they lacked (_refuse_unsafe, on the open file).
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    _refuse_unsafe_directory(directory, path)
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
                with contextlib.suppress(OSError):
                    os.fchmod(fd, 0o666)  # the umask must not lock other users out
            except FileExistsError:
                fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LockFileError(path, "is a symbolic link") from None
        if e.errno in (errno.EISDIR, errno.ENXIO):
            raise LockFileError(path, "is not a regular file") from None
        raise LockFileError(path, f"cannot be opened ({e.strerror or e})") from None
    try:
        _refuse_unsafe(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


class LockFileError(HostSideError):
    """A lock path orch will not use: said with the path and what to do about it."""

    def __init__(self, path: str, why: str, advice: str = "") -> None:
        advice = advice or (
            f"Check who made it (ls -l {path}) and remove it (rm {path}) if no orch session is running: orch "
            "creates a fresh one"
        )
        super().__init__(
            f"lock file {path} {why}; orch never takes its lock through it (orch may run as root, and whatever "
            f"stands there would be overwritten). {advice}"
        )


def _refuse_unsafe(fd: int, path: str) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise LockFileError(path, "is not a regular file")
    if st.st_nlink != 1:
        raise LockFileError(path, f"has {st.st_nlink} hard links (another file shares its contents)")
    # Another user's lock file is written only when its owner made it writable by everyone, as orch does for a
    # shared lock: then writing it gives nobody anything they lacked, even when orch runs as root.
    if st.st_uid != os.geteuid() and not st.st_mode & stat.S_IWOTH:
        raise LockFileError(
            path, f"belongs to another user (uid {st.st_uid}) and is not shared (mode {st.st_mode & 0o777:o})"
        )


def _refuse_unsafe_directory(directory: str, path: str) -> None:
    # Others who may write the directory must not be able to swap the lock file under a session (sticky, as /tmp).
    st = os.stat(directory)
    shared = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if st.st_uid not in (0, os.geteuid()) or (shared and not st.st_mode & stat.S_ISVTX):
        raise LockFileError(
            path,
            f"is in {directory}, a directory other users can rename files in (owner uid {st.st_uid}, mode "
            f"{st.st_mode & 0o7777:o}, not sticky)",
            f"Make {directory} sticky (chmod +t {directory}), as /tmp is, or owned by root",
        )


# The agent's entry file on a host (hosts.agentlink.AGENT_ENTRY), and the name older orch versions installed it as.
AGENT_ENTRIES = ("orch_agent.py", "hostside.py")


def _end_stale_agent(pid: Any) -> None:
    # Only a process that is verifiably an orch agent (this file in --serve mode, same user) is ever ended here.
    if not isinstance(pid, int) or pid in (os.getpid(), os.getppid()) or pid <= 1:
        return
    try:
        proc = psutil.Process(pid)
        cmd = proc.cmdline()
        started = any(a.endswith(AGENT_ENTRIES) for a in cmd) or "orchestrator.agent" in cmd  # or `python -m` it
        if proc.uids().real != os.getuid() or "--serve" not in cmd or not started:
            return
        proc.terminate()
        if wait_gone([proc], 5.0):
            proc.kill()
            wait_gone([proc], 5.0)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return


def op_unlock(path: str) -> bool:
    fd = _LOCKS.pop(path, None)
    if fd is None:
        return False
    os.ftruncate(fd, 0)
    os.close(fd)  # closing the last descriptor releases the flock
    return True

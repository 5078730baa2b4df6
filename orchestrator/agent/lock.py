"""The host lock on the host's side (shipped with the agent, stdlib + psutil): one orch session per host."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
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
    # An agent orch abandoned on purpose leaves a keeper holding the lock for its successor (keep_for_successor),
    # which may still be starting: ask it for a while before ending an agent of ours that holds the lock itself.
    handover_until = time.monotonic() + min(wait_s, HANDOVER_WAIT_S)
    reclaimed = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            current: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                current = json.loads(os.pread(fd, 65536, 0).decode() or "{}")
            ours = reclaim and holder.get("session") and current.get("session") == holder["session"]
            if ours and take_from_keeper(fd, path, str(holder["session"])):
                break  # the lock never left this session: its abandoned agent's keeper handed it over
            if ours and not reclaimed and time.monotonic() >= handover_until:
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


# How long a keeper holds an abandoned agent's locks for its successor, and how long a successor asks for them.
KEEP_S = 60.0
HANDOVER_WAIT_S = 5.0
# The keeper: a fresh interpreter that inherited the lock's descriptors (so the flock never drops) and hands them to
# the first process of the same user that asks on its abstract socket (SCM_RIGHTS: the same open file description,
# lock included), then exits; after KEEP_S with nobody asking, it exits and the kernel releases the lock.
KEEPER = r"""
import json, os, socket, struct, sys, time
address, keep_s, fds, paths = sys.argv[1], float(sys.argv[2]), [int(f) for f in sys.argv[3].split(",")], sys.argv[4]
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind("\0" + address)
listener.listen(4)
end = time.monotonic() + keep_s
while (left := end - time.monotonic()) > 0:
    listener.settimeout(left)
    try:
        conn, _ = listener.accept()
    except OSError:
        break
    with conn:
        peer = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if peer[1] != os.getuid():
            continue
        try:
            socket.send_fds(conn, [paths.encode()], fds)
        except OSError:
            continue
        for fd in fds:
            os.close(fd)  # the successor's copy alone holds the lock now: its unlock frees the host at once
        break
"""


def keeper_address(path: str, session: str) -> str:
    """The abstract socket (Linux) where a keeper of this user's session waits with the lock at path."""
    return "orch-lock-" + hashlib.sha256(f"{os.getuid()}:{session}:{path}".encode()).hexdigest()[:40]


def keep_for_successor(keep_s: float = KEEP_S) -> None:
    """Before an agent orch abandoned on purpose exits (Ctrl-C mid-request: the reply in flight must never be read),
    hand the locks it holds to a keeper, so the session's next agent takes them over without the kernel releasing
    them in between: another session waiting for the host must not slip in while this one still tears down."""
    held = dict(_LOCKS)
    if not held or not sys.platform.startswith("linux"):
        return
    for path, fd in held.items():
        try:
            holder = json.loads(os.pread(fd, 65536, 0).decode() or "{}")
        except (OSError, ValueError):
            continue
        session = holder.get("session")
        if not isinstance(session, str) or not session:
            continue
        with contextlib.suppress(OSError):
            # Not waited for: it outlives this agent by design, and ends by itself (handed over, or KEEP_S).
            subprocess.Popen(
                [sys.executable, "-c", KEEPER, keeper_address(path, session), str(keep_s), str(fd), path],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )


def take_from_keeper(fd: int, path: str, session: str) -> bool:
    """Take the lock at path from this session's keeper, if one waits: its descriptor replaces fd (closed), is
    checked to be that file's and to hold the lock, and is kept as this agent's."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(2.0)
            conn.connect("\0" + keeper_address(path, session))
            _, fds, _, _ = socket.recv_fds(conn, 4096, 4)
    except OSError:
        return False
    got = None
    for received in fds:
        if got is None and os.path.sameopenfile(received, fd):
            try:
                # The description the keeper held holds the lock: taking it again through it succeeds at once.
                fcntl.flock(received, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = received
                continue
            except OSError:
                pass
        os.close(received)
    if got is None:
        return False
    os.dup2(got, fd)  # fd (the caller's, refused by flock until now) becomes the lock-holding description
    os.close(got)
    return True


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

"""orch's own processes on a host: the launch marker and owner, finding and describing marked processes (stdlib +
psutil; shipped with the agent)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psutil

from orchestrator.redaction import REDACTED, hide_argv, scrub

MARKER = "ORCH_LAUNCH_ID"
# Which orch session a launch belongs to: "<pid>:<start time>" of the process that launched it on the host (orch
# itself for the local host, the agent over SSH; the agent exits when orch or its connection dies). A launch whose
# owner is alive belongs to a live session, and no other session may tear it down.
OWNER = "ORCH_OWNER"
# The profile a launch runs, as the launching orch named it: `orch status` can name launches that another results
# store (another --db, another user) recorded.
PROFILE = "ORCH_PROFILE"


class HostSideError(Exception):
    """A failure the caller should show to the user as a HostError."""


def _gone(proc: psutil.Process) -> bool:
    # Orphans whose parent is a non-reaping PID 1 linger as zombies: for us they are dead. is_running() also
    # compares the creation time, so a PID reused by a new process does not count as ours still running.
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return True


def _environ(proc: psutil.Process) -> dict[str, str] | None:
    try:
        return proc.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None


def _cmdline(proc: psutil.Process, limit: int = 300) -> str:
    try:
        # Display only (status, port owners, GPU processes): a plain mask, no digest, so no key is needed here.
        text = scrub(" ".join(hide_argv(proc.cmdline(), lambda _: REDACTED))) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _marked(match: Callable[[str], bool]) -> list[tuple[psutil.Process, str]]:
    out = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        env = _environ(proc)
        if not env:
            continue
        launch_id = env.get(MARKER)
        if launch_id is not None and match(launch_id) and not _gone(proc):
            out.append((proc, launch_id))
    return out


def _describe(proc: psutil.Process, launch_id: str | None = None) -> dict[str, Any]:
    try:
        ppid, pgid = proc.ppid(), os.getpgid(proc.pid)
    except (psutil.NoSuchProcess, ProcessLookupError, psutil.AccessDenied):
        ppid, pgid = None, None
    return {"pid": proc.pid, "ppid": ppid, "pgid": pgid, "cmdline": _cmdline(proc), "launch_id": launch_id}


def _self_owner() -> str:
    return f"{os.getpid()}:{psutil.Process().create_time():.3f}"


def owner_state(owner: str | None) -> str:
    """`me` (this process launched it), `alive` (another live orch session), `dead`, or `unknown` (no owner)."""
    if not owner:
        return "unknown"
    if owner == _self_owner():
        return "me"
    pid_text, _, created = owner.partition(":")
    try:
        proc = psutil.Process(int(pid_text))
        same = abs(proc.create_time() - float(created)) < 0.01  # a reused PID is another process
        return "alive" if same and not _gone(proc) else "dead"
    except (psutil.NoSuchProcess, ValueError):
        return "dead"
    except psutil.AccessDenied:
        return "alive"  # another user's live process: certainly not ours to judge dead

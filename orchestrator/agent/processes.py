"""orch's own processes on a host: the launch marker and owner, finding and describing marked processes (stdlib +
psutil; shipped with the agent)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psutil

from orchestrator.common.redaction import REDACTED, hide_argv, scrub

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


def is_gone(proc: psutil.Process) -> bool:
    """True when proc has exited, is a zombie, or its PID now belongs to another process."""
    # Orphans whose parent is a non-reaping PID 1 linger as zombies: for us they are dead. is_running() also
    # compares the creation time, so a PID reused by a new process does not count as ours still running.
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return True


def read_environ(proc: psutil.Process) -> dict[str, str] | None:
    """proc's environment, or None when it is gone or not ours to read."""
    try:
        return proc.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None


def masked_cmdline(proc: psutil.Process, limit: int = 300) -> str:
    """proc's command line for display, secrets masked, cut to limit characters; `?` when it cannot be read."""
    try:
        # Display only (status, port owners, GPU processes): a plain mask, no digest, so no key is needed here.
        text = scrub(" ".join(hide_argv(proc.cmdline(), lambda _: REDACTED))) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def marked_processes(match: Callable[[str], bool]) -> list[tuple[psutil.Process, str]]:
    """Every live process (but this one) whose MARKER launch id matches, with that id."""
    out = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        env = read_environ(proc)
        if not env:
            continue
        launch_id = env.get(MARKER)
        if launch_id is not None and match(launch_id) and not is_gone(proc):
            out.append((proc, launch_id))
    return out


def describe_process(proc: psutil.Process, launch_id: str | None = None) -> dict[str, Any]:
    """pid, ppid, pgid, masked command line and launch id of proc, as status and teardown reports list them."""
    try:
        ppid, pgid = proc.ppid(), os.getpgid(proc.pid)
    except (psutil.NoSuchProcess, ProcessLookupError, psutil.AccessDenied):
        ppid, pgid = None, None
    return {"pid": proc.pid, "ppid": ppid, "pgid": pgid, "cmdline": masked_cmdline(proc), "launch_id": launch_id}


def self_owner() -> str:
    """This process as an OWNER value: its PID and start time, so a reused PID is never taken for it."""
    return f"{os.getpid()}:{psutil.Process().create_time():.3f}"


def owner_state(owner: str | None) -> str:
    """`me` (this process launched it), `alive` (another live orch session), `dead`, or `unknown` (no owner)."""
    if not owner:
        return "unknown"
    if owner == self_owner():
        return "me"
    pid_text, _, created = owner.partition(":")
    try:
        proc = psutil.Process(int(pid_text))
        same = abs(proc.create_time() - float(created)) < 0.01  # a reused PID is another process
        return "alive" if same and not is_gone(proc) else "dead"
    except (psutil.NoSuchProcess, ValueError):
        return "dead"
    except psutil.AccessDenied:
        return "alive"  # another user's live process: certainly not ours to judge dead

"""Stopping processes on the host (shipped with the agent): a launch's whole tree, and who holds a port."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from typing import Any

import psutil

from orchestrator.agent.processes import (
    MARKER,
    HostSideError,
    describe_process,
    is_gone,
    marked_processes,
    read_environ,
    same_process,
)


def op_port_owner(port: int) -> list[dict[str, Any]]:
    """Who listens on the TCP port: pid, command line and orch marker (None when it is not orch's)."""
    owners: list[dict[str, Any]] = []
    seen: set[int | None] = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        if conn.pid in seen:
            continue
        seen.add(conn.pid)
        if conn.pid is None:
            owners.append({"pid": None, "cmdline": "(a process orch may not inspect)", "launch_id": None})
            continue
        try:
            proc = psutil.Process(conn.pid)
        except psutil.NoSuchProcess:
            continue
        env = read_environ(proc) or {}
        owners.append(describe_process(proc, env.get(MARKER)))
    return owners


def recorded_processes(procs: Iterable[dict[str, Any]]) -> tuple[list[psutil.Process], list[dict[str, Any]]]:
    """The recorded processes that are still the same processes (PID and start time since boot, so a wall-clock step
    does not make a live one look gone), and those that are gone."""
    alive, gone = [], []
    for rec in procs:
        try:
            proc = psutil.Process(int(rec["pid"]))
            if same_process(proc, rec) and not is_gone(proc):
                alive.append(proc)
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
            pass
        gone.append(rec)
    return alive, gone


def _signal_group(pgid: int | None, sig: signal.Signals) -> bool:
    if pgid is None or pgid <= 1:
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _signal_procs(procs: Iterable[psutil.Process], sig: signal.Signals) -> list[int]:
    hit = []
    for proc in procs:
        if is_gone(proc):
            continue
        try:
            proc.send_signal(sig)
            hit.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return hit


# Teardown's polls (a /proc read per process, a scan of the listening sockets): cheap on the host, and each one is
# time a user waits between arms.
GONE_POLL_S = 0.01
PORT_POLL_S = 0.02


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """The processes of procs still alive after waiting up to timeout seconds for them to exit."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not is_gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(GONE_POLL_S)
        alive = [p for p in alive if not is_gone(p)]
    return alive


def _listening(port: int) -> bool:
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in psutil.net_connections(kind="tcp")
    )


def stop_launch(
    launch_id: str,
    pgid: int | None,
    port: int | None,
    grace_s: float,
    port_wait_s: float,
    known: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """SIGTERM the group, wait, SIGKILL the group, SIGKILL any process still carrying the marker, wait for the port.

    Only processes in the recorded process group, carrying this exact launch marker, or recorded as this launch's
    (`known`: PID and start time, so a reused PID is never mistaken for ours) are ever signalled.
    """
    t0 = time.monotonic()
    procs = [p for p, _ in marked_processes(lambda v: v == launch_id)]
    # Recorded members that no longer carry the marker (a worker that re-exec'd with a clean environment).
    unmarked = [p for p in recorded_processes(known or [])[0] if p.pid not in {q.pid for q in procs}]
    procs += unmarked
    report: dict[str, Any] = {
        "found": [p.pid for p in procs],
        "unmarked": [p.pid for p in unmarked],
        "sigterm": False,
        "sigkill": [],
        "escaped": [],
    }
    # A recorded PGID is only trusted while a member still carries our marker: after the launch died the number
    # may belong to someone else's process group.
    if pgid is not None and any(_pgid(p) == pgid for p in procs):
        procs += [p for p in psutil.process_iter() if p.pid not in report["found"] and _pgid(p) == pgid]
    else:
        pgid = None
    report["sigterm"] = _signal_group(pgid, signal.SIGTERM)
    # Members that left the group (setsid) never saw the group signal: tell them directly.
    _signal_procs([p for p in procs if _pgid(p) != pgid], signal.SIGTERM)
    survivors = wait_gone(procs, grace_s)
    if survivors:
        # Re-check just before the group SIGKILL: if every marked member left the group meanwhile, the number
        # may already belong to a new group of someone else's.
        if pgid is not None and any(_pgid(p) == pgid for p, _ in marked_processes(lambda v: v == launch_id)):
            _signal_group(pgid, signal.SIGKILL)
        _signal_procs(survivors, signal.SIGKILL)  # those outside the group; the rest may already be gone
        report["sigkill"] = [p.pid for p in survivors]
    # Processes started after our snapshot or reparented away from the group: found again by marker.
    late = [p for p, _ in marked_processes(lambda v: v == launch_id)] + recorded_processes(known or [])[0]
    if late:
        report["escaped"] = sorted(set(_signal_procs(late, signal.SIGKILL)))
    remaining = wait_gone(procs + late, 10.0)
    report["remaining"] = [describe_process(p, launch_id) for p in remaining]
    port_free = True
    if port is not None:
        deadline = time.monotonic() + port_wait_s
        while (port_free := not _listening(port)) is False and time.monotonic() < deadline:
            time.sleep(PORT_POLL_S)
        if not port_free:
            # Whoever still holds the port carries neither our marker nor a recorded PID: say so, never kill it.
            report["port_owner"] = op_port_owner(port)
    report["port_free"] = port_free
    report["seconds"] = round(time.monotonic() - t0, 3)
    return report


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except ProcessLookupError:
        return None


def op_kill_port_owner(port: int, pid: int, grace_s: float = 10.0) -> dict[str, Any]:
    """Kill exactly the process that owns the port (opt-in: host policy kill-with-force plus --force)."""
    if pid <= 1 or pid in (os.getpid(), os.getppid()):
        raise HostSideError(f"refusing to kill PID {pid} (init, or orch's own agent and its parent)")
    try:
        proc = psutil.Process(pid)  # before the ownership check, so a PID reused afterwards is not signalled
    except psutil.NoSuchProcess:
        return {"pid": pid, "sigkill": False, "gone": True}
    owners = [o["pid"] for o in op_port_owner(port)]
    if pid not in owners:
        raise HostSideError(f"PID {pid} no longer owns port {port} (owners now: {owners}); nothing was killed")
    _signal_procs([proc], signal.SIGTERM)
    killed = []
    if wait_gone([proc], grace_s):
        killed = _signal_procs([proc], signal.SIGKILL)
        wait_gone([proc], 10.0)
    return {"pid": pid, "sigkill": bool(killed), "gone": is_gone(proc)}

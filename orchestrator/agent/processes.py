"""orch's own processes on a host: the launch marker and owner, finding and describing marked processes (stdlib +
psutil; shipped with the agent)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from orchestrator.common.printable import visible
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
    # Anyone's argv may hold a newline or an escape sequence, and orch quotes it in one line of a message.
    text = visible(text)
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


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22); None where that cannot be
    read (not Linux, or the process is gone). psutil's create_time() is the boot time plus this, and the kernel
    derives the boot time from the wall clock, so a clock step (NTP, a VM resumed, `date -s`) moves every
    create_time, never this."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        # comm (field 2) may hold spaces and parentheses: the fields are counted from its closing one
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


# The kernel's id of this boot, new at every boot (Linux).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """This boot's id (BOOT_ID_PATH), or None where it cannot be read (not Linux, a sandbox without /proc)."""
    try:
        with open(BOOT_ID_PATH) as f:
            return f.readline().strip() or None
    except OSError:
        return None


def identity(proc: psutil.Process) -> dict[str, Any]:
    """What tells proc apart from a later process given its PID: `pid`, `create_time` and, on Linux, `start_ticks`
    and `boot_id` (what same_process compares first: start ticks count from a boot, so they repeat across boots)."""
    out: dict[str, Any] = {"pid": proc.pid, "create_time": proc.create_time()}
    ticks = start_ticks(proc.pid)
    if ticks is not None:
        out["start_ticks"] = ticks
    boot = boot_id()
    if boot is not None:
        out["boot_id"] = boot
    return out


def same_process(proc: psutil.Process, recorded: Mapping[str, Any], tolerance_s: float = 0.01) -> bool:
    """Whether proc (the process now at the recorded PID) is the recorded one. A record of another boot (its
    `boot_id`, where both it and this system have one) is never a process of this one, whatever its PID and start
    ticks: no process outlives a reboot, and a record (a store's experiment owner, a launch's processes) does. Then
    by start ticks since boot where the record has them and they can be read now, so a wall-clock step changes
    nothing; else (a record made by an older orch, not Linux) by create_time within tolerance_s, as before."""
    booted = recorded.get("boot_id")
    if isinstance(booted, str) and booted and (now_boot := boot_id()) is not None and booted != now_boot:
        return False
    ticks = recorded.get("start_ticks")
    if isinstance(ticks, int) and not isinstance(ticks, bool):
        now = start_ticks(proc.pid)
        if now is not None:
            return now == ticks
    created = recorded.get("create_time")
    if isinstance(created, bool) or not isinstance(created, int | float):
        return False
    return abs(proc.create_time() - float(created)) < tolerance_s


def identity_key(recorded: Mapping[str, Any]) -> tuple[int, str]:
    """A recorded process as a hashable key: its PID and start ticks (or create time, in an older record)."""
    ticks = recorded.get("start_ticks")
    return int(recorded["pid"]), f"t{ticks}" if ticks is not None else f"c{float(recorded.get('create_time') or 0)}"


def self_owner() -> str:
    """This process as an OWNER value, `<pid>:<create time>[@<start ticks>]`: a reused PID is never taken for it, and
    the start ticks (where the system has them) keep it recognised across a wall-clock step."""
    me = identity(psutil.Process())
    ticks = f"@{me['start_ticks']}" if "start_ticks" in me else ""
    return f"{me['pid']}:{me['create_time']:.3f}{ticks}"


def parse_owner(owner: str) -> dict[str, Any] | None:
    """An OWNER value as a process record (`pid`, `create_time`, `start_ticks` where given), or None if malformed.
    An older orch's `<pid>:<create time>` has no start ticks."""
    pid_text, _, start = owner.partition(":")
    created, _, ticks = start.partition("@")
    try:
        record: dict[str, Any] = {"pid": int(pid_text), "create_time": float(created)}
        if ticks:
            record["start_ticks"] = int(ticks)
    except ValueError:
        return None
    return record


def owner_state(owner: str | None) -> str:
    """`me` (this process launched it), `alive` (another live orch session), `dead`, or `unknown` (no owner)."""
    if not owner:
        return "unknown"
    record = parse_owner(owner)
    if record is None:
        return "dead"
    try:
        proc = psutil.Process(record["pid"])
        same = same_process(proc, record)  # a reused PID is another process
        if same and proc.pid == os.getpid():
            return "me"
        return "alive" if same and not is_gone(proc) else "dead"
    except (psutil.NoSuchProcess, ValueError):
        return "dead"
    except psutil.AccessDenied:
        return "alive"  # another user's live process: certainly not ours to judge dead

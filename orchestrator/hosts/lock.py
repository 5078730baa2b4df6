"""The host lock on orch's side (one orch session per machine; the lock file itself is the shipped `agent/lock`'s)."""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.agent.lock import op_lock, op_unlock
from orchestrator.agent.processes import HostSideError
from orchestrator.errors import HostBusy, HostError
from orchestrator.hosts.base import Host, default_namespace
from orchestrator.hosts.group import GroupHost
from orchestrator.ui.events import QUIET, Events

# Host-wide, so HOME and --workdir cannot give two sessions two locks.
LOCK_DIR = "/tmp"
# Names this orch process in the host lock, so after a silent network drop it can take its own lock back.
SESSION = uuid.uuid4().hex


def host_lock_path(namespace: str | None = None) -> str:
    """One orch session per host (and namespace: ORCH_NAMESPACE's unless given), whatever HOME or --workdir each
    session uses."""
    return f"{LOCK_DIR}/orch-{default_namespace() if namespace is None else namespace}.lock"


def night_lock_path(namespace: str) -> str:
    """One night at a time on this machine (per namespace), whatever the suite, HOME or database."""
    return f"{LOCK_DIR}/orch-nightly-{namespace}.lock"


def session_holder(exp_id: str) -> dict[str, Any]:
    """What the host lock says about the session holding it (another session's refusal or wait names it)."""
    return {
        "session": SESSION,
        "user": getpass.getuser(),
        "machine": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "experiment_id": exp_id,
        "command": " ".join(sys.argv[:12]),
    }


def describe_holder(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    return (
        f"{holder.get('user', '?')}@{holder.get('machine', '?')} pid {holder.get('pid', '?')} since "
        f"{holder.get('since', '?')}, experiment {holder.get('experiment_id', '?')}"
    )


def acquire_host_lock(
    host: Host,
    exp_id: str,
    wait_s: float,
    events: Events = QUIET,
    *,
    purpose: str = "run",
    shared_ok: Callable[[dict[str, Any]], bool] | None = None,
) -> bool:
    """One orch session per host: two sessions launching on one box would measure each other (or, for `orch down`,
    stop each other's servers). False: not taken because shared_ok accepts its holder (this session already holds
    that machine's lock as another node of a group)."""
    path, holder = host_lock_path(), session_holder(exp_id)
    got = host.call("lock", path=path, holder=holder, wait_s=0)
    if not got["acquired"] and shared_ok is not None and shared_ok(got.get("holder") or {}):
        return False
    if not got["acquired"] and wait_s > 0:
        events.line(f"{host.name} is busy ({describe_holder(got['holder'])}); waiting up to {wait_s:.0f}s")
        events.phase("lock wait", holder=describe_holder(got["holder"]))
        got = host.call("lock", path=path, holder=holder, wait_s=wait_s)
    if not got["acquired"]:
        if purpose == "orch down":
            raise HostError(
                f"{host.name} is in use by a live orch session ({describe_holder(got['holder'])}); orch down "
                "leaves its servers alone. Wait for it to finish, or pass --force to stop its servers anyway."
            )
        raise HostBusy(
            f"{host.name} is busy: another orch session holds it ({describe_holder(got['holder'])}).",
            how_to_wait="Use --wait SECONDS to queue behind it.",
            after="(The lock goes away by itself when that session ends or its connection drops.)",
        )
    return True


def lock_nodes(host: Host, exp_id: str, wait_s: float, events: Events) -> list[Host]:
    """The host lock of every node (a group's in name order, so two sessions wanting overlapping groups cannot
    deadlock); the hosts whose lock this session now holds."""
    if not isinstance(host, GroupHost):
        acquire_host_lock(host, exp_id, wait_s, events)
        return [host]
    held: list[Host] = []

    def ours(holder: dict[str, Any]) -> bool:
        return holder.get("session") == SESSION and holder.get("experiment_id") == exp_id

    try:
        for node in sorted(host.nodes, key=lambda h: h.name):
            if acquire_host_lock(node, exp_id, wait_s, events, shared_ok=ours):
                held.append(node)
            else:
                events.line(f"NOTE: {node.name} is the same machine as another node of {host.name} (one host lock)")
    except BaseException:
        release_quietly(held)
        raise
    return held


def release(host: Host) -> None:
    host.call("unlock", path=host_lock_path())


def release_quietly(hosts: Iterable[Host]) -> None:
    """Unlock each host in turn, never raising: a failed unlock must not hide why we are here, and the lock also
    goes when the agent's connection closes."""
    for host in hosts:
        with contextlib.suppress(Exception):
            release(host)


def release_in_process(path: str) -> None:
    """Release a lock this process's own agent holds (the local host's, the night's), as a remote agent's exit
    would."""
    op_unlock(path)


class HeldLock:
    """The host lock a session holds through its agent (SSH and Slurm hosts): noted from lock/unlock replies, and
    taken again by the fresh agent after the old one was lost."""

    def __init__(self) -> None:
        self.held: tuple[str, dict[str, Any]] | None = None  # (path, holder)

    def note(self, request: dict[str, Any], reply: dict[str, Any]) -> None:
        args = request.get("args", {})
        if request["op"] == "lock" and reply.get("ok") and reply["result"].get("acquired"):
            self.held = (args["path"], args["holder"])
        if request["op"] == "unlock":
            self.held = None

    def retake(self, send: Callable[[dict[str, Any], float], dict[str, Any]], what: str) -> None:
        """Take the lock again through `send` (a new agent). Our previous agent may still hold it after a silent
        drop; the lock file names this session, so the agent may end that one agent of ours (and nothing else)."""
        if self.held is None:
            return
        path, holder = self.held
        reply = send({"op": "lock", "args": {"path": path, "holder": holder, "wait_s": 10, "reclaim": True}}, 60)
        if not reply.get("ok") or not reply["result"]["acquired"]:
            self.held = None
            held_by = reply.get("result", {}).get("holder") if reply.get("ok") else reply.get("error")
            raise HostError(f"{what}, the host lock is held by {held_by}")

    def release(self, call: Callable[..., Any]) -> None:
        """Unlock through `call` (the host's, closing it) if held; never raises: the agent's exit releases it too."""
        if self.held is not None:
            with contextlib.suppress(Exception):
                call("unlock", path=self.held[0])


def night_holder(suite: str) -> dict[str, Any]:
    return {
        "suite": suite,
        "user": getpass.getuser(),
        "machine": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": " ".join(sys.argv[:12]),
    }


def describe_night_holder(h: dict[str, Any]) -> str:
    if not h:
        return "holder unknown"
    who = f"{h.get('user', '?')}@{h.get('machine', '?')} pid {h.get('pid', '?')}"
    return f"suite {h.get('suite', '?')}, {who} since {h.get('since', '?')}"


def take_night_lock(path: str, suite: str, wait_s: float, events: Events) -> dict[str, Any]:
    """The night lock, taken in this process (a night runs where orch runs), waiting up to wait_s behind another
    night; the lock's reply (`acquired`, and `holder` when not)."""
    holder = night_holder(suite)
    got = _lock_in_process(path, holder, 0)
    if not got["acquired"]:
        events.line(f"another night is running ({describe_night_holder(got['holder'])}); waiting up to {wait_s:.0f}s")
        got = _lock_in_process(path, holder, wait_s)
    return got


def _lock_in_process(path: str, holder: dict[str, Any], wait_s: float) -> dict[str, Any]:
    try:
        return op_lock(path, holder, wait_s=wait_s)
    except HostSideError as e:  # the lock path is unsafe (agent/lock says which and what to do): an error, exit 1
        raise HostError(str(e)) from None

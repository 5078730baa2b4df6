"""The host side of an experiment: its facts, the same machine on resume, the nodes it needs, its host locks."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.config.profile import Profile
from orchestrator.errors import HostError, InputError
from orchestrator.hosts.base import Host
from orchestrator.hosts.group import GroupHost
from orchestrator.launch import attach
from orchestrator.launch import group as multinode
from orchestrator.ui.events import QUIET, Events

if TYPE_CHECKING:
    from orchestrator.config.design import ABConfig

# Names this orch process in the host lock, so after a silent network drop it can take its own lock back.
SESSION = uuid.uuid4().hex


# Host facts that legitimately differ between two sessions on the same host.
_VOLATILE_FACTS = {"time", "uptime_s", "load", "loadavg", "mem_available_bytes", "disk_free_bytes", "pid"}


def facts_changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(before) | set(after) if k not in _VOLATILE_FACTS and before.get(k) != after.get(k))


def nodes_needed(profiles: Sequence[Profile]) -> int:
    """How many nodes the experiment's largest launched profile spans (what a Slurm host asks Slurm for)."""
    return max((p.nnodes for p in profiles if attach.url_of(p) is None), default=1)


def host_facts(host: Host, config: ABConfig, resumed: dict[str, Any] | None, events: Events) -> dict[str, Any]:
    """The host facts stored with the experiment. A group's: every node's, compared before anything starts; rank
    0's stand for the experiment (its API is measured), every node's under `nodes`, and how they differ under
    `node_mismatches` when --allow-node-mismatch (or the resumed experiment's own) let them launch anyway."""
    if not isinstance(host, GroupHost):
        facts: dict[str, Any] = host.call("facts", nvidia_smi=host.config.nvidia_smi)
        return facts
    allowed = config.allow_node_mismatch or (
        resumed is not None and bool(json.loads(resumed["config_json"]).get("allow_node_mismatch"))
    )
    per_node, mismatches = multinode.node_facts(host, allow_mismatch=allowed)
    if not mismatches:
        return {**per_node[host.nodes[0].name], "nodes": per_node}
    events.line(
        f"WARNING: the nodes of {host.name} differ ({'; '.join(mismatches)}); launching anyway "
        "(--allow-node-mismatch): the experiment records it and its reports show it"
    )
    return {**per_node[host.nodes[0].name], "nodes": per_node, "node_mismatches": mismatches}


def check_nodes(host: Host, profiles: Sequence[Profile]) -> None:
    """A multi-node profile needs an inventory group with enough hosts as --host (exit 2 otherwise)."""
    check_nodes_for(profiles, len(host.nodes) if isinstance(host, GroupHost) else 1, host.name)


def check_nodes_for(profiles: Sequence[Profile], nodes: int, host_name: str, is_slurm: bool = False) -> None:
    """check_nodes before connecting (the CLI, from the inventory alone): `nodes` hosts under --host `host_name`; a
    Slurm host asks Slurm for as many nodes as the profiles need, so it always has enough."""
    if is_slurm:
        return
    for p in profiles:
        if p.nnodes == 1 or attach.url_of(p) is not None:
            continue
        if nodes < p.nnodes:
            what = f"group {host_name} has {nodes} host(s)" if nodes > 1 else f"{host_name} is one host"
            raise InputError(
                f"profile {p.name!r} has nnodes: {p.nnodes}, so --host must name an inventory group of at least "
                f"{p.nnodes} hosts (hosts.yaml: `gpu-pair: {{nodes: [gpu-a, gpu-b]}}` under hosts) or a Slurm host "
                f"(`slurm:PARTITION`: orch asks for {p.nnodes} nodes), but {what}"
            )


def lock_nodes(host: Host, exp_id: str, wait_s: float, events: Events) -> list[Host]:
    """The host lock of every node (a group's in name order, so two sessions wanting overlapping groups cannot
    deadlock); the hosts whose lock this session now holds."""
    if not isinstance(host, GroupHost):
        acquire_host_lock(host, host.lock_path, exp_id, wait_s, events)
        return [host]
    held: list[Host] = []

    def ours(holder: dict[str, Any]) -> bool:
        return holder.get("session") == SESSION and holder.get("experiment_id") == exp_id

    try:
        for node in sorted(host.nodes, key=lambda h: h.name):
            if acquire_host_lock(node, node.lock_path, exp_id, wait_s, events, shared_ok=ours):
                held.append(node)
            else:
                events.line(f"NOTE: {node.name} is the same machine as another node of {host.name} (one host lock)")
    except BaseException:
        for node in held:
            with contextlib.suppress(Exception):
                node.call("unlock", path=node.lock_path)
        raise
    return held


def acquire_host_lock(
    host: Host,
    path: str,
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
    holder = {
        "session": SESSION,
        "user": getpass.getuser(),
        "machine": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "experiment_id": exp_id,
        "command": " ".join(sys.argv[:12]),
    }
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
        raise HostError(
            f"{host.name} is busy: another orch session holds it ({describe_holder(got['holder'])}). "
            "Use --wait SECONDS to queue behind it. (The lock goes away by itself when that session ends or "
            "its connection drops.)"
        )
    return True


def describe_holder(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    return (
        f"{holder.get('user', '?')}@{holder.get('machine', '?')} pid {holder.get('pid', '?')} since "
        f"{holder.get('since', '?')}, experiment {holder.get('experiment_id', '?')}"
    )

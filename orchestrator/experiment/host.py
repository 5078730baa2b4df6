"""The host side of an experiment: its facts, how they changed since it started, the nodes it needs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.config.profile import Profile
from orchestrator.errors import InputError
from orchestrator.hosts.base import Host
from orchestrator.hosts.group import GroupHost
from orchestrator.launch import attach
from orchestrator.launch import group as multinode
from orchestrator.ui.events import Events

if TYPE_CHECKING:
    from orchestrator.config.design import ABConfig

# Host facts that legitimately differ between two sessions on the same host.
_VOLATILE_FACTS = {"time", "uptime_s", "load", "loadavg", "mem_available_bytes", "disk_free_bytes", "pid"}


def facts_changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    # boot_time is derived from the wall clock (a clock step moves it): where both sides have the kernel's boot_id,
    # that says whether the machine rebooted.
    clock_derived = {"boot_time"} if before.get("boot_id") and after.get("boot_id") else set()
    volatile = _VOLATILE_FACTS | clock_derived
    return sorted(k for k in set(before) | set(after) if k not in volatile and before.get(k) != after.get(k))


def nodes_needed(profiles: Sequence[Profile]) -> int:
    """How many nodes the experiment's largest launched profile spans (what a Slurm host asks Slurm for)."""
    return max((p.nnodes for p in profiles if attach.url_of(p) is None), default=1)


def host_facts(
    host: Host, config: ABConfig, resumed: dict[str, Any] | None, events: Events, packages: Sequence[str]
) -> dict[str, Any]:
    """The host facts stored with the experiment (`packages`: the versions to record, its engines'
    engines.fact_packages). A group's: every node's, compared before anything starts; rank 0's stand for the
    experiment (its API is measured), every node's under `nodes`, and how they differ under `node_mismatches` when
    --allow-node-mismatch (or the resumed experiment's own) let them launch anyway."""
    if not isinstance(host, GroupHost):
        facts: dict[str, Any] = host.call("facts", nvidia_smi=host.config.nvidia_smi, packages=list(packages))
        return facts
    allowed = config.allow_node_mismatch or (
        resumed is not None and bool(json.loads(resumed["config_json"]).get("allow_node_mismatch"))
    )
    per_node, mismatches = multinode.node_facts(host, packages, allow_mismatch=allowed)
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


def check_nodes_for(profiles: Sequence[Profile], nodes: int, host_name: str, allocates: bool = False) -> None:
    """check_nodes before connecting (the CLI, from the inventory alone): `nodes` hosts under --host `host_name`; a
    host that allocates nodes (Slurm) asks for as many as the profiles need, so it always has enough."""
    if allocates:
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

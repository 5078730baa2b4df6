"""Turning `--host` into a connected Host: the one module that knows every transport (local, SSH, Slurm, groups)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace

from orchestrator.errors import HostError, InputError
from orchestrator.hosts.base import Host, HostConfig
from orchestrator.hosts.group import GroupHost
from orchestrator.hosts.inventory import HostGroup, lookup
from orchestrator.hosts.local import LocalHost
from orchestrator.ui.events import Events, Lines

# Callers import every other name from the module that owns it (hosts.base, hosts.inventory, hosts.local, ...).
__all__ = ["open_group", "open_host", "open_reachable", "resolve_host"]


def resolve_host(
    spec: str,
    *,
    workdir: str | None = None,
    inventory: str | None = None,
    accept_new_host_key: bool = False,
    events: Events | None = None,
    nodes: int = 1,
) -> Host:
    """Turn `--host` into a connected Host; `events` hears what opening it takes long for (a Slurm queue).
    `nodes`: how many nodes the experiment's largest multi-node profile spans (a Slurm host asks for that many)."""
    config, hosts = lookup(spec, inventory)
    if isinstance(config, HostGroup):
        return open_group(config, hosts, workdir=workdir, accept_new_host_key=accept_new_host_key, events=events)
    if workdir:
        config = replace(config, workdir=workdir)
    return open_host(config, accept_new_host_key=accept_new_host_key, events=events, nodes=nodes)


def open_host(
    config: HostConfig,
    *,
    accept_new_host_key: bool = False,
    events: Events | None = None,
    nodes: int = 1,
) -> Host:
    """A Host for one resolved inventory entry (`scheduler: slurm`, `slurm:PARTITION`, or `user@addr[:port]`);
    a Slurm entry with `nodes` > 1 is one allocation of that many nodes, as a group (one node per rank). Without
    `events`, a Slurm host logs its lines (and its phases go nowhere)."""
    if config.scheduler == "slurm":
        from orchestrator.hosts.slurm import SlurmHost, open_nodes  # only when Slurm is used

        if nodes == 1:
            return SlurmHost(config, events=events)
        members = open_nodes(config, nodes, events=events)
        group = HostGroup(
            name=config.name,
            nodes=tuple(m.name for m in members),
            port_stride=config.port_stride,
            init_address=config.init_address,
        )
        return GroupHost(group, list(members))
    if config.is_local:
        return LocalHost(config)
    from orchestrator.hosts.ssh import SSHHost  # paramiko is only imported when a remote host is used

    return SSHHost(config, accept_new_host_key=accept_new_host_key)


def open_reachable(
    spec: str, *, inventory: str | None = None, accept_new_host_key: bool = False
) -> tuple[GroupHost | None, dict[str, str]] | None:
    """For commands that only look or clean up (hosts check, status, down), when `spec` is an inventory group (else
    None: resolve_host opens it): its nodes that cannot be reached are left out and named with why, in rank order,
    and the others are kept as a GroupHost (None when none could be reached)."""
    group, hosts = lookup(spec, inventory)
    if not isinstance(group, HostGroup):
        return None
    unreachable: dict[str, str] = {}
    opened = _open_nodes(group, hosts, None, accept_new_host_key, unreachable, None)
    return (GroupHost(group, opened) if opened else None), unreachable


def open_group(
    group: HostGroup,
    hosts: dict[str, HostConfig],
    *,
    workdir: str | None,
    accept_new_host_key: bool,
    events: Events | None = None,
) -> Host:
    """Connect to every node of the group (closing those already open if one cannot be reached). A node's lines
    are logged (a group's Slurm node has always logged its queue wait); its phases go to `events`."""
    node_events = None if events is None else Lines(logging.getLogger("orch.slurm").warning, events.phase)
    return GroupHost(group, _open_nodes(group, hosts, workdir, accept_new_host_key, None, node_events))


def _open_nodes(
    group: HostGroup,
    hosts: dict[str, HostConfig],
    workdir: str | None,
    accept_new_host_key: bool,
    unreachable: dict[str, str] | None,
    events: Events | None,
) -> list[Host]:
    """The group's nodes, connected in rank order. Without `unreachable`, one that cannot be reached closes the
    others and raises; with it, that node is recorded there (name: why) and left out."""
    opened: list[Host] = []
    try:
        for name in group.nodes:
            config = replace(hosts[name], workdir=workdir) if workdir else hosts[name]
            try:
                opened.append(open_host(config, accept_new_host_key=accept_new_host_key, events=events))
            except HostError as e:
                # A bad inventory value is the user's to fix, not a node that is down.
                if unreachable is None or isinstance(e, InputError):
                    raise
                unreachable[name] = str(e)
    except BaseException:
        for node in opened:
            with contextlib.suppress(Exception):
                node.close()
        raise
    return opened

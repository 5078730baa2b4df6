"""A port given for a run (`--port`, a nightly item's `port:`): applied to every launched arm, refused if it clashes."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from orchestrator.config.profile import Profile
from orchestrator.errors import InputError
from orchestrator.fields import FieldError, int_range
from orchestrator.hosts.base import HostConfig
from orchestrator.hosts.inventory import HostGroup

LOWEST, HIGHEST = 1, 65535
check_value = int_range(LOWEST, HIGHEST)
# Linux's default; the kernel's own setting (net.ipv4.ip_unprivileged_port_start) wins where it can be read.
PRIVILEGED_BELOW = 1024
UNPRIVILEGED_START = "/proc/sys/net/ipv4/ip_unprivileged_port_start"


def override(profiles: Sequence[Profile], port: int | None) -> list[Profile]:
    """Every arm orch launches serving on `port` (None: on its profile's own). The arms launch one after another,
    never two at once, so one port serves them all; an attached arm's server is where its URL says."""
    if port is None:
        return list(profiles)
    return [p if p.attach is not None else p.with_port(port) for p in profiles]


def unprivileged_start() -> int:
    """The lowest port a user other than root may listen on here."""
    try:
        with open(UNPRIVILEGED_START) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return PRIVILEGED_BELOW


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def clash(
    port: int, profiles: Sequence[Profile], *, local: bool, stride: int | None, where: str = "--port"
) -> str | None:
    """Why the arms cannot serve on `port` (None: they can), before anything is launched. `local`: the servers run
    on this machine (whose rule for privileged ports is known); `stride`: the port_stride of a multi-node host
    (None: not one), as node rank i serves on port + i * stride."""
    try:
        check_value(port)
    except FieldError as e:
        return f"{where}: {e}"
    launched = [p for p in profiles if p.attach is None]
    if not launched:
        return (
            f"{where} {port}: every arm is attached to a server someone else runs (its port is the one in its URL); "
            "nothing is launched to listen on it: drop it"
        )
    for p in profiles:
        if p.attach is None:
            continue
        url = urlsplit(p.attach)
        same_box = _loopback(url.hostname or "") or any(url.hostname == q.host for q in launched)
        if url.port == port and same_box:
            return (
                f"{where} {port}: arm {p.name} is attached to {p.attach}, which holds that port all along, so "
                f"{', '.join(q.name for q in launched)} launched there would find it taken; give another port"
            )
    lowest = unprivileged_start()
    if local and port < lowest and os.geteuid() != 0:
        return (
            f"{where} {port}: ports below {lowest} are privileged on this machine and you are not root, so the "
            f"server could not listen there; give a port from {lowest} to {HIGHEST}"
        )
    for p in launched:
        if p.nnodes < 2 or stride is None:
            continue
        top = port + (p.nnodes - 1) * stride
        if top > HIGHEST:
            return (
                f"{where} {port}: profile {p.name} spans {p.nnodes} nodes and node rank i serves on port + i x the "
                f"host's port_stride ({stride}), so rank {p.nnodes - 1} would need port {top}, above {HIGHEST}; "
                f"give a port of at most {HIGHEST - (p.nnodes - 1) * stride}"
            )
    return None


def check(port: int | None, profiles: Sequence[Profile], target: HostConfig | HostGroup, where: str = "--port") -> None:
    """clash() as an InputError (exit 2) for the arms on a host (`--host` as resolved from the inventory: an opened
    host's config or group says the same); nothing to check without a port."""
    if port is None:
        return
    local = isinstance(target, HostConfig) and target.is_local
    stride: int | None = target.port_stride
    if isinstance(target, HostConfig) and not target.capabilities.allocates_nodes:
        stride = None  # one machine: no node ranks
    problem = clash(port, profiles, local=local, stride=stride, where=where)
    if problem:
        raise InputError(problem)


def recorded(config: Mapping[str, Any], where: str) -> int | None:
    """The port a stored experiment's servers were given (its config's `port`), checked: the record may come from a
    bundle or an older orch."""
    value = config.get("port")
    if value is None:
        return None
    try:
        return int(check_value(value))
    except FieldError as e:
        raise InputError(f"{where}: port: {e}") from None

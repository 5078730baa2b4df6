"""Turning `--host` into a connected Host: this machine, an SSH host or a Slurm allocation (the one module that
knows them all)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from orchestrator.hosts import Host, HostConfig, LocalHost, load_groups, load_inventory, parse_target


def resolve_host(
    spec: str,
    *,
    workdir: str | None = None,
    inventory: str | None = None,
    accept_new_host_key: bool = False,
    on_event: Callable[[str], None] | None = None,
) -> Host:
    """Turn `--host` into a connected Host; `on_event` hears what opening it takes long for (a Slurm queue)."""
    hosts = load_inventory(inventory)
    groups = load_groups(inventory) if hosts else {}
    if spec in groups:
        from orchestrator.multinode import open_group  # several hosts: one multi-node launch spans them

        return open_group(groups[spec], hosts, workdir=workdir, accept_new_host_key=accept_new_host_key)
    config = parse_target(spec, hosts)
    if workdir:
        config = replace(config, workdir=workdir)
    return open_host(config, accept_new_host_key=accept_new_host_key, on_event=on_event)


def open_host(
    config: HostConfig, *, accept_new_host_key: bool = False, on_event: Callable[[str], None] | None = None
) -> Host:
    """A Host for one resolved inventory entry (`scheduler: slurm`, `slurm:PARTITION`, or `user@addr[:port]`)."""
    if config.scheduler == "slurm":
        from orchestrator.slurmhost import SlurmHost  # only when Slurm is used

        return SlurmHost(config, on_event=on_event)
    if config.is_local:
        return LocalHost(config)
    from orchestrator.ssh import SSHHost  # paramiko is only imported when a remote host is used

    return SSHHost(config, accept_new_host_key=accept_new_host_key)

"""Turning `--host` into a connected Host: this machine, or an SSH host (the one module that knows both)."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.hosts import Host, HostConfig, LocalHost, load_groups, load_inventory, parse_target


def resolve_host(
    spec: str,
    *,
    workdir: str | None = None,
    inventory: str | None = None,
    accept_new_host_key: bool = False,
) -> Host:
    """Turn `--host` into a connected Host."""
    hosts = load_inventory(inventory)
    groups = load_groups(inventory) if hosts else {}
    if spec in groups:
        from orchestrator.multinode import open_group  # several hosts: one multi-node launch spans them

        return open_group(groups[spec], hosts, workdir=workdir, accept_new_host_key=accept_new_host_key)
    config = parse_target(spec, hosts)
    if workdir:
        config = replace(config, workdir=workdir)
    return open_host(config, accept_new_host_key=accept_new_host_key)


def open_host(config: HostConfig, *, accept_new_host_key: bool = False) -> Host:
    """A Host for one resolved inventory entry (or `user@addr[:port]`)."""
    if config.is_local:
        return LocalHost(config)
    from orchestrator.ssh import SSHHost  # paramiko is only imported when a remote host is used

    return SSHHost(config, accept_new_host_key=accept_new_host_key)

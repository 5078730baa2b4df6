"""The host inventory (`hosts.yaml`): its hosts as `HostConfig`s, its groups as `HostGroup`s, and `--host` parsing."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from orchestrator import yamlfile
from orchestrator.errors import HostError, InputError, InventoryError
from orchestrator.fields import (
    boolean,
    check_fields,
    choice,
    float_range,
    int_range,
    key_name,
    nonempty_str,
    show,
    str_list,
)
from orchestrator.hosts.base import KINDS, HostConfig

FOREIGN_PORT_POLICIES = ("refuse", "kill-with-force")
HOST_FIELDS = {
    "address": nonempty_str,
    "user": nonempty_str,
    "port": int_range(1, 65535),
    "python": nonempty_str,
    "workdir": nonempty_str,
    "gpus": int_range(0, 1024),
    "gpu_idle_mib": int_range(0, 10_000_000),
    "nvidia_smi": nonempty_str,
    "identity_file": str_list,
    "foreign_port": choice(FOREIGN_PORT_POLICIES),
    "connect_timeout_s": float_range(1.0, 600.0),
    "reconnect_s": float_range(0.0, 3600.0),
    # A host that is a Slurm allocation (hosts/slurm.py): what orch asks Slurm for.
    "scheduler": choice(tuple(k for k, c in KINDS.items() if c.allocates_nodes)),
    "partition": nonempty_str,
    "account": nonempty_str,
    "gres": nonempty_str,
    "time_limit_min": int_range(1, 525_600),
    "exclusive": boolean,
    # A Slurm host's multi-node allocations (profiles with nnodes > 1): as an inventory group's fields.
    "port_stride": int_range(0, 1000),
    "init_address": nonempty_str,
}
SLURM_FIELDS = ("partition", "account", "gres", "time_limit_min", "exclusive", "port_stride", "init_address")
SLURM_PREFIX = "slurm:"
TARGET_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<addr>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>\d+))?\Z"
)


def inventory_paths(explicit: str | None = None) -> list[Path]:
    if explicit:
        return [Path(explicit)]
    env = os.environ.get("ORCH_HOSTS")
    if env:
        return [Path(env)]
    return [Path.cwd() / "hosts.yaml", Path(platformdirs.user_config_dir("orch")) / "hosts.yaml"]


def load_inventory(explicit: str | None = None) -> dict[str, HostConfig]:
    """The first inventory file that exists, validated (its groups too); {} when there is none."""
    return _load(explicit)[0]


def _load(explicit: str | None) -> tuple[dict[str, HostConfig], dict[str, HostGroup]]:
    """The hosts and the groups of the first inventory file that exists, all validated whatever the caller asks
    for: a file whose only entries are invalid groups must be refused, not read as "no hosts"."""
    for path in inventory_paths(explicit):
        if not yamlfile.is_file(path):
            if explicit and yamlfile.exists(path):
                yamlfile.load(path, InventoryError, "host inventory")  # no regular file: refused, saying what it is
            if explicit:
                raise InventoryError(f"{path}: no such host inventory file")
            continue
        data = yamlfile.load(path, InventoryError, "host inventory") or {}
        if not isinstance(data, dict) or set(data) - {"hosts"}:
            raise InventoryError(f"{path}: expected a mapping with one key, 'hosts' (name: settings)")
        entries = data.get("hosts") or {}
        if not isinstance(entries, dict):
            raise InventoryError(f"{path}: hosts: expected a mapping of host name to settings")
        hosts = {}
        for name, settings in entries.items():
            if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z", name):
                raise InventoryError(
                    f"{path}: hosts.{key_name(name)}: invalid host name (letters, digits, '.', '_', '-')"
                )
            if not isinstance(settings, dict):
                raise InventoryError(f"{path}: hosts.{name}: expected a mapping of settings, got {show(settings)}")
            if "nodes" in settings:
                continue  # a group of hosts (_groups, once every host is known)
            values = check_fields(settings, HOST_FIELDS, f"{path}: hosts.{name}", InventoryError)
            _check_scheduler(values, f"{path}: hosts.{name}")
            if name != "local" and "address" not in values and "scheduler" not in values:
                values["address"] = name  # like ssh: a name is also an address or ssh_config alias
            if name == "local" and "address" in values:
                raise InventoryError(
                    f"{path}: hosts.local.address: 'local' is this machine; name the remote host otherwise"
                )
            hosts[name] = HostConfig(name=name, source=str(path), **values)
        return hosts, _groups(path, entries, hosts)
    return {}, {}


def _check_scheduler(values: dict[str, Any], where: str) -> None:
    if values.get("scheduler") is None:
        given = [k for k in SLURM_FIELDS if k in values]
        if given:
            raise InventoryError(f"{where}.{given[0]}: only a Slurm host has it; add `scheduler: slurm`")
        return
    if "address" in values:
        raise InventoryError(
            f"{where}.address: a `scheduler: slurm` host is reached through Slurm's own commands (salloc, srun) "
            "from the machine orch runs on, a login node; remove address"
        )


def parse_target(spec: str, inventory: dict[str, HostConfig]) -> HostConfig:
    """`local`, an inventory name, `slurm:[PARTITION]`, or `[user@]address[:port]` (an ssh_config alias works as
    the address)."""
    if spec in ("local", "localhost", ""):
        return inventory.get("local", HostConfig(name="local"))
    if spec in inventory:
        return inventory[spec]
    if spec.startswith(SLURM_PREFIX):
        partition = spec[len(SLURM_PREFIX) :]
        if partition and not re.match(r"^[A-Za-z0-9_.-]{1,64}\Z", partition):
            raise InputError(f"--host {spec!r}: {partition!r} is not a partition name (letters, digits, '_', '.', '-')")
        return HostConfig(name=spec, scheduler="slurm", partition=partition or None)
    m = TARGET_RE.match(spec)
    if not m:
        raise HostError(f"--host {spec!r}: expected 'local', a name from the host inventory, or user@address[:port]")
    return HostConfig(
        name=spec,
        address=m["addr"].strip("[]"),
        user=m["user"],
        port=int(m["port"]) if m["port"] else None,
    )


GROUP_FIELDS = {"nodes": str_list, "port_stride": int_range(0, 1000), "init_address": nonempty_str}


@dataclass(frozen=True, kw_only=True)
class HostGroup:
    """An inventory group (`gpu-pair: {nodes: [gpu-a, gpu-b]}`): the hosts one multi-node launch spreads over,
    node rank i on nodes[i]."""

    name: str
    nodes: tuple[str, ...]
    port_stride: int = 0  # node rank i serves on the profile's port + i * port_stride (nodes sharing one machine)
    init_address: str | None = None  # where the other nodes reach node rank 0 (default: its inventory address)
    source: str = ""


def load_groups(explicit: str | None = None) -> dict[str, HostGroup]:
    """The inventory's groups (entries with `nodes:`), each node an inventory host; {} without an inventory."""
    return _load(explicit)[1]


def _groups(path: Path, entries: dict[str, Any], hosts: dict[str, HostConfig]) -> dict[str, HostGroup]:
    out = {}
    for name, settings in entries.items():
        if "nodes" not in settings:
            continue
        where = f"{path}: hosts.{name}"
        values = check_fields(settings, GROUP_FIELDS, where, InventoryError)
        nodes = tuple(values.pop("nodes"))
        if not nodes:
            raise InventoryError(f"{where}.nodes: a group needs at least one host")
        for node in nodes:
            if node not in hosts:
                known = ", ".join(sorted(hosts)) or "none"
                raise InventoryError(f"{where}.nodes: {node!r} is not a host of this inventory (its hosts: {known})")
        if len(set(nodes)) != len(nodes):
            raise InventoryError(f"{where}.nodes: a host is listed twice in {list(nodes)}")
        out[name] = HostGroup(name=name, nodes=nodes, source=str(path), **values)
    return out


def lookup(spec: str, explicit: str | None = None) -> tuple[HostGroup | HostConfig, dict[str, HostConfig]]:
    """What `--host` names, from the inventory alone (nothing is connected): an inventory group or one host's entry,
    and the inventory's hosts (a group's nodes among them)."""
    hosts, groups = _load(explicit)
    return (groups[spec] if spec in groups else parse_target(spec, hosts)), hosts

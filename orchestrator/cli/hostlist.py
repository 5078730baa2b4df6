"""`orch hosts list`: each inventory entry as what it is (this machine, an SSH host, a Slurm allocation, a group)."""

from __future__ import annotations

from typing import Any

from orchestrator.errors import OrchError
from orchestrator.hosts.base import KINDS, HostConfig
from orchestrator.hosts.inventory import HostGroup


def host_entry(config: HostConfig) -> dict[str, Any]:
    """One host as JSON. identity_file is left out: a key's path is nobody else's business (and the key no one's)."""
    kind = config.kind
    doc: dict[str, Any] = {"name": config.name, "kind": kind}
    if kind == "ssh":
        doc |= {"address": config.address, "user": config.user, "port": config.port} | _endpoint(config)
    elif config.capabilities.allocates_nodes:
        from orchestrator.hosts.slurm import request_for  # only when the inventory has a Slurm entry

        req = request_for(config)
        doc |= {
            "partition": req.partition,  # None: the cluster's default
            "account": req.account,
            "gres": req.gres,  # what orch asks for: gres, else gpu:<gpus>
            "time_limit_min": req.time_limit_min,
            "exclusive": req.exclusive,
            "port_stride": config.port_stride,
            "init_address": config.init_address,
        }
    return doc | {"python": config.python, "gpus": config.gpus, "workdir": config.workdir, "source": config.source}


def group_entry(group: HostGroup) -> dict[str, Any]:
    return {
        "name": group.name,
        "kind": "group",
        "nodes": list(group.nodes),
        "port_stride": group.port_stride,
        "init_address": group.init_address,
        "source": group.source,
    }


def _endpoint(config: HostConfig) -> dict[str, Any]:
    """What orch will really connect to: ssh_config fills in what the inventory leaves unset."""
    from orchestrator.hosts.ssh import effective_endpoint  # paramiko is slow to import; only SSH entries need it

    try:
        ep = effective_endpoint(config)
    except OrchError as e:
        return {"endpoint": None, "ssh_config_host": None, "endpoint_error": str(e)}
    alias = None if ep.hostname == config.address else config.address
    return {"endpoint": ep.display, "ssh_config_host": alias}


def entry_line(doc: dict[str, Any]) -> str:
    """One entry as `orch hosts list` prints it."""
    if doc["kind"] == "group":
        extra = [f"port_stride {doc['port_stride']}"] if doc["port_stride"] else []
        extra += [f"init_address {doc['init_address']}"] if doc["init_address"] else []
        where = "group: " + ", ".join(doc["nodes"]) + (f" ({', '.join(extra)})" if extra else "")
        return f"{doc['name']}  {where}  [{doc['source']}]"
    if doc["kind"] == "local":
        where = "this machine"
    elif doc["kind"] == "ssh":
        alias = f" (ssh_config Host {doc['ssh_config_host']})" if doc["ssh_config_host"] else ""
        where = f"{doc['address']} ({doc['endpoint_error']})" if doc["endpoint"] is None else doc["endpoint"] + alias
    else:
        where = f"{KINDS[doc['kind']].allocator}: " + ", ".join(_slurm_parts(doc))
    gpus = f"  gpus={doc['gpus']}" if doc["gpus"] is not None else ""
    workdir = f"  workdir={doc['workdir']}" if doc["workdir"] else ""
    return f"{doc['name']}  {where}  python={doc['python'] or 'default'}{gpus}{workdir}  [{doc['source']}]"


def _slurm_parts(doc: dict[str, Any]) -> list[str]:
    parts = [f"partition {doc['partition']}" if doc["partition"] else "the default partition"]
    parts += [f"account {doc['account']}"] if doc["account"] else []
    parts += ["exclusive" if doc["exclusive"] else "shared"]
    parts += [f"GRES {doc['gres']}"] if doc["gres"] else ["no GRES"]
    parts += [f"{doc['time_limit_min']} min"]
    parts += [f"port_stride {doc['port_stride']}"] if doc["port_stride"] else []
    parts += [f"init_address {doc['init_address']}"] if doc["init_address"] else []
    return parts

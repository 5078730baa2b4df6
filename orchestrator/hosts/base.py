"""Hosts: the inventory, and one interface for running orch's host-side work locally or over SSH."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import platformdirs

from orchestrator import hostside, yamlfile
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
    "scheduler": choice(("slurm",)),
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
NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# The host lock's directory: host-wide, so HOME and --workdir cannot give two sessions two locks.
LOCK_DIR = "/tmp"
TARGET_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<addr>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>\d+))?$"
)


def default_namespace() -> str:
    """Which launches this orch may clean up: its own namespace only (tests use a private one)."""
    ns = os.environ.get("ORCH_NAMESPACE", "default")
    if not NAMESPACE_RE.match(ns):
        raise HostError(f"ORCH_NAMESPACE={ns!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'")
    return ns


def host_lock_path(namespace: str) -> str:
    """One orch session per host (and namespace), whatever HOME or --workdir each session uses."""
    return f"{LOCK_DIR}/orch-{namespace}.lock"


@dataclass(frozen=True)
class HostConfig:
    """One host of the inventory (or a `user@addr[:port]` given on the command line)."""

    name: str
    address: str | None = None  # None: this machine
    user: str | None = None
    port: int | None = None
    python: str | None = None  # None: python3 remotely, orch's own interpreter locally
    workdir: str | None = None
    gpus: int | None = None  # expected GPU count; None: don't check
    gpu_idle_mib: int = 2048  # a GPU whose memory.used is at or below this counts as idle
    nvidia_smi: str = "nvidia-smi"
    identity_file: tuple[str, ...] = ()
    foreign_port: str = "refuse"  # what to do about a port held by a process orch did not launch
    connect_timeout_s: float = 10.0
    reconnect_s: float = 60.0  # how long to keep trying after the connection drops
    source: str = ""
    scheduler: str | None = None  # "slurm": each session runs in an allocation of its own
    partition: str | None = None  # None: the cluster's default partition
    account: str | None = None
    gres: str | None = None  # None: `gpu:<gpus>` when gpus is set, else no GRES asked for
    time_limit_min: int = 60
    exclusive: bool = True
    port_stride: int = 0  # a multi-node allocation: node rank i serves on port + i * port_stride (shared machines)
    init_address: str | None = None  # a multi-node allocation: where ranks reach rank 0 (default: its NodeAddr)

    @property
    def is_local(self) -> bool:
        return self.address is None and self.scheduler is None


def inventory_paths(explicit: str | None = None) -> list[Path]:
    if explicit:
        return [Path(explicit)]
    env = os.environ.get("ORCH_HOSTS")
    if env:
        return [Path(env)]
    return [Path.cwd() / "hosts.yaml", Path(platformdirs.user_config_dir("orch")) / "hosts.yaml"]


def load_inventory(explicit: str | None = None) -> dict[str, HostConfig]:
    """The first inventory file that exists, validated; {} when there is none."""
    for path in inventory_paths(explicit):
        if not yamlfile.is_file(path):
            if explicit:
                raise InventoryError(f"{path}: no such host inventory file")
            continue
        data = yamlfile.load(path, InventoryError, "host inventory") or {}
        if not isinstance(data, dict) or set(data) - {"hosts"}:
            raise InventoryError(f"{path}: expected a mapping with one key, 'hosts' (name: settings)")
        hosts = data.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise InventoryError(f"{path}: hosts: expected a mapping of host name to settings")
        out = {}
        for name, settings in hosts.items():
            if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", name):
                raise InventoryError(
                    f"{path}: hosts.{key_name(name)}: invalid host name (letters, digits, '.', '_', '-')"
                )
            if not isinstance(settings, dict):
                raise InventoryError(f"{path}: hosts.{name}: expected a mapping of settings, got {show(settings)}")
            if "nodes" in settings:
                continue  # a group of hosts (load_groups)
            values = check_fields(settings, HOST_FIELDS, f"{path}: hosts.{name}", InventoryError)
            _check_scheduler(values, f"{path}: hosts.{name}")
            if name != "local" and "address" not in values and "scheduler" not in values:
                values["address"] = name  # like ssh: a name is also an address or ssh_config alias
            if name == "local" and "address" in values:
                raise InventoryError(
                    f"{path}: hosts.local.address: 'local' is this machine; name the remote host otherwise"
                )
            out[name] = HostConfig(name=name, source=str(path), **values)
        return out
    return {}


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
        if partition and not re.match(r"^[A-Za-z0-9_.-]{1,64}$", partition):
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


@dataclass
class CallStats:
    """Round trips to the host-side agent, and SSH channels opened (one per tunnelled HTTP connection, the agent's
    session, SFTP); orchestration overhead is dominated by these over SSH."""

    calls: int = 0
    seconds: float = 0.0
    by_op: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0
    channels: int = 0
    channels_by_kind: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, op: str, seconds: float) -> None:
        with self._lock:  # tunnels and the main thread may call concurrently
            self.calls += 1
            self.seconds += seconds
            self.by_op[op] = self.by_op.get(op, 0) + 1

    def record_channel(self, kind: str) -> None:
        with self._lock:
            self.channels += 1
            self.channels_by_kind[kind] = self.channels_by_kind.get(kind, 0) + 1


# What a long host-side operation reports while it runs (hostside.report): a state, a log line, a step begun.
Progress = Callable[[dict[str, Any]], None]


class Host(ABC):
    """Where servers run. Every host-side action goes through `call`, so local and SSH share one code path."""

    name: str
    config: HostConfig
    python: str
    workdir: str
    stats: CallStats
    # PYTHONPATH that lets the host's Python import orchestrator.sim (None: it already can).
    sim_pythonpath: str | None = None

    def call(
        self, op: str, *, call_timeout: float | None = None, on_progress: Progress | None = None, **args: Any
    ) -> Any:
        """Run one host-side operation; `call_timeout` bounds a remote call that is expected to take long, and
        `on_progress` hears what the operation reports while it runs (in this thread)."""
        t0 = time.perf_counter()
        try:
            reply = self._roundtrip({"op": op, "args": args}, call_timeout, on_progress)
        finally:
            self.stats.record(op, time.perf_counter() - t0)
        if not reply.get("ok"):
            raise HostError(f"{self.name}: {reply.get('error', 'host-side call failed')}")
        return reply.get("result")

    @abstractmethod
    def _roundtrip(
        self, request: dict[str, Any], timeout: float | None = None, on_progress: Progress | None = None
    ) -> dict[str, Any]:
        """Send one request to the host-side agent and return its decoded reply."""

    @abstractmethod
    def url(self, port: int, address: str = "127.0.0.1") -> str:
        """Base URL at which orch reaches a server listening on address:port of this host."""

    @property
    def reach_address(self) -> str | None:
        """Where other machines reach this host (a multi-node launch's rank 0), when orch knows it."""
        return self.config.address

    @property
    def lock_path(self) -> str:
        """The host lock: one orch session per host at a time."""
        return host_lock_path(default_namespace())

    def ensure_connected(self, force: bool = False) -> None:  # noqa: B027 - optional hook
        """Re-establish the connection if it dropped (bounded); the local host is always there."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections, tunnels and the host lock."""

    def members(self) -> list[Host]:
        """The machines behind this host: itself, or every node of an inventory group (`orch down`/`status` act on
        each)."""
        return [self]

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalHost(Host):
    """This machine. Requests still go through JSON so behaviour matches a remote agent exactly."""

    def __init__(self, config: HostConfig | None = None, workdir: str | None = None) -> None:
        self.config = config or HostConfig(name="local")
        if workdir:
            self.config = replace(self.config, workdir=workdir)
        self.name = "local"
        self.python = self.config.python or sys.executable
        self.workdir = self.config.workdir or platformdirs.user_state_dir("orch")
        self.stats = CallStats()

    def _roundtrip(
        self, request: dict[str, Any], timeout: float | None = None, on_progress: Progress | None = None
    ) -> dict[str, Any]:
        listen = contextlib.nullcontext() if on_progress is None else hostside.reporting_to(_as_json(on_progress))
        with listen:
            reply = hostside.dispatch(json.loads(json.dumps(request)))
        decoded: dict[str, Any] = json.loads(json.dumps(reply))
        return decoded

    def url(self, port: int, address: str = "127.0.0.1") -> str:
        return f"http://{_bracket(address)}:{port}"

    def close(self) -> None:
        # The lock of an in-process agent lives in this process; release it like a remote agent's exit would.
        hostside.op_unlock(self.lock_path)


def _as_json(on_progress: Progress) -> Progress:
    # What a remote agent's heartbeat would carry: the same JSON round trip as the request and the reply.
    return lambda data: on_progress(json.loads(json.dumps(data)))


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def connect_address(bind: str) -> str:
    """Where to connect to a server bound to `bind`: a wildcard bind is reached on loopback."""
    return "127.0.0.1" if bind in ("0.0.0.0", "", "::", "[::]") else bind.strip("[]")


def check_host(host: Host, namespace: str) -> list[tuple[str, str]]:
    """`orch hosts check`: one (ok|warn|fail, text) per fact that matters before benchmarking on this host."""
    cfg = host.config
    r = host.call("check", workdir=host.workdir, nvidia_smi=cfg.nvidia_smi)
    out: list[tuple[str, str]] = [("ok", f"connected to {host.name} ({getattr(host, 'display', 'this machine')})")]
    py = tuple(int(x) for x in r["python"].split(".")[:2])
    out.append(("ok" if py >= (3, 8) else "fail", f"python {r['python']} at {r['python_executable']}"))
    out.append(("ok", f"psutil {r['psutil']}"))
    out.append(
        ("ok", f"sglang {r['sglang']}")
        if r["sglang"]
        else (
            "warn",
            f"sglang is not installed for {r['python_executable']} (SGLang profiles can only run with --sim; "
            "vLLM and llama.cpp profiles need their own packages)",
        )
    )
    out.append(("ok", f"torch {r['torch']}") if r["torch"] else ("warn", "torch is not installed"))
    # An older agent does not send import_errors.
    for name, error in (r.get("import_errors") or {}).items():
        out.append(("warn", f"{name} is installed but `import {name}` fails with {r['python_executable']}: {error}"))
    gpus = r["gpus"]
    if not gpus["available"]:
        out.append(("fail" if cfg.gpus else "warn", f"GPUs: {gpus['error']}"))
    else:
        n = len(gpus["gpus"])
        if cfg.gpus is not None and n != cfg.gpus:
            out.append(("fail", f"{n} GPUs found, the inventory expects {cfg.gpus}"))
        else:
            out.append(("ok", f"{n} GPUs: {', '.join(sorted({str(g.get('name')) for g in gpus['gpus']}))}"))
        for g in gpus["gpus"]:
            used, total = g.get("memory.used"), g.get("memory.total")
            busy = isinstance(used, int | float) and used > cfg.gpu_idle_mib
            free = total - used if isinstance(total, int | float) and isinstance(used, int | float) else "?"
            out.append(("warn" if busy else "ok", f"GPU {g['index']}: {free} MiB free of {total} MiB"))
        for a in gpus["apps"]:
            owner = f"orch launch {a['launch_id']}" if a.get("launch_id") else "not launched by orch"
            out.append(
                ("warn", f"GPU process PID {a['pid']} ({a.get('cmdline')}, {a.get('used_memory')} MiB): {owner}")
            )
    free_gib = r["disk_free_bytes"] / 2**30
    out.append(("ok" if free_gib >= 1 else "warn", f"{free_gib:.1f} GiB free for the work dir {r['workdir']}"))
    if not r["setsid"]:
        out.append(("fail", "setsid is not installed (util-linux); orch cannot detach servers"))
    if r["kill_user_processes"]:
        out.append(
            (
                "warn",
                "systemd-logind KillUserProcesses=yes: servers may die when the SSH session ends "
                "(enable lingering: loginctl enable-linger USER)",
            )
        )
    running = host.call("find", namespace=namespace)
    launches = sorted({p["launch_id"] for p in running})
    if launches:
        out.append(("warn", f"orch launches still running: {', '.join(launches)} (orch down --host {host.name})"))
    else:
        out.append(("ok", "no orch launches running"))
    return out


GROUP_FIELDS = {"nodes": str_list, "port_stride": int_range(0, 1000), "init_address": nonempty_str}


@dataclass(frozen=True)
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
    hosts = load_inventory(explicit)
    for path in inventory_paths(explicit):
        if not yamlfile.is_file(path):
            continue
        entries = (yamlfile.load(path, InventoryError, "host inventory") or {}).get("hosts") or {}
        out = {}
        for name, settings in entries.items():
            if not (isinstance(settings, dict) and "nodes" in settings):
                continue
            where = f"{path}: hosts.{name}"
            values = check_fields(settings, GROUP_FIELDS, where, InventoryError)
            nodes = tuple(values.pop("nodes"))
            if not nodes:
                raise InventoryError(f"{where}.nodes: a group needs at least one host")
            for node in nodes:
                if node not in hosts:
                    known = ", ".join(sorted(hosts)) or "none"
                    raise InventoryError(
                        f"{where}.nodes: {node!r} is not a host of this inventory (its hosts: {known})"
                    )
            if len(set(nodes)) != len(nodes):
                raise InventoryError(f"{where}.nodes: a host is listed twice in {list(nodes)}")
            out[name] = HostGroup(name=name, nodes=nodes, source=str(path), **values)
        return out
    return {}

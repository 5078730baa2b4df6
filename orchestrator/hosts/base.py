"""The `Host` interface every transport implements, its `HostConfig`, call counts, and the namespace."""

from __future__ import annotations

import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import HostError

NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")


def default_namespace() -> str:
    """Which launches this orch may clean up: its own namespace only (tests use a private one)."""
    ns = os.environ.get("ORCH_NAMESPACE", "default")
    if not NAMESPACE_RE.match(ns):
        raise HostError(f"ORCH_NAMESPACE={ns!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'")
    return ns


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a kind of host does. Code outside hosts/ asks these instead of naming a kind, so a new kind of host (a
    `k8s:NAMESPACE`, say) is a row of KINDS plus its Host class, not an edit wherever Slurm is special."""

    kind: str  # what `orch hosts list` and the nightly's --check call it
    # Each session asks a scheduler for nodes of its own: as many as the profiles need (so one entry holds a
    # multi-node launch, whose node ranks may share a machine: port_stride), for a time limit (a plan may outlast
    # it), from a pool that a resumed experiment may move within (a new allocation lands on other nodes), and
    # a nightly may fan such items out, each in its own allocation.
    allocates_nodes: bool = False
    allocator: str | None = None  # who allocates, as users name it in messages ("Slurm")


KINDS: dict[str, Capabilities] = {
    "local": Capabilities(kind="local"),
    "ssh": Capabilities(kind="ssh"),
    "slurm": Capabilities(kind="slurm", allocates_nodes=True, allocator="Slurm"),
}


@dataclass(frozen=True, kw_only=True)
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

    @property
    def kind(self) -> str:
        """local, ssh, or the scheduler's name: its row of KINDS."""
        return self.scheduler or ("local" if self.address is None else "ssh")

    @property
    def capabilities(self) -> Capabilities:
        return KINDS[self.kind]

    @property
    def allocation_pool(self) -> tuple[str, str | None] | None:
        """Where a host that allocates nodes gets them (its kind and partition; None: not such a host). Two entries
        of one pool are one host to a resumed experiment."""
        return (self.kind, self.partition) if self.capabilities.allocates_nodes else None


@dataclass(kw_only=True)
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


# What a long host-side operation reports while it runs (agent/ops.report): a state, a log line, a step begun.
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


def connect_address(bind: str) -> str:
    """Where to connect to a server bound to `bind`: a wildcard bind is reached on loopback."""
    return "127.0.0.1" if bind in ("0.0.0.0", "", "::", "[::]") else bind.strip("[]")

"""An inventory group (or a multi-node Slurm allocation) as one host: node rank 0's host answers every call."""

from __future__ import annotations

import contextlib
from typing import Any

from orchestrator.hosts.base import Host, Progress
from orchestrator.hosts.inventory import HostGroup


class GroupHost(Host):
    """An inventory group as one `--host`: node rank 0's host answers every call (facts, the benchmark, the
    fingerprint) and serves the API; `nodes` are every host of the group, in rank order."""

    def __init__(self, group: HostGroup, nodes: list[Host]) -> None:
        self.group, self.nodes = group, nodes
        first = nodes[0]
        self.name, self.config, self.python, self.workdir = group.name, first.config, first.python, first.workdir
        self.stats = first.stats

    @property
    def sim_pythonpath(self) -> str | None:  # type: ignore[override]
        return self.nodes[0].sim_pythonpath

    def call(
        self, op: str, *, call_timeout: float | None = None, on_progress: Progress | None = None, **args: Any
    ) -> Any:
        return self.nodes[0].call(op, call_timeout=call_timeout, on_progress=on_progress, **args)

    def _roundtrip(
        self, request: dict[str, Any], timeout: float | None = None, on_progress: Progress | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError("GroupHost.call goes to node rank 0's host")

    def url(self, port: int, address: str = "127.0.0.1") -> str:
        return self.nodes[0].url(port, address)

    def ensure_connected(self, force: bool = False) -> None:
        for node in self.nodes:
            node.ensure_connected(force)

    def members(self) -> list[Host]:
        return list(self.nodes)

    def close(self) -> None:
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                node.close()

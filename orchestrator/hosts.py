"""Hosts: one interface for running orch's host-side work locally or (later) over SSH."""

from __future__ import annotations

import json
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from orchestrator import hostside
from orchestrator.errors import HostError


@dataclass
class CallStats:
    """Round trips to the host-side agent; orchestration overhead is dominated by these over SSH."""

    calls: int = 0
    seconds: float = 0.0
    by_op: dict[str, int] = field(default_factory=dict)


class Host(ABC):
    """Where servers run. Every host-side action goes through `call`, so local and SSH share one code path."""

    name: str
    python: str
    workdir: str
    stats: CallStats

    def call(self, op: str, **args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            reply = self._roundtrip({"op": op, "args": args})
        finally:
            self.stats.calls += 1
            self.stats.seconds += time.perf_counter() - t0
            self.stats.by_op[op] = self.stats.by_op.get(op, 0) + 1
        if not reply.get("ok"):
            raise HostError(f"{self.name}: {reply.get('error', 'host-side call failed')}")
        return reply.get("result")

    @abstractmethod
    def _roundtrip(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request to the host-side agent and return its decoded reply."""

    @abstractmethod
    def url(self, port: int) -> str:
        """Base URL at which orch reaches a server listening on `port` of this host."""

    def close(self) -> None:  # noqa: B027 - optional hook: the local host holds nothing to release
        """Release connections."""

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalHost(Host):
    """This machine. Requests still go through JSON so behaviour matches a remote agent exactly."""

    def __init__(self, workdir: str | None = None, python: str | None = None) -> None:
        self.name = "local"
        self.python = python or sys.executable
        self.workdir = workdir or str(Path(platformdirs.user_state_dir("orch")))
        self.stats = CallStats()

    def _roundtrip(self, request: dict[str, Any]) -> dict[str, Any]:
        reply = hostside.dispatch(json.loads(json.dumps(request)))
        decoded: dict[str, Any] = json.loads(json.dumps(reply))
        return decoded

    def url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"


def resolve_host(spec: str, *, workdir: str | None = None) -> Host:
    """`local` (the default) for now; SSH inventories and user@addr[:port] come with remote hosts."""
    if spec in ("local", "localhost", ""):
        return LocalHost(workdir=workdir)
    raise HostError(
        f"unknown host {spec!r}: only 'local' is supported in this version (SSH hosts are not implemented yet)"
    )

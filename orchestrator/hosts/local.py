"""This machine as a host: the agent's operations in-process, through the JSON round trip of a remote agent."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import replace
from typing import Any

import platformdirs

from orchestrator.agent import ops
from orchestrator.hosts.base import CallStats, Host, HostConfig, Progress
from orchestrator.hosts.lock import host_lock_path, release_in_process


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
        listen = contextlib.nullcontext() if on_progress is None else ops.reporting_to(_as_json(on_progress))
        with listen:
            # As the agent decodes it: a run's token ids shared, not one int object each (ops.decode_request).
            reply = ops.dispatch(ops.decode_request(json.dumps(request)))
        decoded: dict[str, Any] = json.loads(json.dumps(reply))
        return decoded

    def url(self, port: int, address: str = "127.0.0.1") -> str:
        return f"http://{_bracket(address)}:{port}"

    def close(self) -> None:
        # The lock of an in-process agent lives in this process; release it like a remote agent's exit would.
        release_in_process(host_lock_path())


def _as_json(on_progress: Progress) -> Progress:
    # What a remote agent's heartbeat would carry: the same JSON round trip as the request and the reply.
    return lambda data: on_progress(json.loads(json.dumps(data)))


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address else address

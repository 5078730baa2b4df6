"""The client side of orch's host-side agent protocol, whatever carries it: ids, heartbeats, progress, deadlines."""

from __future__ import annotations

import hashlib
import json
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from orchestrator.agent import ops
from orchestrator.hosts.base import Progress
from orchestrator.ui import progress

# Slow operations get their own deadline on top of the arguments that make them slow.
BASE_CALL_TIMEOUT_S = 60.0
# The agent heartbeats every ops.HEARTBEAT_S while a request runs; this much silence means a dead path.
SILENCE_S = 6 * ops.HEARTBEAT_S
# The arguments of an operation that make it take long: its deadline grows by them.
SLOW_ARGS = ("grace_s", "port_wait_s", "wait_s", "gpu_wait_s", "timeout_s")


class ConnectionLost(Exception):
    """The path to the agent (SSH transport and channel, or a Slurm step) went away; starting another may help."""


def call_timeout(request: dict[str, Any], timeout: float | None = None) -> float:
    """How long orch waits for the answer to `request`: `timeout`, else the base plus its slow arguments."""
    if timeout is not None:
        return timeout
    args = request.get("args", {})
    return BASE_CALL_TIMEOUT_S + sum(float(args.get(k) or 0) for k in SLOW_ARGS)


class Stream(ABC):
    """The agent's stdin and stdout as bytes, however they travel."""

    @abstractmethod
    def send(self, data: bytes) -> None:
        """Write all of `data`; ConnectionLost when the path is gone."""

    @abstractmethod
    def recv(self, timeout: float) -> bytes | None:
        """What the agent wrote next: None when nothing came within `timeout`, b"" at EOF; ConnectionLost when the
        path is gone."""

    @abstractmethod
    def close(self) -> None:
        """Close the agent's stdin (it exits on EOF) and let go of the path."""


class AgentLink:
    """One running agent: one request at a time, its reply found by id among heartbeats and stale answers."""

    def __init__(self, stream: Stream, first_id: int = 0) -> None:
        self.stream = stream
        self.seq = first_id
        self._buffer = b""

    def line(self, deadline: float, what: str, timeout: float, heard: float | None = None) -> bytes:
        """The agent's next line; ConnectionLost at `deadline` (`timeout` after the request), at EOF, or after
        SILENCE_S without a byte since `heard` (None: no silence limit)."""
        while b"\n" not in self._buffer:
            now = time.monotonic()
            if now >= deadline:
                raise ConnectionLost(f"no answer to {what} within {timeout:.0f}s")
            if heard is not None and now - heard > SILENCE_S:
                # The agent heartbeats every few seconds while it works: silence means the path is dead even if
                # the transport has not noticed yet.
                raise ConnectionLost(f"nothing from the agent for {SILENCE_S:.0f}s during {what}")
            data = self.stream.recv(min(deadline - now, 1.0))
            if data is None:
                continue
            if not data:
                raise ConnectionLost("the agent closed the channel")
            self._buffer += data
            if heard is not None:
                heard = time.monotonic()
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def request(self, request: dict[str, Any], timeout: float, on_progress: Progress | None = None) -> dict[str, Any]:
        """Send one request and read its reply, by id, under our own deadlines. Heartbeats carrying an operation's
        progress events go to on_progress, a run's live counts to the display."""
        self.seq += 1
        rid = self.seq
        self.stream.send((json.dumps({**request, "id": rid}) + "\n").encode())
        start = time.monotonic()
        deadline = start + timeout
        heard = start
        while True:
            line = self.line(deadline, request["op"], timeout, heard)
            heard = time.monotonic()
            reply: dict[str, Any] = json.loads(line)
            if reply.get("id") == rid and isinstance(reply.get("progress"), dict):
                progress.remote_live(reply["progress"])
            if reply.get("id") == rid and isinstance(reply.get("event"), dict) and on_progress is not None:
                on_progress(reply["event"])
            if reply.get("id") != rid or reply.get("heartbeat"):
                continue  # a heartbeat, or the late answer to a request we gave up on
            return reply


# What a host needs to run orch's agent, its benchmark client and the simulator: whole packages of stdlib + psutil
# code, shipped as they are (tests/test_imports.py holds them to that; tests/agent/test_ops.py runs the agent,
# and the client, from these files alone). A module joins the host side by living in one of them.
SHIPPED_PACKAGES = ("agent", "client", "common", "sim")
# The agent's entry on the host, beside the `orchestrator/` folder so that its imports find the shipped packages:
# the agent package's own __main__.py, so there is one source for both ways of starting it.
AGENT_ENTRY = "orch_agent.py"


def agent_files() -> dict[str, bytes]:
    """The agent's files by their path on the host: AGENT_ENTRY beside an `orchestrator/` folder holding the package's
    __init__ and every module of SHIPPED_PACKAGES."""
    package = Path(ops.__file__).resolve().parent.parent  # orchestrator/
    files = {
        AGENT_ENTRY: (package / "agent" / "__main__.py").read_bytes(),
        "orchestrator/__init__.py": (package / "__init__.py").read_bytes(),
    }
    for name in SHIPPED_PACKAGES:
        for path in sorted((package / name).rglob("*.py")):
            files[path.relative_to(package.parent).as_posix()] = path.read_bytes()
    return files


def agent_version(files: dict[str, bytes]) -> str:
    """A digest of the files: each version is installed once per host, beside older ones."""
    h = hashlib.sha256()
    for name, data in sorted(files.items()):
        h.update(name.encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:12]

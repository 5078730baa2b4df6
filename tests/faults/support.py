"""What every fault-suite scenario checks: nothing of the launch remains, the port is free, runs are stored, the
message is plain (no traceback), the exit code is right."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.agent import ops, teardown
from tests.conftest import NAMESPACE, REPO

FAST = ("--warmup", "0", "--min-run-s", "0", "--grace", "2", "--gpu-wait", "0")


@dataclass
class Outcome:
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def orch_env(home: Path | None = None, **extra: str) -> dict[str, str]:
    """The test's environment; with `home`, a second user-like session (own HOME and XDG dirs)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    if home is not None:
        env["HOME"] = str(home)
        for var in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
            env[var] = str(home / var.lower())
    return env


def start(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env or orch_env(),
        stdin=subprocess.DEVNULL,
    )


def run(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> Outcome:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        env=env or orch_env(),
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def port_free(port: int, wait_s: float = 3.0) -> bool:
    """Nothing listens on it (TIME_WAIT leftovers of closed connections don't count: a server can bind again)."""
    deadline = time.monotonic() + wait_s
    while teardown._listening(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def assert_plain(text: str) -> None:
    """No Python traceback of orch's own and no "unexpected" error (a server's log tail may quote its own)."""
    assert not any(line.startswith("Traceback") for line in text.splitlines()), text
    assert "Error: unexpected" not in text, text


def assert_nothing_left(port: int | None = None) -> None:
    left = ops.op_find(NAMESPACE)
    assert left == [], f"left running: {left}"
    if port is not None:
        assert port_free(port), f"port {port} still in use"


def stored(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.execute(sql).fetchall())
    finally:
        conn.close()

"""Test isolation: a private orch namespace and private user dirs, and a sweep of anything this session launched."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import markers

# Set before orch modules read them: launches made by these tests carry this namespace in their marker, so
# cleanup in the tests can never reach a server a developer started by hand (or another test session's).
NAMESPACE = f"test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
os.environ["ORCH_NAMESPACE"] = NAMESPACE

# A suite started in the background of a non-interactive shell (`make test &` in a script, nohup, cron) inherits
# SIGINT ignored, and so would every orch these tests start: the tests of Ctrl-C would fail and an orch they interrupt
# would keep its host lock. Python's own handler here makes the children start with the default disposition again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Fast simulator defaults for tests: short load and warmup; real calibration of decode speed.
FAST_SIM = {"load_s": 0.3, "warmup_s": 0.3, "drain_s": 0.2}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the item's fixtures: a module-scoped sshd or Slurm cluster starts inside its first test's setup.
    markers.current[:] = [item]


@pytest.fixture(autouse=True)
def _private_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path_factory.mktemp("xdg")
    for var in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(base / var.lower()))
    # A developer's own inventory or ~/.ssh/config must not change what the tests connect to.
    monkeypatch.delenv("ORCH_HOSTS", raising=False)
    monkeypatch.setenv("ORCH_SSH_CONFIG", str(base / "no-ssh-config"))


@pytest.fixture(scope="session", autouse=True)
def _sweep_namespace() -> Iterator[None]:
    yield
    from orchestrator.agent import ops

    leftovers = ops.op_find(NAMESPACE)
    ops.op_down(NAMESPACE, grace_s=2)
    # A leak is a bug in orch or in a test: fail loudly after cleaning it up.
    assert not leftovers, f"tests left orch-launched processes running: {leftovers}"


StepClock = Callable[[float], None]


@pytest.fixture
def stepped_clock(monkeypatch: pytest.MonkeyPatch) -> StepClock:
    """step(seconds): the wall clock stepped (NTP, a VM resumed, `date -s`), as psutil sees it. psutil's create_time()
    is the boot time plus the process's start ticks, and the kernel derives the boot time from the wall clock, so a
    step moves the boot time and every create_time with it; nothing else changes (processes, /proc/PID/stat)."""
    import psutil

    platform = psutil._psplatform  # type: ignore[attr-defined]  # what Process.create_time() and boot_time() read
    real = platform.boot_time

    def step(seconds: float) -> None:
        monkeypatch.setattr(platform, "boot_time", lambda: real() + seconds)

    return step


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> int:
    """A port p with p .. p+n-1 all free (a multi-node launch on one machine: rank i serves on p + i), drawn below
    Linux's ephemeral range (32768-60999). free_port's kernel-chosen port sits inside that range, where p + 1 may be
    any outgoing connection's local port by the time a rank binds it (CI saw exactly that)."""
    draw = random.SystemRandom()
    for _ in range(200):
        first = draw.randrange(20000, 32768 - n)
        socks: list[socket.socket] = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports below 32768 in 200 tries")


@pytest.fixture
def profile_dir(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    d.mkdir()
    return d


WriteProfile = Callable[..., Path]


@pytest.fixture
def write_profile(profile_dir: Path) -> WriteProfile:
    """Write profiles/<name>.yaml from keyword fields; returns its path."""

    def write(name: str, text: str | None = None, **fields: Any) -> Path:
        path = profile_dir / f"{name}.yaml"
        path.write_text(text if text is not None else yaml.safe_dump(fields, sort_keys=False))
        return path

    return write


@pytest.fixture
def sim_profiles(write_profile: WriteProfile) -> Callable[..., dict[str, Path]]:
    """A small set of simulator-backed profiles on free ports: a base, a baseline and an EAGLE-3 arm."""

    def make(sim: dict[str, Any] | None = None, env: dict[str, Any] | None = None) -> dict[str, Path]:
        knobs = {**FAST_SIM, **(sim or {})}
        base = write_profile(
            "base",
            engine="sglang",
            model_path="/models/test-model",
            tp_size=2,
            port=free_port(),
            ready_timeout_s=30,
            env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", **(env or {})},
            sim=knobs,
        )
        baseline = write_profile("baseline", extends="base")
        eagle = write_profile(
            "eagle3",
            extends="base",
            port=free_port(),
            speculative={
                "algorithm": "EAGLE3",
                "draft_model_path": "/models/draft",
                "num_steps": 3,
                "eagle_topk": 1,
                "num_draft_tokens": 4,
            },
        )
        return {"base": base, "baseline": baseline, "eagle3": eagle}

    return make


REPO = Path(__file__).resolve().parent.parent


def run_orch(*args: str, cwd: Path, merge_stderr: bool = False) -> subprocess.Popen[str]:
    """`orch ARGS` as a real subprocess (signals, exit codes, stdout/stderr as a user sees them)."""
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """proc's (stdout, stderr) once it exits; past `timeout`, it is stopped as a user would (Ctrl-C, then SIGTERM)
    so that orch tears down what it launched — a server left behind would fail every later test of this worker —
    and the test fails saying so."""
    try:
        out, err = proc.communicate(timeout=timeout)
        return out, err or ""
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.terminate()
            out, err = proc.communicate(timeout=60)
        pytest.fail(f"orch ran past {timeout:g}s and was stopped (exit {proc.returncode}):\n{out[-3000:]}{err or ''}")


def wait_for_line(proc: subprocess.Popen[str], needle: str, seen: list[str] | None = None) -> None:
    """Read proc's stdout until a line contains needle (fails with everything read if it never does)."""
    seen = [] if seen is None else seen
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"{needle!r} never appeared:\n{''.join(seen)}")

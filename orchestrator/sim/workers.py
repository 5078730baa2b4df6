"""Spawned child processes standing in for SGLang's schedulers and detokenizer (they only load and wait)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import NoReturn

from orchestrator.sim import logs

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
# orch's launch marker (agent/processes.MARKER); named here because the simulator must not import the agent.
LAUNCH_MARKER = "ORCH_LAUNCH_ID"
REEXEC_TAG = "orch-sim:reexec-no-marker"

# The program the reexec-no-marker worker becomes: stdlib only (the new environment need not find orchestrator),
# deaf to SIGTERM/SIGHUP/SIGINT like a wedged helper, and gone by itself after its linger time.
_REEXEC_CODE = """\
import os, signal, sys, time
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
time.sleep(float(sys.argv[2]))
sys.stderr.write("[orch-sim] FAULT reexec-no-marker: pid %d reached escape_linger_s and exits\\n" % os.getpid())
"""


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """Everything a worker needs; pickled to the spawned child."""

    role: str  # "scheduler" or "detokenizer"
    rank: int
    parent_pid: int
    load_s: float
    log_level: str
    disable_cuda_graph: bool = False
    fault_exit: bool = False
    fault_hang: bool = False
    escape: bool = False
    escape_linger_s: float = 600.0
    double_fork: bool = False
    reexec: bool = False
    name: str | None = None  # the process title when the imitated engine names its processes otherwise

    @property
    def title(self) -> str:
        if self.name:
            return self.name
        return f"sim:sched_TP{self.rank}" if self.role == "scheduler" else "sim:detok"

    @property
    def prefix(self) -> str:
        return f" TP{self.rank}" if self.role == "scheduler" else ""


def _prctl(option: int, arg: int | bytes) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        value = ctypes.c_char_p(arg) if isinstance(arg, bytes) else ctypes.c_ulong(arg)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def set_pdeathsig(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send sig when the parent dies (Linux only; False elsewhere), as SGLang's children do."""
    return _prctl(PR_SET_PDEATHSIG, int(sig))


def set_comm_name(name: str) -> bool:
    """Set /proc/PID/comm (15 bytes max) so the worker is recognisable in ps/top."""
    return _prctl(PR_SET_NAME, name.encode()[:15])


class _Stop(Exception):
    pass


def _wait(conn: Connection, seconds: float | None, escape: bool, prefix: str = "") -> None:
    """Wait up to seconds (None: forever) while honouring 'stop'/'die' messages and parent EOF."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return
        step = 0.2 if remaining is None else min(0.2, remaining)
        try:
            if conn.poll(step):
                msg = conn.recv()
                if msg == "die":
                    # worker-hang-after-tokens: a TP worker crashing mid-generation (no cleanup, no goodbye).
                    logs.log("FAULT worker-hang-after-tokens: this scheduler hard-exits now", "error", prefix)
                    os._exit(1)
                if msg == "stop" and not escape:
                    raise _Stop
        except (EOFError, OSError):
            if not escape:
                raise _Stop from None
            # The escaped worker deliberately ignores the parent going away; it only sleeps from now on.
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            time.sleep(remaining if remaining is not None else 3600.0)
            if deadline is not None:
                return


def run_worker(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a spawned worker."""
    started = time.monotonic()
    logs.set_level(spec.log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business
    if spec.escape:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        logs.log(
            f"FAULT escape-setsid: this scheduler (pid {os.getpid()}) called setsid(), has no parent-death "
            f"signal and ignores SIGTERM and pipe EOF; it lingers until SIGKILL or {spec.escape_linger_s:g} s",
            "warning",
            spec.prefix,
        )
    elif spec.reexec:
        # No parent-death signal: it survives exec, and the point of this fault is a process that outlives the
        # server under another program; SIGTERM (e.g. orch signalling the group) is when it escapes.
        signal.signal(signal.SIGTERM, lambda _sig, _frame: _reexec(spec))
    else:
        # SIG_IGN survives exec, so a main process deaf to SIGTERM (fault) would otherwise pass that on.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        set_pdeathsig()
    if not spec.escape and os.getppid() != spec.parent_pid:
        # The parent died before the death signal was armed.
        os._exit(0)
    set_comm_name(spec.title)
    if spec.double_fork:
        _double_fork(spec, conn)
    try:
        _run(spec, conn)
    except _Stop:
        if spec.reexec:
            _reexec(spec)
        return
    if spec.escape:
        left = spec.escape_linger_s - (time.monotonic() - started)
        if left > 0:
            with contextlib.suppress(_Stop):
                _wait(conn, left, escape=True)
        logs.log("FAULT escape-setsid: escaped scheduler reached escape_linger_s and exits", "warning", spec.prefix)


def _double_fork(spec: WorkerSpec, conn: Connection) -> None:
    """escape-double-fork: leave a grandchild in its own session, reparented away from this worker's tree."""
    worker_pid = os.getpid()
    child = os.fork()
    if child:
        # The intermediate child exits at once; reap it so nothing of it lingers as a zombie.
        os.waitpid(child, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        conn.close()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        set_comm_name("sim:escaped")
        logs.log(
            f"FAULT escape-double-fork: pid {os.getpid()}, a grandchild of this scheduler (pid {worker_pid}) "
            "reparented away from it, runs in its own session with the launch marker, ignores SIGTERM and lingers "
            f"until SIGKILL or {spec.escape_linger_s:g} s",
            "warning",
            spec.prefix,
        )
        time.sleep(spec.escape_linger_s)
        logs.log("FAULT escape-double-fork: escaped grandchild reached escape_linger_s and exits", "warning")
    finally:
        os._exit(0)


def _reexec(spec: WorkerSpec) -> NoReturn:
    """reexec-no-marker: become another long-running program, same PID, new session, environment unmarked."""
    env = {k: v for k, v in os.environ.items() if k != LAUNCH_MARKER}
    logs.log(
        f"FAULT reexec-no-marker: this {spec.role} (pid {os.getpid()}) calls setsid() and re-execs "
        f"{sys.executable} without {LAUNCH_MARKER}; it ignores SIGTERM and lingers until SIGKILL or "
        f"{spec.escape_linger_s:g} s",
        "warning",
        spec.prefix,
    )
    with contextlib.suppress(OSError):
        os.setsid()
    argv = [sys.executable, "-c", _REEXEC_CODE, REEXEC_TAG, repr(spec.escape_linger_s)]
    os.execve(sys.executable, argv, env)


def _run(spec: WorkerSpec, conn: Connection) -> None:
    p = spec.prefix
    if spec.role == "detokenizer":
        conn.send({"status": "ready", "pid": os.getpid(), "role": spec.role, "rank": spec.rank})
        _wait(conn, None, escape=False, prefix=p)
        return
    logs.log(f"Load weight begin (simulated: sleeping load_s={spec.load_s:g} s instead of loading)", prefix=p)
    if spec.fault_exit:
        _wait(conn, spec.load_s / 2, escape=False)
        logs.log(
            "Scheduler hit an exception: Traceback (most recent call last):\n"
            "RuntimeError: [orch-sim] simulated failure while loading weights (fault exit-during-load)",
            "error",
            p,
        )
        os._exit(1)
    _wait(conn, spec.load_s, escape=spec.escape)
    if spec.fault_hang:
        logs.log("FAULT hang-during-load: this scheduler never finishes loading", "warning", p)
        _wait(conn, None, escape=False)
        return
    logs.log("Load weight end. (simulated)", prefix=p)
    logs.log("KV Cache is allocated. (simulated)", prefix=p)
    if not spec.disable_cuda_graph:
        logs.log("Capture cuda graph end. (simulated)", prefix=p)
    conn.send({"status": "ready", "pid": os.getpid(), "role": spec.role, "rank": spec.rank})
    if not spec.escape:
        _wait(conn, None, escape=False, prefix=p)

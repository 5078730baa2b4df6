#!/usr/bin/env python3
"""A fake `nvidia-smi` for tests: GPU usage derived from live processes read from /proc (stdlib only)."""

# GPU users on this machine:
#   (a) every live process whose environ has ORCH_LAUNCH_ID and whose command line has --multiprocessing-fork
#       (the simulator's spawned workers): the k-th of a launch (by start time, then PID) holds GPU k mod gpus,
#       WORKER_MIB each;
#   (b) every live process whose environ has FAKE_GPU_MIB=<n> (a "foreign" user started by a test): n MiB on
#       GPU FAKE_GPU_INDEX (default 0). FAKE_GPU_MIB wins over (a) for a process that has both.
# Only processes of its own test session count (hermetic: another orch or test run on this machine is invisible):
# with FAKE_NVIDIA_SMI_SCOPE=<namespace> (baked in by `install`), (a) needs a marker of that namespace and (b) needs
# FAKE_GPU_SCOPE=<namespace> in its environ.
# An optional JSON state file (env FAKE_NVIDIA_SMI_STATE, else the path `install` baked into the wrapper) may
# override: {"gpus": 8, "extra_used_mib": {"3": 50000}, "fail": "error text -> exit 1",
# "busy_clock_mhz": {"0": 1980}} (the SM clock a busy GPU reports, e.g. a throttled one; default 2430),
# "name": "NVIDIA H100 80GB HBM3" (the GPU model, to pretend to be another machine),
# "power_w": {"0": 300.5} (the power a busy GPU draws; default 412.80 W, an idle one 62.15 W),
# "no_instant": true (an older driver: no power.draw.instant or power.draw.average, in --help-query-gpu or queries).
# With no arguments it prints the usual status header (driver and CUDA version) and a one-line GPU table.
# `-lms N` (`--loop-ms=N`) repeats a --query-gpu every N ms, as the real one does, until SIGINT (exit 0) or SIGTERM,
# or until its reader goes away, and at most LOOP_MAX_S in all (a leaked loop ends by itself); `--help-query-gpu`
# lists the fields it answers.
# It only reads /proc; it never signals anything.

from __future__ import annotations

import datetime
import json
import os
import stat
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "ORCH_LAUNCH_ID"
FORK_FLAG = b"--multiprocessing-fork"
NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
DRIVER = "575.57.08"
CUDA = "12.9"
TOTAL_MIB = 97887
IDLE_MIB = 4
WORKER_MIB = 80000
DEFAULT_GPUS = 8
_UUID_NS = uuid.UUID("6f1c1f3e-8a52-4c64-9a8e-2b7f4f0f3c11")

EXIT_FAIL = 1
EXIT_UNSUPPORTED = 9  # what the brief asks for any invocation this fake doesn't implement
BUSY_W = 412.80
IDLE_W = 62.15
LOOP_MAX_S = 600.0
RESCAN_S = 1.0  # a loop reads /proc at most this often (who holds a GPU changes rarely within a run)
NEWER_FIELDS = ("power.draw.instant", "power.draw.average")  # what "no_instant" (an older driver) lacks


def gpu_uuid(index: int) -> str:
    """A stable, real-looking UUID for GPU `index`."""
    return "GPU-" + str(uuid.uuid5(_UUID_NS, f"fake-gpu-{index}"))


@dataclass
class GpuProc:
    pid: int
    name: str
    gpu: int
    mib: int


@dataclass
class Gpu:
    index: int
    extra_mib: int = 0
    procs: list[GpuProc] = field(default_factory=list)
    busy_clock_mhz: int = 2430
    name: str = NAME
    busy_w: float = BUSY_W

    @property
    def busy(self) -> bool:
        return bool(self.procs) or self.extra_mib > 0

    @property
    def used(self) -> int:
        return min(TOTAL_MIB, IDLE_MIB + self.extra_mib + sum(p.mib for p in self.procs))


# ---- /proc reading ---------------------------------------------------------------------------------------------


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat_fields(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) from /proc/PID/stat, or None if gone."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    # The comm field may hold spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return rest[0].decode(), int(rest[19])
    except (IndexError, ValueError):
        return None


def _scan(gpus: int) -> list[GpuProc]:
    me = os.getpid()
    scope = os.environ.get("FAKE_NVIDIA_SMI_SCOPE") or None
    # launch id -> [(start ticks, pid, name)]
    workers: dict[str, list[tuple[int, int, str]]] = {}
    out: list[GpuProc] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        env_raw = _read(f"/proc/{pid}/environ")
        if not env_raw or (b"FAKE_GPU_MIB=" not in env_raw and MARKER.encode() not in env_raw):
            continue
        st = _stat_fields(pid)
        if st is None or st[0] in ("Z", "X"):  # zombies and dead processes hold no GPU memory
            continue
        env: dict[str, str] = {}
        for item in env_raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep:
                env[key.decode(errors="replace")] = value.decode(errors="replace")
        cmd = _read(f"/proc/{pid}/cmdline") or b""
        argv0 = cmd.split(b"\0", 1)[0].decode(errors="replace")
        name = argv0 or "[unknown]"
        if "FAKE_GPU_MIB" in env:
            if scope is not None and env.get("FAKE_GPU_SCOPE") != scope:
                continue
            try:
                mib = int(env["FAKE_GPU_MIB"])
                index = int(env.get("FAKE_GPU_INDEX", "0"))
            except ValueError:
                continue
            out.append(GpuProc(pid, name, index % gpus, mib))
        elif MARKER in env and FORK_FLAG in cmd.split(b"\0") and (scope is None or env[MARKER].startswith(scope + ":")):
            workers.setdefault(env[MARKER], []).append((st[1], pid, name))
    for members in workers.values():
        for k, (_, pid, name) in enumerate(sorted(members)):
            out.append(GpuProc(pid, name, k % gpus, WORKER_MIB))
    out.sort(key=lambda p: (p.gpu, p.pid))
    return out


# ---- state and formatting --------------------------------------------------------------------------------------


def _load_state() -> dict[str, object]:
    path = os.environ.get("FAKE_NVIDIA_SMI_STATE")
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"fake nvidia-smi state {path} must be a JSON object")
    return data


def _gpus(state: dict[str, object]) -> list[Gpu]:
    count = state.get("gpus", os.environ.get("FAKE_NVIDIA_SMI_GPUS", DEFAULT_GPUS))
    n = int(count) if isinstance(count, (int, str)) else DEFAULT_GPUS
    gpus = [Gpu(i) for i in range(n)]
    extra = state.get("extra_used_mib") or {}
    if isinstance(extra, dict):
        for key, mib in extra.items():
            i = int(key)
            if 0 <= i < n:
                gpus[i].extra_mib += int(mib)
    clocks = state.get("busy_clock_mhz") or {}
    if isinstance(clocks, dict):
        for key, mhz in clocks.items():
            if 0 <= int(key) < n:
                gpus[int(key)].busy_clock_mhz = int(mhz)
    if isinstance(state.get("name"), str):
        for g in gpus:
            g.name = str(state["name"])
    watts = state.get("power_w") or {}
    if isinstance(watts, dict):
        for key, w in watts.items():
            if 0 <= int(key) < n:
                gpus[int(key)].busy_w = float(w)
    for proc in _scan(n):
        gpus[proc.gpu].procs.append(proc)
    return gpus


GPU_FIELDS: dict[str, Callable[[Gpu], str]] = {
    "index": lambda g: str(g.index),
    "name": lambda g: g.name,
    "driver_version": lambda g: DRIVER,
    "memory.total": lambda g: str(TOTAL_MIB),
    "memory.used": lambda g: str(g.used),
    "memory.free": lambda g: str(TOTAL_MIB - g.used),
    "temperature.gpu": lambda g: "61" if g.busy else "34",
    "clocks.sm": lambda g: str(g.busy_clock_mhz) if g.busy else "1410",
    "power.draw": lambda g: _watts(g),
    "power.draw.instant": lambda g: _watts(g),
    "power.draw.average": lambda g: _watts(g),
    "timestamp": lambda g: _timestamp(),
    "uuid": lambda g: gpu_uuid(g.index),
    "persistence_mode": lambda g: "Enabled",
    "ecc.mode.current": lambda g: "Enabled",
    "mig.mode.current": lambda g: "[N/A]",
    "power.limit": lambda g: "600.00",
    "clocks.applications.graphics": lambda g: "2430",
    "clocks.applications.memory": lambda g: "12481",
    "utilization.gpu": lambda g: "100" if g.procs else "0",
}


def _watts(g: Gpu) -> str:
    return f"{g.busy_w if g.busy else IDLE_W:.2f}"


def _timestamp() -> str:
    # nvidia-smi's own format: local time to the millisecond.
    return datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


APP_FIELDS: dict[str, Callable[[GpuProc], str]] = {
    "pid": lambda p: str(p.pid),
    "process_name": lambda p: p.name,
    "used_memory": lambda p: str(p.mib),
    "gpu_uuid": lambda p: gpu_uuid(p.gpu),
}


def _unsupported(argv: Sequence[str], why: str) -> int:
    print(f"{why}\nInvalid combination of input arguments ({' '.join(argv)!r}). Please run 'nvidia-smi -h' for help.")
    return EXIT_UNSUPPORTED


@dataclass
class Invocation:
    """What one command line asks for."""

    query: tuple[str, list[str]] | None = None  # (--query-gpu or --query-compute-apps, the fields)
    fmt: str | None = None
    list_gpus: bool = False
    loop_ms: int | None = None
    help_query: bool = False


def _parse(argv: Sequence[str]) -> Invocation | str:
    """The invocation, or why this fake refuses it."""
    inv = Invocation()
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, _, value = arg.partition("=")
        if arg in ("-lms", "--loop-ms") or key == "--loop-ms":
            text = value if key == "--loop-ms" and value else (args.pop(0) if args else "")
            if not text.isdigit() or int(text) <= 0:
                return f"Invalid loop interval {text!r}."
            inv.loop_ms = int(text)
        elif arg == "--help-query-gpu" and len(argv) == 1:
            inv.help_query = True
        elif key in ("--query-gpu", "--query-compute-apps") and value:
            if inv.query is not None:
                return "Only one query is supported."
            inv.query = (key, [f.strip() for f in value.split(",")])
        elif key == "--format" and value:
            inv.fmt = value
        elif arg in ("-L", "--list-gpus"):
            inv.list_gpus = True
        else:
            return f"Unsupported argument {arg!r} in the fake nvidia-smi."
    return inv


def _refusal(inv: Invocation) -> str | None:
    """Why a parsed invocation cannot be answered, or None."""
    if inv.list_gpus == (inv.query is not None):
        return "Expected exactly one of -L or --query-gpu=/--query-compute-apps=."
    if inv.query is not None and inv.fmt != "csv,noheader,nounits":
        return "The fake nvidia-smi supports only --format=csv,noheader,nounits."
    if inv.query is not None:
        table = GPU_FIELDS if inv.query[0] == "--query-gpu" else APP_FIELDS
        for name in inv.query[1]:
            if name not in table:
                return f'Field "{name}" is not a valid field to query.'
    if inv.loop_ms is not None and (inv.query is None or inv.query[0] != "--query-gpu"):
        return "The fake nvidia-smi loops (-lms) only a --query-gpu."
    return None


def main(argv: Sequence[str]) -> int:
    """Answer one nvidia-smi invocation; returns the exit status."""
    if not argv:
        return _header()
    inv = _parse(argv)
    if isinstance(inv, str):
        return _unsupported(argv, inv)
    if inv.help_query:
        return _help_query_gpu()
    if (why := _refusal(inv)) is not None:
        return _unsupported(argv, why)
    query, list_gpus = inv.query, inv.list_gpus

    state = _load_state()
    if state.get("no_instant") and query is not None and (old := [f for f in query[1] if f in NEWER_FIELDS]):
        return _unsupported(argv, f'Field "{old[0]}" is not a valid field to query.')
    if state.get("fail"):
        print(str(state["fail"]))
        return EXIT_FAIL
    if inv.loop_ms is not None and query is not None:
        return _loop(state, query[1], inv.loop_ms)
    gpus = _gpus(state)
    lines: list[str] = []
    if list_gpus:
        lines = [f"GPU {g.index}: {g.name} (UUID: {gpu_uuid(g.index)})" for g in gpus]
    elif query is not None and query[0] == "--query-gpu":
        lines = [", ".join(GPU_FIELDS[f](g) for f in query[1]) for g in gpus]
    elif query is not None:
        lines = [", ".join(APP_FIELDS[f](p) for f in query[1]) for g in gpus for p in g.procs]
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _loop(state: dict[str, object], fields: list[str], every_ms: int) -> int:
    """The query's rows every every_ms until SIGINT (as Ctrl+C ends the real loop: exit 0), SIGTERM, a closed
    stdout, or LOOP_MAX_S."""
    end = time.monotonic() + LOOP_MAX_S
    gpus, scanned = _gpus(state), time.monotonic()
    try:
        while time.monotonic() < end:
            if time.monotonic() - scanned >= RESCAN_S:
                gpus, scanned = _gpus(state), time.monotonic()
            sys.stdout.write("".join(", ".join(GPU_FIELDS[f](g) for f in fields) + "\n" for g in gpus))
            sys.stdout.flush()
            time.sleep(every_ms / 1000)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        os._exit(0)  # its reader is gone: end now, without the interpreter's exit flush into the closed pipe
    return 0


def _help_query_gpu() -> int:
    """The fields this fake answers, quoted as the real help lists them (an older driver's without NEWER_FIELDS)."""
    state = _load_state()
    names = [f for f in GPU_FIELDS if not (state.get("no_instant") and f in NEWER_FIELDS)]
    print('List of valid properties to query for the switch "--query-gpu=":\n')
    for name in names:
        print(f'"{name}"\nA reading of the fake nvidia-smi.\n')
    return 0


def _header() -> int:
    """The plain `nvidia-smi` status, reduced to the lines orch reads (the header's driver and CUDA versions)."""
    state = _load_state()
    if state.get("fail"):
        print(str(state["fail"]))
        return EXIT_FAIL
    print(f"| NVIDIA-SMI {DRIVER}              Driver Version: {DRIVER}      CUDA Version: {CUDA}     |")
    for g in _gpus(state):
        print(f"|   {g.index}  {g.name[:28]:<28} On |  {g.used}MiB / {TOTAL_MIB}MiB |")
    return 0


def install(dir: Path, state: Path, gpus: int = DEFAULT_GPUS) -> Path:
    """Write `dir/nvidia-smi`, a sh wrapper running this file with the installer's Python; returns `dir`.

    The wrapper bakes in `state` (the JSON state path) and `gpus` as defaults; FAKE_NVIDIA_SMI_STATE and
    FAKE_NVIDIA_SMI_GPUS in the caller's environment still win. The state file need not exist. It also bakes in
    the caller's ORCH_NAMESPACE as its scope: it sees only that namespace's launches and FAKE_GPU_SCOPE'd users.
    """
    scope = os.environ.get("ORCH_NAMESPACE", "")
    dir.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).resolve()
    wrapper = dir / "nvidia-smi"

    def q(value: object) -> str:
        return "'" + str(value).replace("'", "'\"'\"'") + "'"

    wrapper.write_text(
        "#!/bin/sh\n"
        f'[ -n "${{FAKE_NVIDIA_SMI_STATE-}}" ] || FAKE_NVIDIA_SMI_STATE={q(state)}\n'
        f'[ -n "${{FAKE_NVIDIA_SMI_GPUS-}}" ] || FAKE_NVIDIA_SMI_GPUS={int(gpus)}\n'
        f'[ -n "${{FAKE_NVIDIA_SMI_SCOPE-}}" ] || FAKE_NVIDIA_SMI_SCOPE={q(scope)}\n'
        "export FAKE_NVIDIA_SMI_STATE FAKE_NVIDIA_SMI_GPUS FAKE_NVIDIA_SMI_SCOPE\n"
        f'exec {q(sys.executable)} {q(script)} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return dir


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (ValueError, OSError) as exc:
        print(f"fake nvidia-smi: {exc}", file=sys.stderr)
        sys.exit(EXIT_FAIL)

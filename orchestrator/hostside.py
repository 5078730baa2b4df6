"""Host-side agent: the work orch does *on* a host (launch, find, inspect, kill, benchmark), JSON in/out.

The local host calls `dispatch()` in-process; a remote host runs this same file with the host's Python
(`python3 hostside.py --serve`, one JSON request per line). It needs only the stdlib, psutil, and the shipped
stdlib-only `orchestrator/redaction.py`, `orchestrator/client.py` and `orchestrator/sim/` (`ssh.agent_files()`):
keep every other orchestrator import out of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import platform
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from orchestrator.redaction import REDACTED, hide_argv, redact, scrub

PROTOCOL_VERSION = 2  # 2: request ids echoed, heartbeats while a request runs
MARKER = "ORCH_LAUNCH_ID"
# Which orch session a launch belongs to: "<pid>:<start time>" of the process that launched it on the host (orch
# itself for the local host, the agent over SSH; the agent exits when orch or its connection dies). A launch whose
# owner is alive belongs to a live session, and no other session may tear it down.
OWNER = "ORCH_OWNER"
# Variables that change what an inference server does even when no profile set them.
RELEVANT_PREFIXES = ("NCCL_", "CUDA_", "SGLANG_", "TORCH_", "PYTORCH_", "NVIDIA_", "OMP_", "HF_", "TRITON_")

# Launch detached: a new session (so the whole tree is one process group we can signal), stdin from /dev/null,
# output to the log, and the PID written from inside before exec so it is the server's own PID.
_LAUNCH_SH = (
    "pidfile=$1; log=$2; shift 2; "
    'setsid sh -c \'echo $$ > "$0"; exec "$@"\' "$pidfile" "$@" > "$log" 2>&1 < /dev/null &'
)


class HostSideError(Exception):
    """A failure the caller should show to the user as a HostError."""


def _gone(proc: psutil.Process) -> bool:
    # Orphans whose parent is a non-reaping PID 1 linger as zombies: for us they are dead. is_running() also
    # compares the creation time, so a PID reused by a new process does not count as ours still running.
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return True


def _environ(proc: psutil.Process) -> dict[str, str] | None:
    try:
        return proc.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None


def _cmdline(proc: psutil.Process, limit: int = 300) -> str:
    try:
        # Display only (status, port owners, GPU processes): a plain mask, no digest, so no key is needed here.
        text = scrub(" ".join(hide_argv(proc.cmdline(), lambda _: REDACTED))) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _marked(match: Callable[[str], bool]) -> list[tuple[psutil.Process, str]]:
    out = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        env = _environ(proc)
        if not env:
            continue
        launch_id = env.get(MARKER)
        if launch_id is not None and match(launch_id) and not _gone(proc):
            out.append((proc, launch_id))
    return out


def _describe(proc: psutil.Process, launch_id: str | None = None) -> dict[str, Any]:
    try:
        ppid, pgid = proc.ppid(), os.getpgid(proc.pid)
    except (psutil.NoSuchProcess, ProcessLookupError, psutil.AccessDenied):
        ppid, pgid = None, None
    return {"pid": proc.pid, "ppid": ppid, "pgid": pgid, "cmdline": _cmdline(proc), "launch_id": launch_id}


def _self_owner() -> str:
    return f"{os.getpid()}:{psutil.Process().create_time():.3f}"


def owner_state(owner: str | None) -> str:
    """`me` (this process launched it), `alive` (another live orch session), `dead`, or `unknown` (no owner)."""
    if not owner:
        return "unknown"
    if owner == _self_owner():
        return "me"
    pid_text, _, created = owner.partition(":")
    try:
        proc = psutil.Process(int(pid_text))
        same = abs(proc.create_time() - float(created)) < 0.01  # a reused PID is another process
        return "alive" if same and not _gone(proc) else "dead"
    except (psutil.NoSuchProcess, ValueError):
        return "dead"
    except psutil.AccessDenied:
        return "alive"  # another user's live process: certainly not ours to judge dead


# ---------------------------------------------------------------- operations


def op_hello() -> dict[str, Any]:
    return {"protocol": PROTOCOL_VERSION, "python": sys.version.split()[0], "psutil": psutil.__version__}


# Run by the host's Python: what `import NAME` gives (its __version__, or why the import failed) and what the
# package metadata says, both as that interpreter with this environment sees them.
_IMPORT_PROBE = """\
import importlib, json, sys
try:
    import importlib.metadata as md
except ImportError:
    md = None
out = {}
for name in sys.argv[1:]:
    r = out[name] = {}
    try:
        v = getattr(importlib.import_module(name), "__version__", None)
        r["version"] = None if v is None else str(v)
    except BaseException as e:
        r["error"] = (type(e).__name__ + ": " + str(e))[:300]
    try:
        r["metadata"] = md.version(name) if md else None
    except Exception:
        r["metadata"] = None
sys.stdout.write("\\nORCH_PROBE " + json.dumps(out) + "\\n")
"""
# Importing sglang pulls in torch (seconds, more on a cold disk); it must stay well inside the agent call's
# own 60 s deadline.
IMPORT_PROBE_TIMEOUT_S = 30.0


def _import_probe(
    names: tuple[str, ...], *, python: str | None = None, script: str = _IMPORT_PROBE
) -> dict[str, dict[str, Any]]:
    """{name: {"version", "error", "metadata"}} as a child of `python` (default: this one) sees them; {} if the
    child failed."""
    try:
        # A separate process: importing torch/sglang into the agent would cost memory for the whole session and
        # could initialise CUDA in a process that must stay light. Not cached: it runs once per experiment.
        done = subprocess.run(
            [python or sys.executable, "-c", script, *names],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            timeout=IMPORT_PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    # Packages may print while importing; only the probe's own last line counts.
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("ORCH_PROBE ")]
    try:
        result: dict[str, dict[str, Any]] = json.loads(lines[-1][len("ORCH_PROBE ") :]) if lines else {}
    except ValueError:
        result = {}
    return result


def _version(name: str, probe: dict[str, dict[str, Any]] | None = None) -> str | None:
    """The version `import name` gives (its __version__), else the installed distribution's metadata."""
    found = (probe if probe is not None else _import_probe((name,))).get(name)
    if found is not None:
        return str(found.get("version") or found.get("metadata") or "") or None
    try:  # the probe itself failed (e.g. timed out): the agent's own view of the metadata is all there is
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _engine_versions() -> dict[str, Any]:
    probe = _import_probe(("sglang", "torch"))
    out: dict[str, Any] = {"sglang": _version("sglang", probe), "torch": _version("torch", probe)}
    # Installed but not importable is worth saying: the server would fail the same way.
    out["import_errors"] = {n: r["error"] for n, r in probe.items() if r.get("error") and out.get(n)}
    return out


def op_facts(nvidia_smi: str = "nvidia-smi") -> dict[str, Any]:
    """Host facts for the fingerprint: what could make two sessions' numbers differ."""
    vm = psutil.virtual_memory()
    gpus = op_gpus(nvidia_smi)
    return {
        "hostname": socket.gethostname(),
        "os": platform.system(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "psutil": psutil.__version__,
        **{k: v for k, v in _engine_versions().items() if k != "import_errors"},
        "cpu_count": psutil.cpu_count(),
        "mem_total_bytes": vm.total,
        "boot_time": psutil.boot_time(),
        "gpus": [
            {k: g.get(k) for k in ("index", "name", "driver_version", "memory.total", "uuid")} for g in gpus["gpus"]
        ],
        "gpu_error": gpus["error"],
    }


GPU_FIELDS = (
    "index",
    "name",
    "driver_version",
    "memory.total",
    "memory.used",
    "temperature.gpu",
    "clocks.sm",
    "power.draw",
    "uuid",
    "utilization.gpu",
)
APP_FIELDS = ("pid", "used_memory", "gpu_uuid")


def _csv_query(nvidia_smi: str, query: str, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    cmd = [nvidia_smi, f"--query-{query}={','.join(fields)}", "--format=csv,noheader,nounits"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise HostSideError(f"{shlex.join(cmd)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
    rows = []
    for line in proc.stdout.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(fields):
            raise HostSideError(f"unexpected nvidia-smi output line: {line!r}")
        rows.append({f: _number(v) for f, v in zip(fields, values, strict=True)})
    return rows


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None if text in ("[N/A]", "N/A", "[Not Supported]") else text


def op_gpus(nvidia_smi: str = "nvidia-smi") -> dict[str, Any]:
    """GPU state and GPU processes from nvidia-smi; each process annotated with its command and orch marker."""
    if shutil.which(nvidia_smi) is None:
        return {"available": False, "error": f"{nvidia_smi} not found on PATH", "gpus": [], "apps": []}
    try:
        gpus = _csv_query(nvidia_smi, "gpu", GPU_FIELDS)
        apps = _csv_query(nvidia_smi, "compute-apps", APP_FIELDS)
    except (HostSideError, OSError, subprocess.TimeoutExpired) as e:
        return {"available": False, "error": str(e), "gpus": [], "apps": []}
    index_of = {g["uuid"]: g["index"] for g in gpus}
    for app in apps:
        app["gpu_index"] = index_of.get(app.get("gpu_uuid"))
        try:
            proc = psutil.Process(int(app["pid"]))
            app["cmdline"] = _cmdline(proc)
            app["launch_id"] = (_environ(proc) or {}).get(MARKER)
        except (psutil.NoSuchProcess, ValueError, TypeError):
            app["cmdline"], app["launch_id"] = "?", None
    return {"available": True, "error": None, "gpus": gpus, "apps": apps}


def op_check(workdir: str, nvidia_smi: str = "nvidia-smi") -> dict[str, Any]:
    """What `orch hosts check` reports: interpreter, packages, GPUs, disk, logind's process killing."""
    target = workdir
    while target and not os.path.exists(target):
        target = os.path.dirname(target)
    disk = shutil.disk_usage(target or "/")
    return {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "psutil": psutil.__version__,
        **_engine_versions(),
        "gpus": op_gpus(nvidia_smi),
        "workdir": workdir,
        "disk_free_bytes": disk.free,
        "kill_user_processes": _logind_kills_user_processes(),
        "setsid": shutil.which("setsid") is not None,
    }


# The fingerprint's probe: the import probe, then NCCL as torch sees it and the interpreter's own version, written
# again (the last ORCH_PROBE line is the one read).
_FINGERPRINT_PROBE = (
    _IMPORT_PROBE
    + """\
import platform
out["python"] = {"version": platform.python_version()}
r = out["nccl"] = {}
try:
    if "torch" not in sys.modules:
        raise ImportError("torch is not importable")
    v = sys.modules["torch"].cuda.nccl.version()
    r["version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except BaseException as e:
    r["error"] = (type(e).__name__ + ": " + str(e))[:300]
sys.stdout.write("\\nORCH_PROBE " + json.dumps(out) + "\\n")
"""
)
# nvidia-smi --query-gpu field -> fingerprint key. Clocks and power *under load* are read during the runs (gpus_json);
# these are the settings that decide them.
FINGERPRINT_GPU_FIELDS = {
    "name": "model",
    "driver_version": "driver",
    "memory.total": "memory_total_mib",
    "persistence_mode": "persistence_mode",
    "ecc.mode.current": "ecc_mode",
    "mig.mode.current": "mig_mode",
    "power.limit": "power_limit_w",
    "clocks.applications.graphics": "app_clock_graphics_mhz",
    "clocks.applications.memory": "app_clock_memory_mhz",
    "uuid": "uuids",
}


def _read_first_line(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.readline().strip() or None
    except OSError:
        return None


def _container_id() -> tuple[str | None, str | None]:
    """(container id, why it could not be read): best effort from the cgroup paths and mounts of this process."""
    pattern = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")
    for path in ("/proc/self/cgroup", "/proc/1/cpuset", "/proc/self/mountinfo"):
        try:
            with open(path) as f:
                found = pattern.search(f.read())
        except OSError:
            continue
        if found:
            return found.group(1)[:12], None
    if any(os.path.exists(p) for p in ("/.dockerenv", "/run/.containerenv")):
        return None, "in a container whose id is not visible in /proc"
    return None, None  # most likely not in a container: nothing to report as unreadable


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _fingerprint_gpus(nvidia_smi: str, unreadable: list[dict[str, str]]) -> dict[str, Any] | None:
    """GPU settings, one value per field when every GPU agrees (else the per-GPU list)."""
    if shutil.which(nvidia_smi) is None:
        unreadable.append({"field": "gpus", "why": f"{nvidia_smi} not found on PATH"})
        return None
    fields = tuple(FINGERPRINT_GPU_FIELDS)
    try:
        rows = _csv_query(nvidia_smi, "gpu", fields)
    except (HostSideError, OSError, subprocess.TimeoutExpired) as e:
        # An older driver refuses the whole query for one unknown field: ask field by field to say which.
        rows, why, failed = [], str(e), []
        for name in fields:
            try:
                column = _csv_query(nvidia_smi, "gpu", (name,))
            except (HostSideError, OSError, subprocess.TimeoutExpired) as e1:
                failed.append({"field": f"gpus.{FINGERPRINT_GPU_FIELDS[name]}", "why": str(e1)[:600]})
                continue
            rows = rows or [{} for _ in column]
            for row, value in zip(rows, column, strict=False):
                row.update(value)
        if not rows:  # nothing answers: one reason, not one per field
            unreadable.append({"field": "gpus", "why": why[:600]})
            return None
        unreadable.extend(failed)
    out: dict[str, Any] = {"count": len(rows)}
    for name, key in FINGERPRINT_GPU_FIELDS.items():
        values = [row.get(name) for row in rows]
        out[key] = values if key == "uuids" or len(set(map(str, values))) > 1 else values[0]
    out["cuda"] = None
    try:
        header = subprocess.run(
            [nvidia_smi], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        ).stdout
        found = re.search(r"CUDA Version:\s*([0-9][0-9.]*)", header)
        out["cuda"] = found.group(1) if found else None
        if not found:
            unreadable.append({"field": "gpus.cuda", "why": "no 'CUDA Version' in nvidia-smi's header"})
    except (OSError, subprocess.SubprocessError) as e:
        unreadable.append({"field": "gpus.cuda", "why": str(e)[:300]})
    return out


def op_fingerprint(
    python: str | None = None,
    packages: list[str] | None = None,
    nvidia_smi: str = "nvidia-smi",
) -> dict[str, Any]:
    """The host's part of a launch fingerprint: host, GPU settings, and the server's software as `python` (the
    server's interpreter) imports it. Each field that could not be read is listed under "unreadable" with why."""
    unreadable: list[dict[str, str]] = []
    container, why = _container_id()
    if why:
        unreadable.append({"field": "host.container_id", "why": why})
    host = {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "boot_id": _read_first_line("/proc/sys/kernel/random/boot_id"),
        "container_id": container,
        "cpu_model": _cpu_model(),
        "cpu_governor": _read_first_line("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
    }
    for key in ("boot_id", "cpu_model", "cpu_governor"):
        if host[key] is None:
            unreadable.append({"field": f"host.{key}", "why": "not exposed on this host (VM or container?)"})
    names = tuple(packages if packages is not None else ("sglang", "torch", "flashinfer", "sgl_kernel", "triton"))
    probe = _import_probe(names, python=python, script=_FINGERPRINT_PROBE)
    software: dict[str, Any] = {"python_executable": python or sys.executable}
    if not probe:
        unreadable.append({"field": "software", "why": f"the import probe in {python or sys.executable} failed"})
    for name in (*names, "nccl", "python"):
        found = probe.get(name, {})
        software[name] = found.get("version") or found.get("metadata")
        if probe and software[name] is None:
            reason = found.get("error") or "imports without a version"
            unreadable.append({"field": f"software.{name}", "why": str(reason)})
    return {
        "host": host,
        "gpus": _fingerprint_gpus(nvidia_smi, unreadable),
        "software": software,
        "unreadable": unreadable,
    }


def _logind_kills_user_processes() -> bool:
    # With KillUserProcesses=yes logind kills even setsid'd servers when the SSH session ends.
    for path in ("/etc/systemd/logind.conf", *sorted(_glob("/etc/systemd/logind.conf.d", ".conf"))):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.strip().partition("=")
                    if key.strip() == "KillUserProcesses" and value.strip().lower() in ("yes", "true", "1"):
                        return True
        except OSError:
            continue
    return False


def _glob(directory: str, suffix: str) -> list[str]:
    try:
        return [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(suffix)]
    except OSError:
        return []


# One orch session per host: an flock held by the agent process for as long as it lives. If orch or its SSH
# connection dies, the agent sees EOF and exits, and the kernel releases the lock: nothing stale to clean up.
_LOCKS: dict[str, int] = {}


def op_lock(path: str, holder: dict[str, Any], wait_s: float = 0.0, reclaim: bool = False) -> dict[str, Any]:
    """Take the host lock (waiting up to wait_s). With reclaim, a lock held by an older agent of the *same* orch
    session (left behind by a silent network drop) is taken back by ending that agent."""
    if path in _LOCKS:
        return {"acquired": True, "holder": holder}
    fd = _open_lock_file(path)
    deadline = time.monotonic() + wait_s
    reclaimed = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            current: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                current = json.loads(os.pread(fd, 65536, 0).decode() or "{}")
            if reclaim and not reclaimed and holder.get("session") and current.get("session") == holder["session"]:
                reclaimed = True
                _end_stale_agent(current.get("agent_pid"))
                continue
            if time.monotonic() >= deadline:
                os.close(fd)
                return {"acquired": False, "holder": current}
            time.sleep(0.2)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({**holder, "agent_pid": os.getpid()}).encode(), 0)
    _LOCKS[path] = fd
    return {"acquired": True, "holder": holder}


def _open_lock_file(path: str) -> int:
    # The lock lives in a host-wide directory (/tmp) so that every session on the host meets it, whatever its
    # HOME or workdir, other users' included: created world-writable, and opened without O_CREAT when it exists
    # (fs.protected_regular refuses O_CREAT on another user's file in a sticky directory).
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        return os.open(path, os.O_RDWR)
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return os.open(path, os.O_RDWR)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)  # the umask must not lock other users out
    return fd


def _end_stale_agent(pid: Any) -> None:
    # Only a process that is verifiably an orch agent (this file in --serve mode, same user) is ever ended here.
    if not isinstance(pid, int) or pid in (os.getpid(), os.getppid()) or pid <= 1:
        return
    try:
        proc = psutil.Process(pid)
        cmd = proc.cmdline()
        if proc.uids().real != os.getuid() or "--serve" not in cmd or not any(a.endswith("hostside.py") for a in cmd):
            return
        proc.terminate()
        if _wait_gone([proc], 5.0):
            proc.kill()
            _wait_gone([proc], 5.0)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return


def op_unlock(path: str) -> bool:
    fd = _LOCKS.pop(path, None)
    if fd is None:
        return False
    os.ftruncate(fd, 0)
    os.close(fd)  # closing the last descriptor releases the flock
    return True


def op_find(namespace: str) -> list[dict[str, Any]]:
    """Every live process carrying an orch launch marker of this namespace, with its owning session's state."""
    prefix = namespace + ":"
    out = []
    states: dict[str | None, str] = {}
    for proc, lid in _marked(lambda v: v.startswith(prefix)):
        owner = (_environ(proc) or {}).get(OWNER)
        if owner not in states:
            states[owner] = owner_state(owner)
        out.append({**_describe(proc, lid), "owner": owner, "owner_state": states[owner]})
    return out


def op_status(namespace: str, nvidia_smi: str = "nvidia-smi") -> dict[str, Any]:
    """What orch launched here and still runs, the ports those processes listen on, and GPU state."""
    procs = op_find(namespace)
    pids = {p["pid"] for p in procs}
    ports: dict[int, list[int]] = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid is not None and conn.pid in pids and conn.laddr:
            ports.setdefault(conn.pid, []).append(conn.laddr.port)
    for p in procs:
        p["ports"] = sorted(set(ports.get(p["pid"], [])))
    return {"processes": procs, "gpus": op_gpus(nvidia_smi)}


def op_port_owner(port: int) -> list[dict[str, Any]]:
    """Who listens on the TCP port: pid, command line and orch marker (None when it is not orch's)."""
    owners: list[dict[str, Any]] = []
    seen: set[int | None] = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        if conn.pid in seen:
            continue
        seen.add(conn.pid)
        if conn.pid is None:
            owners.append({"pid": None, "cmdline": "(a process orch may not inspect)", "launch_id": None})
            continue
        try:
            proc = psutil.Process(conn.pid)
        except psutil.NoSuchProcess:
            continue
        env = _environ(proc) or {}
        owners.append(_describe(proc, env.get(MARKER)))
    return owners


def op_launch(argv: list[str], env: dict[str, str], log_path: str, cwd: str | None = None) -> dict[str, Any]:
    """Start argv detached in a new session, logging to log_path; return its PID (= PGID)."""
    if not argv:
        raise HostSideError("empty command line")
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    pidfile = log_path + ".pid"
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    full_env = dict(os.environ)
    full_env.update(env)
    full_env[OWNER] = _self_owner()
    try:
        subprocess.run(
            ["sh", "-c", _LAUNCH_SH, "sh", pidfile, log_path, *argv],
            env=full_env,
            cwd=cwd,
            check=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        raise HostSideError(f"could not start {argv[0]}: {e}") from e
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(pidfile) as f:
                text = f.read().strip()
            if text:
                pid = int(text)
                return {"pid": pid, "pgid": pid, "log_path": log_path, "started_at": time.time()}
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    raise HostSideError(f"launched {argv[0]} but it never wrote its PID to {pidfile}")


def op_alive(pid: int) -> dict[str, Any]:
    try:
        proc = psutil.Process(pid)
        status = proc.status()
    except psutil.NoSuchProcess:
        return {"alive": False, "status": "gone"}
    return {"alive": status != psutil.STATUS_ZOMBIE, "status": status}


def op_environ(launch_id: str, keys: list[str], digest_key: str | None = None) -> list[dict[str, Any]]:
    """For each process of the launch: the requested variables (None when missing) and other relevant ones.

    Secret-looking values are digested here, on the host, with digest_key (hex; the caller's store key) so they
    never cross the wire in clear and still compare equal to the caller's own digests of the profile's values.
    """
    key = bytes.fromhex(digest_key) if digest_key else None
    out = []
    for proc, _ in _marked(lambda v: v == launch_id):
        env = _environ(proc)
        if env is None:
            continue
        wanted = {k: (redact(k, env[k], key) if k in env else None) for k in keys}
        extra = {k: redact(k, v, key) for k, v in env.items() if k not in wanted and k.startswith(RELEVANT_PREFIXES)}
        out.append({**_describe(proc, launch_id), "env": wanted, "other_env": extra})
    out.sort(key=lambda d: d["pid"])
    return out


def op_launch_procs(launch_id: str, pid: int) -> list[dict[str, Any]]:
    """Every process of a launch now: those carrying its marker and every descendant of its main process (which
    finds a worker that re-exec'd without the marker). Recorded once the server is ready, so that liveness checks
    and teardown know the whole launch even if a member later drops the marker."""
    procs = {p.pid: p for p, _ in _marked(lambda v: v == launch_id)}
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        main = psutil.Process(pid)
        procs.setdefault(main.pid, main)
        for child in main.children(recursive=True):
            procs.setdefault(child.pid, child)
    out = []
    for proc in procs.values():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if not _gone(proc):
                out.append({"pid": proc.pid, "create_time": proc.create_time(), "cmdline": _cmdline(proc, 120)})
    return sorted(out, key=lambda d: d["pid"])


def _recorded(procs: Iterable[dict[str, Any]]) -> tuple[list[psutil.Process], list[dict[str, Any]]]:
    """The recorded processes that are still the same processes (PID and start time), and those that are gone."""
    alive, gone = [], []
    for rec in procs:
        try:
            proc = psutil.Process(int(rec["pid"]))
            if abs(proc.create_time() - float(rec["create_time"])) < 0.01 and not _gone(proc):
                alive.append(proc)
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
            pass
        gone.append(rec)
    return alive, gone


def launch_problem(procs: list[dict[str, Any]]) -> str | None:
    """Why a launch is no longer whole (a recorded process exited), or None while every one still runs."""
    _, gone = _recorded(procs)
    if not gone:
        return None
    first = gone[0]
    more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
    return f"process {first['pid']} of the launch ({first.get('cmdline', '?')}){more} exited"


def op_launch_health(procs: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether every recorded process of a launch still runs."""
    problem = launch_problem(procs)
    return {"ok": problem is None, "problem": problem}


def _signal_group(pgid: int | None, sig: signal.Signals) -> bool:
    if pgid is None or pgid <= 1:
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _signal_procs(procs: Iterable[psutil.Process], sig: signal.Signals) -> list[int]:
    hit = []
    for proc in procs:
        if _gone(proc):
            continue
        try:
            proc.send_signal(sig)
            hit.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return hit


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if not _gone(p)]
    return alive


def _listening(port: int) -> bool:
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in psutil.net_connections(kind="tcp")
    )


def op_teardown(
    launch_id: str,
    pgid: int | None = None,
    port: int | None = None,
    grace_s: float = 10.0,
    port_wait_s: float = 30.0,
    known: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """SIGTERM the group, wait, SIGKILL the group, SIGKILL any process still carrying the marker, wait for the port.

    Only processes in the recorded process group, carrying this exact launch marker, or recorded as this launch's
    (`known`: PID and start time, so a reused PID is never mistaken for ours) are ever signalled.
    """
    t0 = time.monotonic()
    procs = [p for p, _ in _marked(lambda v: v == launch_id)]
    # Recorded members that no longer carry the marker (a worker that re-exec'd with a clean environment).
    unmarked = [p for p in _recorded(known or [])[0] if p.pid not in {q.pid for q in procs}]
    procs += unmarked
    report: dict[str, Any] = {
        "found": [p.pid for p in procs],
        "unmarked": [p.pid for p in unmarked],
        "sigterm": False,
        "sigkill": [],
        "escaped": [],
    }
    # A recorded PGID is only trusted while a member still carries our marker: after the launch died the number
    # may belong to someone else's process group.
    if pgid is not None and any(_pgid(p) == pgid for p in procs):
        procs += [p for p in psutil.process_iter() if p.pid not in report["found"] and _pgid(p) == pgid]
    else:
        pgid = None
    report["sigterm"] = _signal_group(pgid, signal.SIGTERM)
    # Members that left the group (setsid) never saw the group signal: tell them directly.
    _signal_procs([p for p in procs if _pgid(p) != pgid], signal.SIGTERM)
    survivors = _wait_gone(procs, grace_s)
    if survivors:
        # Re-check just before the group SIGKILL: if every marked member left the group meanwhile, the number
        # may already belong to a new group of someone else's.
        if pgid is not None and any(_pgid(p) == pgid for p, _ in _marked(lambda v: v == launch_id)):
            _signal_group(pgid, signal.SIGKILL)
        _signal_procs(survivors, signal.SIGKILL)  # those outside the group; the rest may already be gone
        report["sigkill"] = [p.pid for p in survivors]
    # Processes started after our snapshot or reparented away from the group: found again by marker.
    late = [p for p, _ in _marked(lambda v: v == launch_id)] + _recorded(known or [])[0]
    if late:
        report["escaped"] = sorted(set(_signal_procs(late, signal.SIGKILL)))
    remaining = _wait_gone(procs + late, 10.0)
    report["remaining"] = [_describe(p, launch_id) for p in remaining]
    port_free = True
    if port is not None:
        deadline = time.monotonic() + port_wait_s
        while (port_free := not _listening(port)) is False and time.monotonic() < deadline:
            time.sleep(0.1)
        if not port_free:
            # Whoever still holds the port carries neither our marker nor a recorded PID: say so, never kill it.
            report["port_owner"] = op_port_owner(port)
    report["port_free"] = port_free
    report["seconds"] = round(time.monotonic() - t0, 3)
    return report


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except ProcessLookupError:
        return None


def op_down(namespace: str, grace_s: float = 10.0, force: bool = False) -> dict[str, Any]:
    """Stop everything orch launched in this namespace on this host (`orch down`); launches of a live orch session
    are left alone (listed under "live") unless force."""
    by_launch: dict[str, int | None] = {}
    live: dict[str, dict[str, Any]] = {}
    for proc in op_find(namespace):
        lid, pid, pg = proc["launch_id"], proc["pid"], proc["pgid"]
        if proc["owner_state"] == "alive" and not force:
            live.setdefault(lid, {"launch_id": lid, "owner": proc["owner"], "pids": []})["pids"].append(pid)
            continue
        # The launch's leader is the member whose PGID equals its PID.
        if lid not in by_launch or pg == pid:
            by_launch[lid] = pg if pg == pid else by_launch.get(lid)
    stopped = [
        {"launch_id": lid, **op_teardown(lid, pgid=pg, grace_s=grace_s, port_wait_s=0)}
        for lid, pg in by_launch.items()
        if lid not in live
    ]
    return {"stopped": stopped, "live": list(live.values())}


def op_kill_port_owner(port: int, pid: int, grace_s: float = 10.0) -> dict[str, Any]:
    """Kill exactly the process that owns the port (opt-in: host policy kill-with-force plus --force)."""
    if pid <= 1 or pid in (os.getpid(), os.getppid()):
        raise HostSideError(f"refusing to kill PID {pid} (init, or orch's own agent and its parent)")
    try:
        proc = psutil.Process(pid)  # before the ownership check, so a PID reused afterwards is not signalled
    except psutil.NoSuchProcess:
        return {"pid": pid, "sigkill": False, "gone": True}
    owners = [o["pid"] for o in op_port_owner(port)]
    if pid not in owners:
        raise HostSideError(f"PID {pid} no longer owns port {port} (owners now: {owners}); nothing was killed")
    _signal_procs([proc], signal.SIGTERM)
    killed = []
    if _wait_gone([proc], grace_s):
        killed = _signal_procs([proc], signal.SIGKILL)
        _wait_gone([proc], 10.0)
    return {"pid": pid, "sigkill": bool(killed), "gone": _gone(proc)}


def op_bench_run(
    port: int,
    endpoint: str,
    bodies: list[dict[str, Any]],
    max_tokens: list[int],
    concurrency: int,
    timeout_s: float = 600.0,
    min_duration_s: float = 0.0,
    address: str = "127.0.0.1",
    gpu_probe: str | None = None,
    gpu_probe_after_s: float = 0.2,
    stall_s: float = 60.0,
    first_token_s: float = 180.0,
    watch: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One benchmark run against address:port, measured here next to the server.

    With gpu_probe (the nvidia-smi to run), GPU clocks and temperatures are read once, gpu_probe_after_s into the
    run: while the GPUs work. Read after the run they would already be falling back to idle.
    """
    import threading

    from orchestrator import client  # shipped beside this file

    reading: list[dict[str, Any]] = []
    probe = None

    def read(nvidia_smi: str) -> None:
        # A probe never fails a run, nor prints a thread traceback into the agent's stderr.
        with contextlib.suppress(Exception):
            reading.append(op_gpus(nvidia_smi))

    if gpu_probe:
        probe = threading.Timer(gpu_probe_after_s, read, args=(gpu_probe,))
        probe.daemon = True
        probe.start()
    try:
        result = client.run(
            address,
            port,
            endpoint,
            bodies,
            max_tokens,
            concurrency,
            timeout_s,
            min_duration_s,
            stall_s=stall_s,
            first_token_s=first_token_s,
            # Every recorded process of the launch, checked here next to it: a dead worker stops the run at once.
            watchdog=(lambda: launch_problem(watch)) if watch else None,
        )
    finally:
        if probe is not None:
            probe.cancel()
            probe.join(timeout=65)  # a probe already running finishes (op_gpus: two nvidia-smi calls, 30 s each)
    result["gpus"] = reading[0] if reading else None
    return result


def op_log_tail(path: str, lines: int = 40, max_bytes: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError as e:
        return f"(no log at {path}: {e.strerror})"
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


OPS: dict[str, Callable[..., Any]] = {
    "hello": op_hello,
    "facts": op_facts,
    "find": op_find,
    "port_owner": op_port_owner,
    "launch": op_launch,
    "alive": op_alive,
    "environ": op_environ,
    "teardown": op_teardown,
    "launch_procs": op_launch_procs,
    "launch_health": op_launch_health,
    "down": op_down,
    "log_tail": op_log_tail,
    "bench_run": op_bench_run,
    "gpus": op_gpus,
    "status": op_status,
    "kill_port_owner": op_kill_port_owner,
    "check": op_check,
    "fingerprint": op_fingerprint,
    "lock": op_lock,
    "unlock": op_unlock,
}


def dispatch(request: dict[str, Any]) -> dict[str, Any]:
    """One request → one JSON-able answer; never raises, so a remote caller always gets a structured reply."""
    op = request.get("op")
    reply = _dispatch(op, request.get("args", {}))
    if "id" in request:
        reply["id"] = request["id"]  # lets the caller drop a stale reply to a request it gave up on
    return reply


def _dispatch(op: Any, args: dict[str, Any]) -> dict[str, Any]:
    fn = OPS.get(str(op))
    if fn is None:
        return {"ok": False, "error": f"unknown host-side operation {op!r}"}
    try:
        return {"ok": True, "result": fn(**args)}
    except HostSideError as e:
        return {"ok": False, "error": str(e)}
    except TypeError as e:
        return {"ok": False, "error": f"bad arguments for {op}: {e}"}
    except (OSError, psutil.Error) as e:
        return {"ok": False, "error": f"{op} failed: {e}"}
    except Exception as e:  # a bug here must still come back as an answer, not kill the agent
        return {"ok": False, "error": f"{op} failed unexpectedly: {type(e).__name__}: {e}"}


HEARTBEAT_S = 5.0


def serve() -> None:
    """One JSON request per line on stdin, one JSON reply per line on stdout, until EOF (the connection closed).

    Each request runs in a worker thread while this loop (a) writes a heartbeat line every HEARTBEAT_S so orch can
    tell a long benchmark run from a dead connection, and (b) watches stdin: requests come strictly one at a time,
    so input during a request can only be EOF, and then the agent exits at once — a benchmark run orch gave up on
    must not keep loading the server while orch repeats it.
    """
    import threading

    fd = sys.stdin.fileno()
    done_r, done_w = os.pipe()
    buffer = b""
    while True:
        while b"\n" not in buffer:
            data = os.read(fd, 65536)
            if not data:
                return
            buffer += data
        line, buffer = buffer.split(b"\n", 1)
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as e:
            _write({"ok": False, "error": f"request is not JSON: {e}"})
            continue
        box: list[dict[str, Any]] = []

        def work(b: list[dict[str, Any]] = box, r: dict[str, Any] = request) -> None:
            try:
                b.append(dispatch(r))
            finally:
                os.write(done_w, b"x")  # wakes the loop below at once: no polling latency per request

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        next_beat = time.monotonic() + HEARTBEAT_S
        while True:
            readable, _, _ = select.select([fd, done_r], [], [], max(0.0, next_beat - time.monotonic()))
            if done_r in readable:
                os.read(done_r, 1)
                break
            if fd in readable:
                os._exit(0)
            if time.monotonic() >= next_beat:
                _write({"id": request.get("id"), "heartbeat": True})
                next_beat += HEARTBEAT_S
        worker.join()
        _write(box[0] if box else {"ok": False, "error": "the request died without an answer", "id": request.get("id")})


def _write(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    if "--serve" in sys.argv[1:]:
        serve()
        return
    json.dump(dispatch(json.load(sys.stdin)), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

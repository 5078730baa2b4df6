"""What the agent reads about a host: facts, GPUs through nvidia-smi, engine versions by import in the host's Python,
`orch hosts check`, launch fingerprints (stdlib + psutil; shipped with the agent)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import psutil

from orchestrator.agent import cpu
from orchestrator.agent.processes import MARKER, HostSideError, boot_id, masked_cmdline, read_environ

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
# A launch's fingerprint imports the engine while the server it describes loads beside it (ops.op_wait_ready):
# vLLM's CPU build takes 13 s on an idle 2-core VM and over 30 s (seen) beside its own loading server. Still bounded
# (a hung import must end), inside the host call's deadline for a fingerprint (launch/fingerprint's 150 s).
FINGERPRINT_PROBE_TIMEOUT_S = 120.0


def home_path(arg: str) -> str:
    """arg with a leading ~/ as the home of this host's user, as a shell reads it; any other arg as it is."""
    return os.path.expanduser(arg) if arg.startswith("~/") else arg


def _import_probe(
    names: tuple[str, ...],
    *,
    python: str | None = None,
    script: str = _IMPORT_PROBE,
    timeout_s: float = IMPORT_PROBE_TIMEOUT_S,
) -> dict[str, dict[str, Any]]:
    """{name: {"version", "error", "metadata"}} as a child of `python` (default: this one) sees them; {} if the
    child failed."""
    try:
        # A separate process: importing torch/sglang into the agent would cost memory for the whole session and
        # could initialise CUDA in a process that must stay light. Not cached: it runs once per experiment.
        done = subprocess.run(
            [home_path(python or sys.executable), "-c", script, *names],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            timeout=timeout_s,
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


def _engine_versions(names: Sequence[str]) -> dict[str, Any]:
    """{name: version or None} for each package, and "import_errors": the installed ones that fail to import."""
    probe = _import_probe(tuple(names))
    out: dict[str, Any] = {name: _version(name, probe) for name in names}
    # Installed but not importable is worth saying: the server would fail the same way.
    out["import_errors"] = {n: r["error"] for n, r in probe.items() if r.get("error") and out.get(n)}
    return out


def op_facts(nvidia_smi: str = "nvidia-smi", packages: Sequence[str] = ()) -> dict[str, Any]:
    """Host facts for the fingerprint: what could make two sessions' numbers differ (`packages`: the versions orch
    asks for, the experiment's engines' own and what they run on: engines.fact_packages)."""
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
        **{k: v for k, v in _engine_versions(packages).items() if k != "import_errors"},
        "cpu_count": psutil.cpu_count(),
        "mem_total_bytes": vm.total,
        "boot_time": psutil.boot_time(),
        # The kernel's id of this boot: unlike boot_time (derived from the wall clock, so a clock step moves it),
        # it tells one machine's boot from another's exactly.
        "boot_id": boot_id(),
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


def csv_query(nvidia_smi: str, query: str, fields: tuple[str, ...]) -> list[dict[str, Any]]:
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
        rows.append({f: smi_value(v) for f, v in zip(fields, values, strict=True)})
    return rows


def smi_value(text: str) -> Any:
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
        gpus = csv_query(nvidia_smi, "gpu", GPU_FIELDS)
        apps = csv_query(nvidia_smi, "compute-apps", APP_FIELDS)
    except (HostSideError, OSError, subprocess.TimeoutExpired) as e:
        return {"available": False, "error": str(e), "gpus": [], "apps": []}
    index_of = {g["uuid"]: g["index"] for g in gpus}
    for app in apps:
        app["gpu_index"] = index_of.get(app.get("gpu_uuid"))
        try:
            proc = psutil.Process(int(app["pid"]))
            app["cmdline"] = masked_cmdline(proc)
            app["launch_id"] = (read_environ(proc) or {}).get(MARKER)
        except (psutil.NoSuchProcess, ValueError, TypeError):
            app["cmdline"], app["launch_id"] = "?", None
    return {"available": True, "error": None, "gpus": gpus, "apps": apps}


def op_check(workdir: str, nvidia_smi: str = "nvidia-smi", packages: Sequence[str] = ()) -> dict[str, Any]:
    """What `orch hosts check` reports: interpreter, packages (orch sends every engine's: engines.fact_packages;
    "packages", each version or None), GPUs, disk, logind's process killing."""
    versions = _engine_versions(packages)
    target = workdir
    while target and not os.path.exists(target):
        target = os.path.dirname(target)
    disk = shutil.disk_usage(target or "/")
    return {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "psutil": psutil.__version__,
        "packages": {name: versions[name] for name in packages},
        "import_errors": versions["import_errors"],
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
        rows = csv_query(nvidia_smi, "gpu", fields)
    except (HostSideError, OSError, subprocess.TimeoutExpired) as e:
        # An older driver refuses the whole query for one unknown field: ask field by field to say which.
        rows, why, failed = [], str(e), []
        for name in fields:
            try:
                column = csv_query(nvidia_smi, "gpu", (name,))
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
    build_probe: str | None = None,
) -> dict[str, Any]:
    """The host's part of a launch fingerprint: host, GPU settings, and the server's software as `python` (the
    server's interpreter) imports it; with build_probe (an engine's own script, engines.Engine.build_probe), how
    the engine was built as that interpreter reads it. Each field that could not be read is listed under
    "unreadable" with why."""
    unreadable: list[dict[str, str]] = []
    container, why = _container_id()
    if why:
        unreadable.append({"field": "host.container_id", "why": why})
    host = {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "boot_id": boot_id(),
        "container_id": container,
        "cpu_model": _cpu_model(),
        "cpu_governor": _read_first_line("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "cpu": cpu.facts(),
    }
    for key in ("boot_id", "cpu_model", "cpu_governor"):
        if host[key] is None:
            unreadable.append({"field": f"host.{key}", "why": "not exposed on this host (VM or container?)"})
    names = tuple(packages or ())  # the engine adapter's (launch/fingerprint.host_probe)
    probe = _import_probe(names, python=python, script=_FINGERPRINT_PROBE, timeout_s=FINGERPRINT_PROBE_TIMEOUT_S)
    software: dict[str, Any] = {"python_executable": python or sys.executable}
    if not probe:
        unreadable.append({"field": "software", "why": f"the import probe in {python or sys.executable} failed"})
    for name in (*names, "nccl", "python"):
        found = probe.get(name, {})
        software[name] = found.get("version") or found.get("metadata")
        if probe and software[name] is None:
            reason = found.get("error") or "imports without a version"
            unreadable.append({"field": f"software.{name}", "why": str(reason)})
    if build_probe is not None:
        build = _import_probe((), python=python, script=build_probe, timeout_s=FINGERPRINT_PROBE_TIMEOUT_S).get("build")
        software["engine_build"] = build
        if build is None:
            unreadable.append({"field": "software.engine_build", "why": "the engine's build probe gave nothing"})
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

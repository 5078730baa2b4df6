"""The host's CPU: what it is (vendor's family/model, the instruction sets inference uses) and how fast it is now."""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any

import psutil

# The instruction sets a CPU inference engine's kernels are built for (llama.cpp's ggml, torch's CPU backend):
# another set of them is another code path, whatever the model name says. A VM's "AMD EPYC" or "Intel Xeon
# Processor" names a virtual CPU model, not the silicon under it.
INFERENCE_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "sve",
)
# The speed probe: a fixed pure-Python loop, timed PROBE_REPS times, the median kept. It measures what the server's
# threads get from this CPU right now (clock, a busy neighbour on the physical host, steal), not the instruction
# sets (those are compared above): two VMs that report the same model can run it 1.6x apart.
PROBE_LOOP = 200_000
PROBE_REPS = 9
# And memory: one buffer copied into another, both past any CPU's last-level cache and touched first (a VM's first
# touch of a page costs more than the copy). A CPU engine's decode reads every weight once per token, so its speed
# follows this bandwidth: on this project's VM, 1.3 GB/s on a day its llama-server decoded at 27 tok/s.
COPY_BYTES = 64 << 20
COPY_REPS = 5


def facts() -> dict[str, Any]:
    """family/model/stepping as /proc/cpuinfo gives them, the inference instruction sets present, the logical CPU
    count, and the hypervisor's vendor (None on bare metal or where it is not said)."""
    info: dict[str, str] = {}
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                key = key.strip()
                if not sep:
                    if info:
                        break  # the first processor's block is enough
                    continue
                if key in ("flags", "Features"):
                    flags.update(value.split())
                elif key in ("cpu family", "model", "stepping", "CPU implementer", "CPU part"):
                    info.setdefault(key, value.strip())
    except OSError:
        pass
    return {
        "family": info.get("cpu family") or info.get("CPU implementer"),
        "model": info.get("model") or info.get("CPU part"),
        "stepping": info.get("stepping"),
        "inference_flags": [f for f in INFERENCE_FLAGS if f in flags] if flags else None,
        "logical_cpus": psutil.cpu_count(),
        "hypervisor": _hypervisor(flags),
    }


def _hypervisor(flags: set[str]) -> str | None:
    for path in ("/sys/hypervisor/type", "/sys/class/dmi/id/sys_vendor"):
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value and (path.startswith("/sys/hypervisor") or "hypervisor" in flags):
            return value[:60]
    return "unnamed" if "hypervisor" in flags else None


def _loop(n: int) -> int:
    x = 0
    for i in range(n):
        x += i * i
    return x


def _copy_gb_s(size: int, reps: int) -> float:
    src, dst = bytearray(size), bytearray(size)
    for i in range(0, size, 4096):  # fault every page in before timing
        src[i] = dst[i] = 1
    view = memoryview(src)
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        dst[:] = view
        rates.append(size / max(time.perf_counter() - t, 1e-9) / 1e9)
    return statistics.median(rates)


def _cpu_times() -> tuple[float, float, float]:
    """(busy, steal, total) seconds over all CPUs since boot."""
    t = psutil.cpu_times()
    steal = float(getattr(t, "steal", 0.0))
    total = float(sum(t))
    idle = float(t.idle) + float(getattr(t, "iowait", 0.0))
    return total - idle - steal, steal, total


def op_cpu_speed(
    loop: int = PROBE_LOOP, reps: int = PROBE_REPS, copy_bytes: int = COPY_BYTES, copy_reps: int = COPY_REPS
) -> dict[str, Any]:
    """How fast this CPU runs now: the loop's median ms and the memory copy's median GB/s, and over the probe's
    window the share of CPU time the hypervisor stole and the share other processes used (of the CPUs the probe
    did not use)."""
    own0 = os.times()
    busy0, steal0, total0 = _cpu_times()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        _loop(loop)
        times.append((time.perf_counter() - t) * 1000)
    copy = _copy_gb_s(copy_bytes, copy_reps)
    own1 = os.times()
    busy1, steal1, total1 = _cpu_times()
    span = total1 - total0
    own = (own1.user - own0.user) + (own1.system - own0.system)
    ncpu = psutil.cpu_count() or 1
    others = None
    if span > 0 and ncpu > 1:
        # What the probe's one thread used is not "other load": the rest of the window's busy time is.
        others = max(0.0, (busy1 - busy0) - own) / (span * (ncpu - 1) / ncpu)
    return {
        # Another interpreter runs the loop at another speed: probe_ms compares only under the same `probe`.
        "probe": f"python {platform.python_version()}, loop {loop}, median of {reps}; copy {copy_bytes >> 20} MiB",
        "probe_ms": round(statistics.median(times), 2),
        "mem_copy_gb_s": round(copy, 2),
        "steal_pct": round(100 * (steal1 - steal0) / span, 1) if span > 0 else None,
        "others_busy_pct": None if others is None else round(min(100.0, 100 * others), 1),
    }

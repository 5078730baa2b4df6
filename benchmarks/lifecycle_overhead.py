"""Orchestration overhead per arm, local host vs SSH host side by side: time that is not loading or benchmarking.

Launches the simulator with zero load and warmup time N times per host kind and splits each arm into phases,
counting host-side round trips. The SSH host is a real OpenSSH server on 127.0.0.1 started by this script (the
test harness), so the difference is the cost of the SSH path itself, not of a network.
Run with `make bench`; results are written up in docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

os.environ.setdefault("ORCH_NAMESPACE", f"bench-{os.getpid()}")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator import hostside, server
from orchestrator.hosts import Host, HostConfig, LocalHost
from orchestrator.profile import Profile, load

PHASES = ("connect", "preflight", "launch", "ready", "verify_env", "teardown")


def measure(
    make_host: type[Host] | object, prof: Profile, ns: str, launches: int
) -> tuple[dict[str, list[float]], list[int]]:
    phases: dict[str, list[float]] = {k: [] for k in PHASES}
    calls: list[int] = []
    per_call: list[float] = []
    for _ in range(launches):
        t = time.perf_counter()
        host: Host = make_host()  # type: ignore[operator]
        phases["connect"].append(time.perf_counter() - t)
        try:
            before = host.stats.calls
            t = time.perf_counter()
            server.preflight(host, prof, ns)
            phases["preflight"].append(time.perf_counter() - t)
            t = time.perf_counter()
            launched = server.launch(host, prof, simulate=True, namespace=ns)
            phases["launch"].append(time.perf_counter() - t)
            try:
                t = time.perf_counter()
                server.wait_ready(host, launched, prof, timeout_s=60, poll_s=0.05)
                phases["ready"].append(time.perf_counter() - t)
                t = time.perf_counter()
                server.verify_env(host, launched, prof)
                phases["verify_env"].append(time.perf_counter() - t)
            finally:
                t = time.perf_counter()
                server.teardown(host, launched, grace_s=5)
                phases["teardown"].append(time.perf_counter() - t)
            calls.append(host.stats.calls - before)
            per_call.append(host.stats.seconds / max(1, host.stats.calls))
        finally:
            host.close()
    phases["ms per host call"] = [1000 * x for x in per_call]
    return phases, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--tp-size", type=int, default=8)
    ap.add_argument("--no-ssh", action="store_true", help="local host only")
    args = ap.parse_args()
    ns = os.environ["ORCH_NAMESPACE"]
    results: dict[str, tuple[dict[str, list[float]], list[int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "engine": "sglang",
                    "model_path": "/models/bench",
                    "tp_size": args.tp_size,
                    "port": 38123,
                    "env": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
                    "sim": {"load_s": 0.0, "warmup_s": 0.0, "drain_s": 0.0},
                }
            )
        )
        prof = load(str(path))
        results["local"] = measure(lambda: LocalHost(workdir=tmp), prof, ns, args.launches)
        if not args.no_ssh:
            from orchestrator.ssh import SSHHost
            from tests.sshd import SSHD

            sshd = SSHD.start(Path(tmp) / "sshd")
            try:
                os.environ["ORCH_SSH_CONFIG"] = str(sshd.ssh_config)
                cfg = HostConfig(name="testbox", address="testbox", python=sys.executable, workdir=f"{tmp}/remote")
                SSHHost(cfg).close()  # installs the agent once, as the first session on a host would
                results["ssh"] = measure(lambda: SSHHost(cfg), prof, ns, args.launches)
            finally:
                sshd.stop()
        leftovers = hostside.op_find(ns)
    print(f"simulator tp_size={args.tp_size} (load_s=0, warmup_s=0), {args.launches} launches per host kind")
    kinds = list(results)
    print(
        f"{'phase (median s)':<18}" + "".join(f"{k:>10}" for k in kinds) + ("   ssh/local" if len(kinds) == 2 else "")
    )
    totals = dict.fromkeys(kinds, 0.0)
    for phase in (*PHASES, "ms per host call"):
        meds = {k: statistics.median(results[k][0][phase]) for k in kinds}
        row = f"{phase:<18}" + "".join(f"{meds[k]:10.3f}" for k in kinds)
        if len(kinds) == 2:
            row += f"   {meds['ssh'] / meds['local']:9.1f}x"
        print(row)
        if phase in PHASES and phase != "ready":
            for k in kinds:
                totals[k] += meds[k]
    row = f"{'orch overhead':<18}" + "".join(f"{totals[k]:10.3f}" for k in kinds)
    if len(kinds) == 2:
        row += f"   {totals['ssh'] / totals['local']:9.1f}x"
    print(row + "   (all phases but ready)")
    print(f"{'host calls / arm':<18}" + "".join(f"{statistics.median(results[k][1]):10.0f}" for k in kinds))
    print("'ready' is simulator start-up (Python + spawning tp_size+1 workers + the ~1 s health check), polled")
    print("every 0.05 s here; each poll is one host call (liveness) plus one HTTP request (through the tunnel on SSH).")
    if leftovers:
        print(f"LEAK: {leftovers}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Orchestration overhead per arm on the local host: time orch spends that is not server loading or benchmarking.

Launches the simulator with zero load and warmup time N times and splits each arm into phases, counting
host-side round trips. Run with `make bench`; results are written up in docs/performance.md.
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

from orchestrator import hostside, server
from orchestrator.hosts import LocalHost
from orchestrator.profile import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--tp-size", type=int, default=8)
    args = ap.parse_args()
    ns = os.environ["ORCH_NAMESPACE"]
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
        phases: dict[str, list[float]] = {k: [] for k in ("preflight", "launch", "ready", "verify_env", "teardown")}
        calls: list[int] = []
        for _ in range(args.launches):
            host = LocalHost(workdir=tmp)
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
            calls.append(host.stats.calls)
        leftovers = hostside.op_find(ns)
    print(f"local host, simulator tp_size={args.tp_size} (load_s=0, warmup_s=0), {args.launches} launches")
    print(f"{'phase':<12} {'median s':>9} {'min s':>7} {'max s':>7}")
    total = 0.0
    for name, values in phases.items():
        med = statistics.median(values)
        total += med
        print(f"{name:<12} {med:9.3f} {min(values):7.3f} {max(values):7.3f}")
    print(f"{'total':<12} {total:9.3f}")
    print(f"host-side calls per arm: median {statistics.median(calls):.0f} (polling adds one per readiness poll)")
    print("'ready' here is process start-up (Python + spawning tp_size+1 workers), not model loading.")
    if leftovers:
        print(f"LEAK: {leftovers}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

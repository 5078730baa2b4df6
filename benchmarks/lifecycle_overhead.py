"""What a user waits for per arm, beyond loading and benchmarking: the real `orch ab` path, local vs SSH, before/after.

Each measured experiment is `run_ab` itself (host facts, the host lock, the store, preflight with the GPU check,
launch, readiness at the default poll interval, env read-back, fingerprint, one warmup and one run, teardown with the
GPU-idle wait) against the simulator with zero load time, a fake `nvidia-smi` on PATH (the tests' one: the
simulator's workers hold GPU memory while they live) and `--skip-server-warmup` (so the server is healthy the moment
its port accepts). The code before the change (`--before REF`, default 3e11be3: the last commit before issue 14) is
checked out into a temporary directory and run in its own subprocesses, interleaved with the current code in every
round; the SSH host is a real OpenSSH server on 127.0.0.1 (the test harness), so the SSH column is the cost of the
SSH path with no network latency: on a real network add one round-trip time per host call and per channel open.

Readiness latency: a thread connects to the server's port every millisecond from the launch on; "port open → ready"
is from its first accepted connection to orch declaring the server ready (the `env check` phase begins), the number
the issue sets at <= 50 ms. Host calls are counted by wrapping `Host.call`, SSH channel opens by wrapping paramiko's
`Transport.open_channel` (the agent's session, SFTP, and one direct-tcpip channel per tunnelled HTTP connection).

Run with `make bench`; results are written up in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Once per experiment, not per arm: host facts and the host lock (taken and released).
PER_EXPERIMENT_OPS = ("facts", "lock", "unlock")
CONFIGS = (("before", "local"), ("after", "local"), ("before", "ssh"), ("after", "ssh"))


# ------------------------------------------------------------------ the worker: one experiment, one code version


def worker(args: argparse.Namespace) -> None:
    """Runs under PYTHONPATH=<one code version>: imports only what every version has."""
    from orchestrator import progress
    from orchestrator.ab import ABConfig, run_ab
    from orchestrator.bench import BenchConfig
    from orchestrator.hosts.base import HostConfig
    from orchestrator.hosts.local import LocalHost
    from orchestrator.profile import load
    from orchestrator.store import Store

    prof = load(args.profile)
    channels: list[tuple[str, float]] = []
    if args.host == "ssh":
        import paramiko

        from orchestrator.hosts.ssh import SSHHost

        original = paramiko.Transport.open_channel

        def counted(self: Any, kind: str, *a: Any, **kw: Any) -> Any:
            channels.append((kind, time.perf_counter()))
            return original(self, kind, *a, **kw)

        paramiko.Transport.open_channel = counted  # type: ignore[method-assign]
        cfg = HostConfig(name="testbox", address="testbox", python=sys.executable, workdir=args.remote_workdir)
        t = time.perf_counter()
        host: Any = SSHHost(cfg)
        connect_s = time.perf_counter() - t
        if args.install_only:
            host.close()
            return
    else:
        t = time.perf_counter()
        host = LocalHost(workdir=args.workdir)
        connect_s = time.perf_counter() - t
    channels.clear()  # connecting (and the agent's upload) is once per session, not per arm

    calls: list[tuple[str, float, float]] = []
    inner = host.call

    def timed_call(op: str, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(op, *a, **kw)
        finally:
            calls.append((op, t0, time.perf_counter()))

    host.call = timed_call
    events: list[tuple[float, str, str | None]] = []
    opened: list[float] = []
    watch = threading.Event()

    def observe() -> None:
        while True:
            watch.wait()
            with socket.socket() as s:
                s.settimeout(0.05)
                try:
                    s.connect(("127.0.0.1", prof.port))
                except OSError:
                    time.sleep(0.001)
                    continue
            opened.append(time.perf_counter())
            watch.clear()

    threading.Thread(target=observe, daemon=True).start()

    def listener(name: str, data: dict[str, Any]) -> None:
        events.append((time.perf_counter(), name, data.get("state")))
        if name == "launch":
            watch.set()

    bench = BenchConfig(min_run_s=0, runs=1, warmup=1, max_tokens=16, warmup_max_tokens=4)
    config = ABConfig(bench=bench, simulate=True, namespace=os.environ["ORCH_NAMESPACE"], order="fixed")
    store = Store(Path(args.workdir) / f"{time.time_ns()}.db")
    try:
        with progress.listen(listener):
            t0 = time.perf_counter()
            run_ab(host, [prof] * args.arms, config, store)
            t_end = time.perf_counter()
    finally:
        store.close()
        host.close()
    print(
        json.dumps(
            {
                "connect_s": connect_s,
                "t0": t0,
                "t_end": t_end,
                "events": events,
                "opened": opened,
                "calls": calls,
                "channels": channels,
            }
        )
    )


# ------------------------------------------------------------------ turning one experiment into per-arm figures


def split(doc: dict[str, Any]) -> list[dict[str, float]]:
    """Per arm: phase durations (s), readiness latencies, host calls and channel opens (all arms' channels shared
    evenly: they are counted per experiment)."""
    events = doc["events"]
    slots = [i for i, e in enumerate(events) if e[1] == "slot"]
    arms = []
    for n, start in enumerate(slots):
        stop = slots[n + 1] if n + 1 < len(slots) else len(events)
        mine = events[start:stop]
        end = events[stop][0] if stop < len(events) else doc["t_end"]

        def first(name: str, seq: list[Any] = mine) -> float:
            return float(next(e[0] for e in seq if e[1] == name))

        t_slot, t_launch, t_loading = mine[0][0], first("launch"), first("loading")
        t_env = first("env check")
        t_bench = float(next(e[0] for e in mine if e[1] in ("warmup", "run")))
        t_teardown = first("teardown")
        runs = [e for e in mine if e[1] in ("warmup", "run")]
        t_open = next(o for o in doc["opened"] if o >= t_launch)
        ops = [c for c in doc["calls"] if t_slot <= c[1] < end]
        arms.append(
            {
                "preflight": t_launch - t_slot,
                "launch": t_loading - t_launch,
                "server start-up": t_open - t_loading,
                "ready wait": t_env - t_loading,
                "port open → ready": t_env - t_open,
                "port open → benchmarking": t_bench - t_open,
                "env check + fingerprint": t_bench - t_env,
                "benchmark (1 warmup, 1 run)": t_teardown - t_bench,
                "teardown + GPU idle": end - t_teardown,
                "calls per arm": float(sum(1 for c in ops if c[0] not in (*PER_EXPERIMENT_OPS, "bench_run"))),
                "calls per run": sum(1 for c in ops if c[0] == "bench_run") / max(1, len(runs)),
                "calls while loading": float(sum(1 for c in ops if t_loading <= c[1] < t_env)),
                "channel opens per arm": float(sum(1 for c in doc["channels"] if t_slot <= c[1] < end)),
                "channel opens while loading": float(sum(1 for c in doc["channels"] if t_loading <= c[1] < t_env)),
            }
        )
    for arm in arms:
        arm["orch overhead per arm"] = sum(
            arm[k]
            for k in ("preflight", "launch", "port open → ready", "env check + fingerprint", "teardown + GPU idle")
        )
        arm["connect (per session)"] = doc["connect_s"]
        arm["experiment: facts, lock, store"] = (events[slots[0]][0] - doc["t0"]) if slots else 0.0
    return arms


# (label, key of split()'s figures, unit, how the arms of a column are summarised)
Summary = Callable[[list[float]], float]
ROWS: tuple[tuple[str, str, str, Summary], ...] = (
    ("connect (per session)", "connect (per session)", "s", statistics.median),
    ("experiment: facts, lock, store", "experiment: facts, lock, store", "s", statistics.median),
    *((k, k, "s", statistics.median) for k in ("preflight", "launch", "server start-up")),
    ("port open → ready", "port open → ready", "ms", statistics.median),
    ("port open → ready, worst arm", "port open → ready", "ms", max),
    ("port open → benchmarking", "port open → benchmarking", "ms", statistics.median),
    *((k, k, "s", statistics.median) for k in ("env check + fingerprint", "benchmark (1 warmup, 1 run)")),
    *((k, k, "s", statistics.median) for k in ("teardown + GPU idle", "orch overhead per arm")),
    *((k, k, "n", statistics.median) for k in ("calls per arm", "calls per run", "channel opens per arm")),
)


def _fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{1000 * value:.1f} ms"
    if unit == "n":
        return f"{value:g}"
    return f"{value:.3f} s"


def table(results: dict[str, list[dict[str, float]]], long_load: dict[str, str]) -> str:
    kinds = [k for k in (f"{v} {h}" for v, h in CONFIGS) if k in results]
    head = "| per arm (median) | " + " | ".join(kinds) + " | after/before local | after/before SSH |"
    lines = [head, "|---" * (len(kinds) + 3) + "|"]
    for row, key, unit, summary in ROWS:
        med = {k: float(summary([a[key] for a in results[k]])) for k in kinds}
        cells = [_fmt(med[k], unit) for k in kinds]
        ratios = []
        for h in ("local", "ssh"):
            b, a = med.get(f"before {h}"), med.get(f"after {h}")
            ratios.append(f"{a / b:.2f}x" if a is not None and b else "")
        lines.append(f"| {row} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    if long_load:
        cells = [long_load.get(k, "") for k in kinds]
        lines.append(f"| host calls + channel opens during a {LONG_LOAD_S:g} s load | " + " | ".join(cells) + " | | |")
    return "\n".join(lines)


# ------------------------------------------------------------------ the parent: trees, harness, interleaving

LONG_LOAD_S = 5.0


def _profile(path: Path, port: int, tp_size: int, load_s: float) -> str:
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "engine": "sglang",
                "model_path": "/models/bench",
                "tp_size": tp_size,
                "port": port,
                "env": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
                # Healthy the moment the port accepts (no warmup request of its own); a 1-token generation in ~1 ms.
                "server_args": ["--skip-server-warmup"],
                "sim": {
                    **{"load_s": load_s, "warmup_s": 0.0, "drain_s": 0.0, "decode_ms": 1.0},
                    **{"prefill_ms": 0.0, "prefill_per_token_ms": 0.0, "launch_noise": 0.0},
                },
            }
        )
    )
    return str(path)


def _run(code: Path, env: dict[str, str], argv: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", *argv],
        env={**env, "PYTHONPATH": str(code)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"worker failed ({code}, {argv}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="3e11be3", help="git ref of the code to compare against (default: 3e11be3)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds; each runs every configuration once, interleaved")
    ap.add_argument("--arms", type=int, default=2, help="arms (launches) per experiment")
    ap.add_argument("--tp-size", type=int, default=8)
    ap.add_argument("--no-ssh", action="store_true", help="local host only")
    ap.add_argument("--no-long-load", action="store_true", help=f"skip the {LONG_LOAD_S:g} s load (calls per load)")
    ap.add_argument("--json-out", help="write the raw per-arm numbers here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--host", choices=("local", "ssh"), help=argparse.SUPPRESS)
    ap.add_argument("--profile", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--remote-workdir", help=argparse.SUPPRESS)
    ap.add_argument("--install-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(REPO))
    from tests import fake_nvidia_smi

    ns = f"bench-{os.getpid()}"
    os.environ["ORCH_NAMESPACE"] = ns
    trees = {"after": REPO}
    results: dict[str, list[dict[str, float]]] = {}
    long_load: dict[str, str] = {}
    raw: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="orch-lifecycle-") as tmp_s:
        tmp = Path(tmp_s)
        before = tmp / "before"
        before.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
        trees["before"] = before
        fake = fake_nvidia_smi.install(tmp / "bin", tmp / "gpu-state.json", gpus=args.tp_size)
        env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
        port = _free_port()
        profile = _profile(tmp / "bench.yaml", port, args.tp_size, 0.0)
        slow = _profile(tmp / "slow.yaml", port, args.tp_size, LONG_LOAD_S)
        sshd = None
        configs = [c for c in CONFIGS if not (args.no_ssh and c[1] == "ssh")]
        try:
            if not args.no_ssh:
                from tests.sshd import SSHD

                sshd = SSHD.start(tmp / "sshd", path_prepend=str(fake))
                env["ORCH_SSH_CONFIG"] = str(sshd.ssh_config)
            common = ["--workdir", str(tmp), "--remote-workdir", str(tmp / "remote")]
            for version in ("before", "after"):
                if sshd is not None:  # the agent's upload happens once per version, like a first session's
                    _run(trees[version], env, ["--host", "ssh", "--profile", profile, "--install-only", *common])
            for r in range(args.rounds):
                order = configs[r % len(configs) :] + configs[: r % len(configs)]
                for version, kind in order:
                    argv = ["--host", kind, "--profile", profile, "--arms", str(args.arms), *common]
                    doc = _run(trees[version], env, argv)
                    arms = split(doc)
                    results.setdefault(f"{version} {kind}", []).extend(arms)
                    raw.append({"version": version, "host": kind, "round": r, "arms": arms})
                    print(f"round {r + 1}/{args.rounds}: {version} {kind} done", file=sys.stderr, flush=True)
            if not args.no_long_load:
                for version, kind in configs:
                    doc = _run(trees[version], env, ["--host", kind, "--profile", slow, "--arms", "1", *common])
                    (arm,) = split(doc)
                    long_load[f"{version} {kind}"] = (
                        f"{arm['calls while loading']:g} + {arm['channel opens while loading']:g}"
                    )
                    raw.append({"version": version, "host": kind, "long_load_s": LONG_LOAD_S, "arms": [arm]})
        finally:
            if sshd is not None:
                sshd.stop()
            sys.path.insert(0, str(REPO))
            from orchestrator import hostside

            leftovers = hostside.op_find(ns)
            hostside.op_down(ns, grace_s=2)
            shutil.rmtree(tmp / "remote", ignore_errors=True)
    print(
        f"`orch ab` path, simulator tp_size={args.tp_size} (load 0 s, --skip-server-warmup), {args.arms} arms x "
        f"{args.rounds} rounds per column; before = {args.before}, after = this checkout; fake nvidia-smi on PATH\n"
    )
    print(table(results, long_load))
    print(
        f"\nThe last row counts host calls + SSH channel opens during the ready wait of one arm whose server takes "
        f"{LONG_LOAD_S:g} s to load: before, it grows with the load time (a liveness call and an HTTP poll every "
        "0.25 s, a log tail every second); after, it is one call whatever the load time."
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"before": args.before, "runs": raw}, indent=1))
    if leftovers:
        print(f"LEAK: {leftovers}", file=sys.stderr)
        sys.exit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()

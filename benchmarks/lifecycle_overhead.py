"""What a user waits for per arm, beyond loading and benchmarking: the real `orch ab` path, local vs SSH, against a bare
launch of the same server.

Each orch experiment is `run_ab` itself (host facts, the host lock, the store, preflight with the GPU check, launch,
readiness at the default settings, env read-back, fingerprint, one warmup and one run, teardown with the GPU-idle
wait) against the simulator with zero load time, a fake `nvidia-smi` on PATH (the tests' one: the simulator's workers
hold GPU memory while they live) and `--skip-server-warmup` (so the server is healthy the moment its port accepts).
Columns, interleaved round by round so all see the same machine:
- orch local: the local host;
- orch ssh: a real OpenSSH server on 127.0.0.1 (the test harness), so the SSH column is the cost of the SSH path with
  no network latency: on a real network add one round-trip time per host call and per channel open;
- bare launch: the floor, what a minimal hand-written script does with the same server: start the same argv with the
  same environment, connect to its port every millisecond, send the same warmup and run (streamed /generate) the
  moment it accepts, SIGTERM its process group and wait for it to exit. No preflight, no store, no checks.
Whole commands, also interleaved: `orch ab P P --sim` (one block: 2 launches) from process start to exit, against the
bare script doing the same two launches as a whole process.

Readiness latency: a thread connects to the server's port every millisecond from the launch on; "port open → ready"
is from its first accepted connection to orch declaring the server ready (the `env check` phase begins). Host calls
are counted by wrapping `Host.call`, SSH channel opens by wrapping paramiko's `Transport.open_channel` (the agent's
session, SFTP, and one direct-tcpip channel per tunnelled HTTP connection).

The figures of the change that introduced one-call readiness (issue 14, measured against commit 3e11be3) are recorded
in docs/performance.md; that code's internals cannot be driven by this script's worker any more, so the comparison
here is against baselines that keep working: SSH vs local, and orch vs a bare launch.

Run with `make bench` (`--smoke`: one short round of everything, seconds); results are written up in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
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
CONFIGS = ("orch local", "orch ssh", "bare launch")
WARMUP_TOKENS, RUN_TOKENS = 4, 16  # the same for orch (BenchConfig below) and the bare launch


# ------------------------------------------------------------------ the workers: one experiment each


def _observer(port: int) -> tuple[threading.Event, list[float]]:
    """A thread that, once the event is set, connects to the port every millisecond and notes the first success."""
    watch, opened = threading.Event(), []

    def observe() -> None:
        while True:
            watch.wait()
            with socket.socket() as s:
                s.settimeout(0.05)
                try:
                    s.connect(("127.0.0.1", port))
                except OSError:
                    time.sleep(0.001)
                    continue
            opened.append(time.perf_counter())
            watch.clear()

    threading.Thread(target=observe, daemon=True).start()
    return watch, opened


def worker(args: argparse.Namespace) -> None:
    """One `run_ab` experiment with this checkout's code, on the local or the SSH host; prints its timeline as JSON."""
    from orchestrator.config.design import ABConfig
    from orchestrator.config.profile import load
    from orchestrator.config.workload import BenchConfig
    from orchestrator.experiment.ab import run_ab
    from orchestrator.hosts.base import HostConfig
    from orchestrator.hosts.local import LocalHost
    from orchestrator.results.store import Store
    from orchestrator.ui.events import Lines

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
    watch, opened = _observer(prof.port)

    def listener(name: str, **data: Any) -> None:
        events.append((time.perf_counter(), name, data.get("state")))
        if name == "launch":
            watch.set()

    bench = BenchConfig(min_run_s=0, runs=1, warmup=1, max_tokens=RUN_TOKENS, warmup_max_tokens=WARMUP_TOKENS)
    config = ABConfig(bench=bench, simulate=True, namespace=os.environ["ORCH_NAMESPACE"], order="fixed")
    store = Store(Path(args.workdir) / f"{time.time_ns()}.db")
    try:
        t0 = time.perf_counter()
        run_ab(host, [prof] * args.arms, config, store, events=Lines(phases=listener))
        t_end = time.perf_counter()
    finally:
        store.close()
        host.close()
    doc = {"connect_s": connect_s, "t0": t0, "t_end": t_end, "events": events, "opened": opened, "calls": calls}
    print(json.dumps({**doc, "channels": channels}))


def _stream(port: int, max_tokens: int) -> int:
    """One streamed /generate request read to its end, as a minimal client does; the bytes received."""
    body = {
        "input_ids": [1000 + i for i in range(16)],
        "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0},
        "stream": True,
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/generate answered {resp.status}: {data[:200]!r}")
        return len(data)
    finally:
        conn.close()


def bare_worker(args: argparse.Namespace) -> None:
    """The floor: the same server launched and benchmarked by a minimal script; prints its per-arm timeline. It
    imports nothing of orch: the argv, environment and port come from a file the parent wrote (`bare_spec`)."""
    spec = json.loads(Path(args.bare_worker).read_text())
    argv, env, port = spec["argv"], {**os.environ, **spec["env"]}, spec["port"]
    watch, opened = _observer(port)
    arms = []
    for _ in range(args.arms):
        opened.clear()
        t_launch = time.perf_counter()
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, cwd=args.workdir,
        )  # fmt: skip
        t_spawned = time.perf_counter()
        watch.set()
        try:
            while not opened:
                if proc.poll() is not None:
                    raise SystemExit(f"bare launch: the server exited with {proc.returncode} before its port opened")
                time.sleep(0.0005)
            t_bench = time.perf_counter()
            _stream(port, WARMUP_TOKENS)
            _stream(port, RUN_TOKENS)
            t_teardown = time.perf_counter()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # start_new_session: its group id is its pid
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        t_end = time.perf_counter()
        arms.append(
            {
                "launch": t_spawned - t_launch,
                "server start-up": opened[0] - t_spawned,
                "port open → benchmarking": t_bench - opened[0],
                "benchmark (1 warmup, 1 run)": t_teardown - t_bench,
                "teardown": t_end - t_teardown,
                "wall per arm": t_end - t_launch,
            }
        )
    print(json.dumps({"arms": arms}))


# ------------------------------------------------------------------ turning one orch experiment into per-arm figures


def split(doc: dict[str, Any]) -> list[dict[str, float]]:
    """Per arm: phase durations (s), readiness latencies, host calls and channel opens."""
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
                "port open → ready": t_env - t_open,
                "port open → benchmarking": t_bench - t_open,
                "env check + fingerprint": t_bench - t_env,
                "benchmark (1 warmup, 1 run)": t_teardown - t_bench,
                "teardown": end - t_teardown,
                "wall per arm": end - t_slot,
                "calls per arm": float(sum(1 for c in ops if c[0] not in (*PER_EXPERIMENT_OPS, "bench_run"))),
                "calls per run": sum(1 for c in ops if c[0] == "bench_run") / max(1, len(runs)),
                "calls while loading": float(sum(1 for c in ops if t_loading <= c[1] < t_env)),
                "channel opens per arm": float(sum(1 for c in doc["channels"] if t_slot <= c[1] < end)),
                "channel opens while loading": float(sum(1 for c in doc["channels"] if t_loading <= c[1] < t_env)),
            }
        )
    for arm in arms:
        arm["connect (per session)"] = doc["connect_s"]
        arm["experiment: facts, lock, store"] = (events[slots[0]][0] - doc["t0"]) if slots else 0.0
    return arms


# (label, key of the per-arm figures, unit, how the arms of a column are summarised)
Summary = Callable[[list[float]], float]
ROWS: tuple[tuple[str, str, str, Summary], ...] = (
    ("connect (per session)", "connect (per session)", "s", statistics.median),
    ("experiment: facts, lock, store", "experiment: facts, lock, store", "s", statistics.median),
    *((k, k, "s", statistics.median) for k in ("preflight", "launch", "server start-up")),
    ("port open → ready", "port open → ready", "ms", statistics.median),
    ("port open → ready, worst arm", "port open → ready", "ms", max),
    ("port open → benchmarking", "port open → benchmarking", "ms", statistics.median),
    *((k, k, "s", statistics.median) for k in ("env check + fingerprint", "benchmark (1 warmup, 1 run)")),
    ("teardown (orch: + GPU idle)", "teardown", "s", statistics.median),
    ("**wall per arm** (launch to stopped)", "wall per arm", "s", statistics.median),
    ("wall per arm − server start-up", "wall − start-up", "s", statistics.median),
    *((k, k, "n", statistics.median) for k in ("calls per arm", "calls per run", "channel opens per arm")),
)


def _fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{1000 * value:.1f} ms"
    if unit == "n":
        return f"{value:g}"
    return f"{value:.3f} s"


def _ratio(a: float | None, b: float | None) -> str:
    # Below a millisecond a ratio says nothing (connecting to the local host takes no time at all).
    return f"{a / b:.2f}x" if a is not None and b is not None and b >= 0.001 else ""


def table(results: dict[str, list[dict[str, float]]], whole: dict[str, list[float]], long_load: dict[str, str],
          long_load_s: float) -> str:  # fmt: skip
    kinds = [k for k in CONFIGS if k in results]
    head = "| per arm (median) | " + " | ".join(kinds) + " | ssh / local | orch local / bare |"
    lines = [head, "|---" * (len(kinds) + 3) + "|"]
    for arms in results.values():
        for arm in arms:
            arm["wall − start-up"] = arm["wall per arm"] - arm["server start-up"]
    for row, key, unit, summary in ROWS:
        med = {k: float(summary([a[key] for a in results[k]])) for k in kinds if key in results[k][0]}
        cells = [_fmt(med[k], unit) if k in med else "—" for k in kinds]
        ssh = _ratio(med.get("orch ssh"), med.get("orch local"))
        bare = _ratio(med.get("orch local"), med.get("bare launch"))
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {ssh} | {bare} |")
    if "bare launch" in kinds:
        net = {k: statistics.median(a["wall − start-up"] for a in results[k]) for k in kinds}
        cells = [f"+{net[k] - net['bare launch']:.3f} s" if k != "bare launch" else "" for k in kinds]
        lines.append("| **orch's overhead per arm** (wall − start-up, over the bare launch's) | " + " | ".join(cells)
                     + " | | |")  # fmt: skip
    if long_load:
        cells = [long_load.get(k, "—") for k in kinds]
        lines.append(f"| host calls + channel opens during a {long_load_s:g} s load | " + " | ".join(cells) + " | | |")
    if whole:
        med = {k: statistics.median(v) for k, v in whole.items()}
        cells = [_fmt(med[k], "s") if k in med else "—" for k in kinds]
        bare = _ratio(med.get("orch local"), med.get("bare launch"))
        lines.append(
            "| **whole command, 2 launches** (process start to exit) | " + " | ".join(cells) + f" | | {bare} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ the parent: harness, interleaving


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


def bare_spec(profile: str, into: Path) -> str:
    """What orch itself would start for this profile (argv and environment), for the bare launch."""
    from orchestrator.config.profile import load

    prof = load(profile)
    spec = {
        "argv": prof.launch_argv(sys.executable, simulate=True),
        "env": {**prof.env_dict(), **prof.sim_env()},
        "port": prof.port,
    }
    into.write_text(json.dumps(spec))
    return str(into)


def _run(env: dict[str, str], argv: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *argv],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"worker failed ({argv}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def _whole(env: dict[str, str], argv: list[str], cwd: Path, ok: tuple[int, ...] = (0,)) -> float:
    """Wall time of one whole process, as a user waits for it."""
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - t
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:  # noqa: PLR0915 (known debt: docs/architecture.md#known-debt)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4, help="rounds; each runs every column once, interleaved")
    ap.add_argument("--arms", type=int, default=2, help="arms (launches) per experiment")
    ap.add_argument("--tp-size", type=int, default=8)
    ap.add_argument("--no-ssh", action="store_true", help="no SSH column (also when /usr/sbin/sshd is missing)")
    ap.add_argument("--long-load-s", type=float, default=5.0, help="load time for the calls-per-load row (0: skip)")
    ap.add_argument("--smoke", action="store_true", help="one round of 1 arm, tp 2, 0.5 s load: runs in seconds")
    ap.add_argument("--json-out", help="write the raw per-arm numbers here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bare-worker", help=argparse.SUPPRESS)
    ap.add_argument("--host", choices=("local", "ssh"), help=argparse.SUPPRESS)
    ap.add_argument("--profile", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--remote-workdir", help=argparse.SUPPRESS)
    ap.add_argument("--install-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.bare_worker:
        bare_worker(args)
        return
    if args.smoke:
        args.rounds, args.arms, args.tp_size, args.long_load_s = 1, 1, 2, 0.5
    sys.path.insert(0, str(REPO))
    from tests import fake_nvidia_smi

    no_ssh = args.no_ssh or not Path("/usr/sbin/sshd").exists()
    if no_ssh and not args.no_ssh:
        print("no SSH column: /usr/sbin/sshd is not installed (the harness starts a private OpenSSH server)\n")
    ns = f"bench-{os.getpid()}"
    os.environ["ORCH_NAMESPACE"] = ns
    results: dict[str, list[dict[str, float]]] = {}
    whole: dict[str, list[float]] = {}
    long_load: dict[str, str] = {}
    raw: list[dict[str, Any]] = []
    leftovers: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="orch-lifecycle-") as tmp_s:
        tmp = Path(tmp_s)
        fake = fake_nvidia_smi.install(tmp / "bin", tmp / "gpu-state.json", gpus=args.tp_size)
        env = {
            **os.environ,
            "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
            **{v: str(tmp / v.lower()) for v in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME")},
        }
        port = _free_port()
        profile = _profile(tmp / "bench.yaml", port, args.tp_size, 0.0)
        slow = _profile(tmp / "slow.yaml", port, args.tp_size, args.long_load_s)
        spec = bare_spec(profile, tmp / "bare.json")
        sshd = None
        configs = [c for c in CONFIGS if not (no_ssh and c == "orch ssh")]
        common = ["--workdir", str(tmp), "--remote-workdir", str(tmp / "remote")]
        whole_argv = {
            "orch local": [sys.executable, "-m", "orchestrator", "ab", profile, profile, "--sim", "--blocks", "1",
                           "--warmup", "1", "--runs", "1", "--max-tokens", str(RUN_TOKENS), "--min-run-s", "0",
                           "--order", "fixed", "--db", str(tmp / "whole.db"), "-q"],
            "bare launch": [sys.executable, str(Path(__file__).resolve()), "--bare-worker", spec, "--arms", "2",
                            *common],
        }  # fmt: skip
        try:
            if not no_ssh:
                from tests.sshd import SSHD

                sshd = SSHD.start(tmp / "sshd", path_prepend=str(fake))
                env["ORCH_SSH_CONFIG"] = str(sshd.ssh_config)
                # The agent's upload happens once, like a first session's; not part of any figure.
                _run(env, ["--worker", "--host", "ssh", "--profile", profile, "--install-only", *common])
            for r in range(args.rounds):
                order = configs[r % len(configs) :] + configs[: r % len(configs)]
                for kind in order:
                    if kind == "bare launch":
                        arms = _run(env, ["--bare-worker", spec, "--arms", str(args.arms), *common])["arms"]
                    else:
                        host = kind.split()[1]
                        argv = ["--worker", "--host", host, "--profile", profile, "--arms", str(args.arms), *common]
                        arms = split(_run(env, argv))
                    results.setdefault(kind, []).extend(arms)
                    raw.append({"config": kind, "round": r, "arms": arms})
                    if kind in whole_argv:
                        # `orch ab` ends 0, or 4 when one block cannot decide (it never can at one launch per arm)
                        w = _whole({**env, "PYTHONPATH": str(REPO)}, whole_argv[kind], tmp, ok=(0, 4))
                        whole.setdefault(kind, []).append(w)
                        raw.append({"config": kind, "round": r, "whole_command_s": w})
                    print(f"round {r + 1}/{args.rounds}: {kind} done", file=sys.stderr, flush=True)
            if args.long_load_s > 0:
                for kind in configs:
                    if kind == "bare launch":
                        continue
                    host = kind.split()[1]
                    doc = _run(env, ["--worker", "--host", host, "--profile", slow, "--arms", "1", *common])
                    (arm,) = split(doc)
                    long_load[kind] = f"{arm['calls while loading']:g} + {arm['channel opens while loading']:g}"
                    raw.append({"config": kind, "long_load_s": args.long_load_s, "arms": [arm]})
        finally:
            if sshd is not None:
                sshd.stop()
            from orchestrator.agent import ops as hostside

            leftovers = hostside.op_find(ns)
            hostside.op_down(ns, grace_s=2)
            shutil.rmtree(tmp / "remote", ignore_errors=True)
    print(
        f"`orch ab` path, simulator tp_size={args.tp_size} (load 0 s, --skip-server-warmup), {args.arms} arms x "
        f"{args.rounds} rounds per column, interleaved; this checkout; fake nvidia-smi on PATH; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end\n"
    )
    print(table(results, whole, long_load, args.long_load_s))
    print(
        "\norch's overhead per arm is what orch adds to a bare launch of the same server: 'wall per arm − server "
        "start-up' (start-up is the server's own time, the same work in every column) less the bare launch's. "
        f"The calls row during a load counts host calls + SSH channel opens while one arm's server takes "
        f"{args.long_load_s:g} s to load: one call, whatever the load time. Whole command: `orch ab P P --sim "
        "--blocks 1` (2 launches) against the bare script making the same 2 launches, each a whole process."
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"runs": raw}, indent=1))
    if leftovers:
        print(f"LEAK: {leftovers}", file=sys.stderr)
        sys.exit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()

"""Host-side agent: the work orch does *on* a host (launch, find, inspect, kill, benchmark), JSON in/out.

The local host calls `dispatch()` in-process; a remote host runs it with the host's Python (`python3 orch_agent.py
--serve`, one JSON request per line). It needs only the stdlib, psutil and the packages shipped with it
(`hosts.agentlink.SHIPPED_PACKAGES`): its siblings `processes` (the marker, finding orch's processes), `facts`
(facts, GPUs, engine versions, fingerprints), `waits` (until a launch is ready, until the GPUs are idle), `teardown`
(stopping a launch, a port's holder) and `lock` (the host lock), with `common.redaction`, the benchmark client and
`sim/`. Keep every other orchestrator import out of it.

A launch costs few round trips: one call each for preflight (leftovers, port owner, GPUs), launch, the wait until
ready, the env read-back with the process list, and teardown with the GPU-idle wait. Long calls report progress
(`report()`), which `serve()` sends as heartbeats and the local host hands to its caller directly.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import psutil

from orchestrator.agent import cpu, waits
from orchestrator.agent.facts import home_path, op_check, op_facts, op_fingerprint, op_gpus
from orchestrator.agent.lock import keep_for_successor, op_lock, op_unlock
from orchestrator.agent.processes import (
    MARKER,
    OWNER,
    PROFILE,
    HostSideError,
    describe_process,
    identity,
    is_gone,
    marked_processes,
    masked_cmdline,
    owner_state,
    read_environ,
    self_owner,
)
from orchestrator.agent.teardown import op_kill_port_owner, op_port_owner, recorded_processes, stop_launch
from orchestrator.common.redaction import redact

# Variables that change what an inference server does even when no profile set them.
# Variables of the runtimes every engine sits on, reported from every worker beside the profile's own; the engine's
# own prefixes come with each call (engines/base.Engine.env_prefixes).
RUNTIME_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "NVIDIA_", "OMP_", "HF_", "TRITON_")

# Launch detached: a new session (so the whole tree is one process group we can signal), stdin from /dev/null,
# output to the log, and the PID written from inside before exec so it is the server's own PID.
_LAUNCH_SH = (
    "pidfile=$1; log=$2; shift 2; "
    'setsid sh -c \'echo $$ > "$0"; exec "$@"\' "$pidfile" "$@" > "$log" 2>&1 < /dev/null &'
)

__all__ = [
    "MARKER",
    "OWNER",
    "HostSideError",
    "dispatch",
    "launch_problem",
    "op_gpus",
    "owner_state",
    "report",
    "reporting_to",
    "serve",
]

# 2: request ids echoed, heartbeats while a request runs; 3: progress heartbeats, combined ops; 4: ABANDON;
# 5: bench_run's endpoint is the engine's wire (client.request.Wire as JSON); launch_state takes the engine's env
# prefixes; facts and check take the packages to read
PROTOCOL_VERSION = 5
# What orch writes before closing the channel of an agent it abandons on purpose (Ctrl-C mid-request), so the agent
# hands its locks to a keeper for the session's next agent (agent/lock.keep_for_successor) instead of releasing them.
ABANDON = b'{"abandon": true}'

# ---------------------------------------------------------------- progress of a long operation

Sink = Callable[[dict[str, Any]], None]
_SINK: contextvars.ContextVar[Sink | None] = contextvars.ContextVar("orch_agent_progress", default=None)


def report(data: dict[str, Any]) -> None:
    """Progress of the operation in flight (a state, a log line, a step begun): to whoever listens, if anyone."""
    sink = _SINK.get()
    if sink is not None:
        with contextlib.suppress(Exception):  # progress never fails the operation
            sink(data)


@contextlib.contextmanager
def reporting_to(sink: Sink) -> Iterator[None]:
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


# ---------------------------------------------------------------- operations


def op_hello() -> dict[str, Any]:
    return {"protocol": PROTOCOL_VERSION, "python": sys.version.split()[0], "psutil": psutil.__version__}


def op_find(namespace: str) -> list[dict[str, Any]]:
    """Every live process carrying an orch launch marker of this namespace, with its owning session's state."""
    prefix = namespace + ":"
    out = []
    states: dict[str | None, str] = {}
    for proc, lid in marked_processes(lambda v: v.startswith(prefix)):
        env = read_environ(proc) or {}
        owner = env.get(OWNER)
        if owner not in states:
            states[owner] = owner_state(owner)
        out.append(
            {**describe_process(proc, lid), "owner": owner, "owner_state": states[owner], "profile": env.get(PROFILE)}
        )
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


def op_preflight(
    namespace: str, port: int, nvidia_smi: str = "nvidia-smi", port_wait_s: float = 30.0
) -> dict[str, Any]:
    """Before a launch, in one round trip: orch's leftovers in this namespace torn down (none at all if any of them
    belongs to a live session: the caller refuses), then who holds the port, then the GPUs' state."""
    leftovers = op_find(namespace)
    if any(p.get("owner_state") == "alive" for p in leftovers):
        return {"leftovers": leftovers, "cleaned": [], "port_owner": None, "gpus": None}
    cleaned = []
    for launch_id in sorted({p["launch_id"] for p in leftovers}):
        procs = [p for p in leftovers if p["launch_id"] == launch_id]
        leader = next((p for p in procs if p["pid"] == p["pgid"]), None)
        report({"step": "cleanup", "launch_id": launch_id, "processes": len(procs)})
        td = op_teardown(launch_id, pgid=leader["pgid"] if leader else None, port_wait_s=port_wait_s)
        cleaned.append({"launch_id": launch_id, "pids": [p["pid"] for p in procs], "teardown": td})
    return {"leftovers": leftovers, "cleaned": cleaned, "port_owner": op_port_owner(port), "gpus": op_gpus(nvidia_smi)}


def op_launch(argv: list[str], env: dict[str, str], log_path: str, cwd: str | None = None) -> dict[str, Any]:
    """Start argv detached in a new session, logging to log_path; return its PID (= PGID)."""
    if not argv:
        raise HostSideError("empty command line")
    # No shell reads argv: a leading ~/ (a profile's python or model_path under the home of the host's user) is
    # expanded here, on the host, as a shell would.
    argv = [home_path(a) for a in argv]
    if os.sep in argv[0] and not os.access(argv[0], os.X_OK):
        raise HostSideError(f"could not start {argv[0]}: no such executable on this host")
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    _private_file(log_path)
    pidfile = log_path + ".pid"
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    full_env = dict(os.environ)
    full_env.update(env)
    full_env[OWNER] = self_owner()
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


def _private_file(path: str) -> None:
    """path exists, empty or not, readable by its owner only (0600), before anything is written to it: a server's
    log holds what it prints (its args, a URL with a password), and orch often runs as root on a shared host. The
    shell's `>` then truncates it and keeps the mode; an existing file (a launch id reused) is narrowed too."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
    except OSError as e:
        raise HostSideError(f"could not create the server log {path} readable by its owner only: {e}") from e


def op_alive(pid: int) -> dict[str, Any]:
    return waits.alive(pid)


def op_wait_ready(
    pid: int,
    port: int,
    probe: dict[str, Any],
    log_path: str,
    timeout_s: float,
    address: str = "127.0.0.1",
    poll_s: float = 0.02,
    log_every_s: float = 1.0,
    probe_timeout_s: float = 10.0,
    then: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Wait here, next to the server, until its probe succeeds, its process exits, or timeout_s passes.

    then: what orch needs next, done here without another round trip — "fingerprint" (op_fingerprint's arguments:
    run while the server loads, since importing the engine's packages can take seconds), and once ready
    "launch_state" (op_launch_state's arguments), "cpu_speed" (agent/cpu's probe) and "server_info" (the engine's
    info paths, tried in order: engines/base.Engine.info_paths_of)."""
    import threading

    then = then or {}
    fingerprint: dict[str, Any] = {}

    def probe_packages() -> None:
        try:
            fingerprint["value"] = op_fingerprint(**then["fingerprint"])
        except Exception as e:  # evidence only: orch records it as unreadable
            fingerprint["error"] = f"{type(e).__name__}: {e}"[:500]

    worker = threading.Thread(target=probe_packages, daemon=True) if "fingerprint" in then else None
    if worker is not None:
        worker.start()
    result = waits.wait(
        pid, port, probe, log_path, timeout_s, address=address, poll_s=poll_s, log_every_s=log_every_s,
        probe_timeout_s=probe_timeout_s, report=report,
    )  # fmt: skip
    if not result["ready"]:
        return result  # a failed start is reported at once; the probe thread's answer is not needed
    if then.get("cpu_speed"):
        # Now, with the server loaded and idle and before any run: the speed its threads will get from this CPU.
        t = time.monotonic()
        # Evidence only, never the launch's failure: without it orch asks again and records why not.
        with contextlib.suppress(Exception):
            result["cpu_speed"] = cpu.op_cpu_speed()
        result["cpu_speed_s"] = time.monotonic() - t  # not part of the server's time to ready
    if "launch_state" in then:
        result["launch_state"] = op_launch_state(**then["launch_state"])
    if then.get("server_info"):
        result["server_info"] = waits.server_info(address, port, [str(p) for p in then["server_info"]])
    if worker is not None:
        worker.join()
        result["fingerprint"] = fingerprint
    return result


def op_environ(
    launch_id: str, keys: list[str], digest_key: str | None = None, prefixes: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """For each process of the launch: the requested variables (None when missing) and other relevant ones (the
    runtimes' RUNTIME_PREFIXES and the engine's `prefixes`).

    Secret-looking values are digested here, on the host, with digest_key (hex; the caller's store key) so they
    never cross the wire in clear and still compare equal to the caller's own digests of the profile's values.
    """
    key = bytes.fromhex(digest_key) if digest_key else None
    out = []
    relevant = (*RUNTIME_PREFIXES, *prefixes)
    for proc, _ in marked_processes(lambda v: v == launch_id):
        env = read_environ(proc)
        if env is None:
            continue
        wanted = {k: (redact(k, env[k], key) if k in env else None) for k in keys}
        extra = {k: redact(k, v, key) for k, v in env.items() if k not in wanted and k.startswith(relevant)}
        out.append({**describe_process(proc, launch_id), "env": wanted, "other_env": extra})
    out.sort(key=lambda d: d["pid"])
    return out


def op_launch_procs(launch_id: str, pid: int) -> list[dict[str, Any]]:
    """Every process of a launch now: those carrying its marker and every descendant of its main process (which
    finds a worker that re-exec'd without the marker). Recorded once the server is ready, so that liveness checks
    and teardown know the whole launch even if a member later drops the marker."""
    procs = {p.pid: p for p, _ in marked_processes(lambda v: v == launch_id)}
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        main = psutil.Process(pid)
        procs.setdefault(main.pid, main)
        for child in main.children(recursive=True):
            procs.setdefault(child.pid, child)
    out = []
    for proc in procs.values():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if not is_gone(proc):
                out.append({**identity(proc), "cmdline": masked_cmdline(proc, 120)})
    return sorted(out, key=lambda d: d["pid"])


def op_launch_state(
    launch_id: str, pid: int, keys: list[str], digest_key: str | None = None, prefixes: Sequence[str] = ()
) -> dict[str, Any]:
    """Once ready, in one round trip: every process's environment (op_environ) and the launch's processes
    (op_launch_procs)."""
    return {"environ": op_environ(launch_id, keys, digest_key, prefixes), "procs": op_launch_procs(launch_id, pid)}


def launch_problem(procs: list[dict[str, Any]]) -> str | None:
    """Why a launch is no longer whole (a recorded process exited), or None while every one still runs."""
    _, gone = recorded_processes(procs)
    if not gone:
        return None
    first = gone[0]
    more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
    return f"process {first['pid']} of the launch ({first.get('cmdline', '?')}){more} exited"


def op_launch_health(procs: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether every recorded process of a launch still runs."""
    problem = launch_problem(procs)
    return {"ok": problem is None, "problem": problem}


def op_teardown(
    launch_id: str,
    pgid: int | None = None,
    port: int | None = None,
    grace_s: float = 10.0,
    port_wait_s: float = 30.0,
    known: list[dict[str, Any]] | None = None,
    gpu_wait_s: float | None = None,
    nvidia_smi: str = "nvidia-smi",
    gpu_idle_mib: int = 2048,
) -> dict[str, Any]:
    """The launch stopped (`teardown.stop_launch`: only its own processes are ever signalled); with gpu_wait_s,
    then wait (bounded) for the GPUs' memory to be back to idle (`gpus_after`)."""
    report_ = stop_launch(launch_id, pgid, port, grace_s, port_wait_s, known)
    if gpu_wait_s is not None:
        report_["gpus_after"] = waits.gpus_idle(nvidia_smi, gpu_idle_mib, gpu_wait_s, report=report)
    return report_


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


GPU_PROBE_AFTER_S = 0.2  # into the run: the GPUs are busy, and even short test runs last longer


def op_bench_run(
    port: int,
    endpoint: dict[str, Any],
    bodies: list[dict[str, Any]],
    max_tokens: list[int],
    concurrency: int,
    timeout_s: float = 600.0,
    address: str = "127.0.0.1",
    gpu_probe: str | None = None,
    stall_s: float = 60.0,
    first_token_s: float = 180.0,
    watch: list[dict[str, Any]] | None = None,
    *,
    power_smi: str | None = None,
    open_loop: dict[str, Any] | None = None,
    flush: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One benchmark run against address:port, measured here next to the server (open_loop: its requests sent at
    their scheduled times, client.runner.run). `endpoint`: how the engine is spoken to (client.request.Wire as
    JSON: path, stream format, metrics path and counters).

    With gpu_probe (the nvidia-smi to run), GPU clocks and temperatures are read once, GPU_PROBE_AFTER_S into the
    run: while the GPUs work. Read after the run they would already be falling back to idle.
    With power_smi (the nvidia-smi to run), one looping nvidia-smi samples the GPUs' power every 100 ms for the
    run's duration, in this same call; the run's energy over its steady window is result["energy"] (its "error"
    says why there is none: a missing or failing nvidia-smi never fails the run).
    With flush ({"method", "path"}: --flush-cache), that request empties the server's prefix cache first, in this
    same call; if it fails the run is not sent and the answer is {"cache_flush_failed": what the server said}.
    """
    import threading

    from orchestrator.agent.power import RunEnergy
    from orchestrator.client import runner
    from orchestrator.client.cacheflush import flush_cache

    if flush is not None:
        # Before the power sampler and the GPU probe start: emptying the cache is no part of the run.
        failed = flush_cache(address, port, flush)
        if failed is not None:
            return {"cache_flush_failed": failed}

    reading: list[dict[str, Any]] = []
    probe = None

    def read(nvidia_smi: str) -> None:
        # A probe never fails a run, nor prints a thread traceback into the agent's stderr.
        with contextlib.suppress(Exception):
            reading.append(op_gpus(nvidia_smi))

    power = RunEnergy(power_smi, watch, runner.live) if power_smi else None
    try:
        if power is not None:
            power.begin()  # nvidia-smi's first sample is in before the run starts
        if gpu_probe:
            probe = threading.Timer(GPU_PROBE_AFTER_S, read, args=(gpu_probe,))
            probe.daemon = True
            probe.start()
        result = runner.run(
            address,
            port,
            endpoint,
            bodies,
            max_tokens,
            concurrency,
            timeout_s,
            0.0,  # orch judges a run's length itself (--min-run-s)
            stall_s=stall_s,
            first_token_s=first_token_s,
            # Every recorded process of the launch, checked here next to it: a dead worker stops the run at once.
            watchdog=(lambda: launch_problem(watch)) if watch else None,
            open_loop=open_loop,
        )
    except BaseException:
        if power is not None:
            power.finish(None)  # nvidia-smi stops whatever happened to the run
        raise
    finally:
        if probe is not None:
            probe.cancel()
            probe.join(timeout=65)  # a probe already running finishes (op_gpus: two nvidia-smi calls, 30 s each)
    result["gpus"] = reading[0] if reading else None
    if power is not None:
        result["energy"] = power.finish(result)
    return result


def op_log_tail(path: str, lines: int = 40, max_bytes: int = 65536) -> str:
    return waits.log_tail(path, lines, max_bytes)


OPS: dict[str, Callable[..., Any]] = {
    "hello": op_hello,
    "facts": op_facts,
    "find": op_find,
    "port_owner": op_port_owner,
    "launch": op_launch,
    "alive": op_alive,
    "wait_ready": op_wait_ready,
    "preflight": op_preflight,
    "launch_state": op_launch_state,
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
    "cpu_speed": cpu.op_cpu_speed,
    "lock": op_lock,
    "unlock": op_unlock,
}


# A request this large carries long prompts as token ids (bench_run's bodies). Decoded as JSON, each id would be an
# int object of its own (28 bytes, beside its 8-byte slot in the list): ids below SHARED_INTS come from one table
# instead, which takes a 10M-token run from about 360 MB to 80 MB here, for about 3x the decoding time of its ints.
# A smaller request decodes as it always did.
LARGE_REQUEST_BYTES = 1 << 20
SHARED_INTS = 1 << 15  # token ids orch generates lie below 32000 (config/traces.VOCAB, --prompts random)


class _SharedInts(dict[str, int]):
    def __missing__(self, digits: str) -> int:
        return int(digits)  # one outside the table: as json would


@functools.cache
def _shared_ints() -> _SharedInts:
    return _SharedInts((str(i), i) for i in range(SHARED_INTS))


def decode_request(text: str | bytes | bytearray) -> Any:
    """A request as JSON; in a large one (bench_run's token ids) the integers below SHARED_INTS are shared objects."""
    if len(text) < LARGE_REQUEST_BYTES:
        return json.loads(text)
    return json.loads(text, parse_int=_shared_ints().__getitem__)


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
# During a benchmark run the heartbeat comes every second and carries the run's tokens so far (live progress).
RUN_HEARTBEAT_S = 1.0


def serve() -> None:
    """One JSON request per line on stdin, one JSON reply per line on stdout, until EOF (the connection closed).

    Each request runs in a worker thread while this loop (a) writes a heartbeat line every HEARTBEAT_S so orch can
    tell a long benchmark run from a dead connection, and one at once for each progress event the operation
    reports (`"event"`), and (b) watches stdin: requests come strictly one at a time, so input during a request can
    only be EOF, and then the agent exits at once — a benchmark run or a wait orch gave up on must not go on.
    """
    import threading

    fd = sys.stdin.fileno()
    done_r, done_w = os.pipe()
    event_r, event_w = os.pipe()
    buffer = bytearray()
    while True:
        line = read_line(fd, buffer)
        if line is None:
            return
        if not line.strip():
            continue
        try:
            request = decode_request(line)
        except json.JSONDecodeError as e:
            _write({"ok": False, "error": f"request is not JSON: {e}"})
            continue
        box: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        lock = threading.Lock()

        def sink(data: dict[str, Any], q: list[dict[str, Any]] = events, guard: threading.Lock = lock) -> None:
            with guard:
                q.append(data)
            os.write(event_w, b"e")  # wakes the loop below: the event goes out now, not with the next heartbeat

        def work(b: list[dict[str, Any]] = box, r: dict[str, Any] = request, report_to: Sink = sink) -> None:
            try:
                with reporting_to(report_to):
                    b.append(dispatch(r))
            finally:
                os.write(done_w, b"x")  # wakes the loop below at once: no polling latency per request

        rid = request.get("id")

        def flush(q: list[dict[str, Any]] = events, guard: threading.Lock = lock, rid: Any = rid) -> None:
            with guard:
                pending = q[:]
                q.clear()
            for event in pending:
                _write({"id": rid, "heartbeat": True, "event": event})

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        every = RUN_HEARTBEAT_S if request.get("op") == "bench_run" else HEARTBEAT_S
        next_beat = time.monotonic() + every
        while True:
            readable, _, _ = select.select([fd, done_r, event_r], [], [], max(0.0, next_beat - time.monotonic()))
            if event_r in readable:
                os.read(event_r, 4096)
                flush()
            if done_r in readable:
                os.read(done_r, 1)
                break
            if fd in readable:
                given_up(fd)
            if time.monotonic() >= next_beat:
                beat: dict[str, Any] = {"id": request.get("id"), "heartbeat": True}
                measuring = sys.modules.get("orchestrator.client.runner")  # imported by the run in flight, if any
                if measuring is not None:
                    beat["progress"] = measuring.live()
                _write(beat)
                next_beat += every
        worker.join()
        flush()  # events reported just before the answer go out before it
        _write(box[0] if box else {"ok": False, "error": "the request died without an answer", "id": request.get("id")})


def read_line(fd: int, buffer: bytearray) -> bytearray | None:
    """The next line from fd, without its newline (None at EOF), `buffer` holding what was read past it. One growing
    buffer, searched only where new data landed: a run's request may be tens of MB (its prompts as token ids), and
    joining and rescanning it at every 64 KiB read took a minute for 65 MB."""
    end = buffer.find(b"\n")
    while end < 0:
        data = os.read(fd, 65536)
        if not data:
            return None
        start = len(buffer)
        buffer += data
        end = buffer.find(b"\n", start)
    line = buffer[:end]
    del buffer[: end + 1]
    return line


def given_up(fd: int) -> NoReturn:
    """Orch gave up on the request in flight: EOF (orch or its connection is gone), or ABANDON then EOF (Ctrl-C: orch
    lives, and a fresh agent of its session takes over, so the locks go to a keeper, not back to the kernel). Either
    way the request stops now: a benchmark run or a wait orch gave up on must not go on."""
    if ABANDON in os.read(fd, 65536):
        keep_for_successor()
    os._exit(0)


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

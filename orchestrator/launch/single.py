"""One launched server on one host: the lifecycle's steps (preflight, launch, readiness, read-back, teardown)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from orchestrator import __version__, engines
from orchestrator.agent.ops import MARKER
from orchestrator.agent.processes import PROFILE
from orchestrator.agent.waits import gpu_problems
from orchestrator.common import stopsignals
from orchestrator.common.printable import visible
from orchestrator.config.profile import Profile
from orchestrator.config.secretpatterns import redact, redact_argv, remask, scrub, secret_values
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import AllocationEnded, HostError, ServerError
from orchestrator.hosts.base import Host, connect_address
from orchestrator.launch import fingerprint
from orchestrator.launch.benchmark import Runner, runner_for
from orchestrator.ui import progress
from orchestrator.ui.events import QUIET, Events


def new_launch_id(namespace: str) -> str:
    return f"{namespace}:{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, kw_only=True)
class Launch:
    """A started server: how to find it again and what it was started with."""

    launch_id: str
    profile: str
    pid: int
    pgid: int
    port: int
    log_path: str
    argv: tuple[str, ...]
    env: dict[str, str]
    simulated: bool
    started_at: float


@dataclass(frozen=True, kw_only=True)
class LaunchRecord:
    """What is stored of a launch as it starts (an attached server's has no argv, env or PID)."""

    launch_id: str
    started_at: float
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    pid: int | None = None


@dataclass(frozen=True, kw_only=True)
class EnvMismatch:
    pid: int
    cmdline: str
    var: str
    expected: str
    actual: str | None
    note: str = ""


@dataclass(frozen=True)
class EnvReport:
    """What the profile asked for versus what each process of the launch actually holds in /proc/PID/environ."""

    processes: int
    mismatches: tuple[EnvMismatch, ...] = ()
    inherited: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def to_dict(self) -> dict[str, Any]:
        return {
            "processes": self.processes,
            "ok": self.ok,
            "mismatches": [m.__dict__ for m in self.mismatches],
            "inherited": self.inherited,
        }


# What to do about a port someone else holds. Not "edit the profile" (README advises against a profile that only moves
# the port): the run's own --port, which serves every arm of an A/B, as they launch one after another.
OTHER_PORT = (
    "give the run a free port: --port N on ab/bench/reproduce (one port for every arm: they launch one after "
    "another), `make demo PORT=N` for the demo, `port:` on a nightly item"
)


def preflight(
    host: Host, profile: Profile, namespace: str, events: Events = QUIET, *, force: bool = False
) -> dict[str, Any]:
    """Make the host fresh for a launch and verify it: no earlier orch launch, the port free, the GPUs idle.
    One host round trip (the agent cleans up, then reads the port's owner and the GPUs), unless a port owner is
    killed on request."""
    cfg = host.config

    def cleaning(event: dict[str, Any]) -> None:
        if event.get("step") == "cleanup":
            events.line(
                f"cleaning up {event.get('processes')} leftover process(es) of earlier orch launch "
                f"{event.get('launch_id')}"
            )

    state = host.call(
        "preflight",
        namespace=namespace,
        port=profile.port,
        nvidia_smi=cfg.nvidia_smi,
        port_wait_s=30,
        on_progress=cleaning,
        call_timeout=PREFLIGHT_TIMEOUT_S,
    )
    leftovers = state["leftovers"]
    live = sorted({(p["launch_id"], p.get("owner")) for p in leftovers if p.get("owner_state") == "alive"})
    if live:
        # The host lock keeps a second session out; this is the last line of defence should anything slip past it.
        raise HostError(
            f"{host.name}: orch launch {live[0][0]} belongs to another orch session that is still running "
            f"(process {live[0][1].split(':')[0]} on the host); orch never tears down a live session's server. "
            "Wait for it to finish, or stop it with `orch down --force` if you are sure."
        )
    record: dict[str, Any] = {"cleaned": state["cleaned"], "port_owner": None, "gpus": None}
    gpus = state["gpus"]
    owners = state["port_owner"]
    if owners:
        owner = owners[0]
        record["port_owner"] = owner
        if force and cfg.foreign_port == "kill-with-force" and owner["pid"] is not None:
            events.line(
                f"port {profile.port}: killing its owner PID {owner['pid']} ({owner['cmdline']}) "
                "because the host's policy is kill-with-force and --force was given"
            )
            record["killed_port_owner"] = host.call("kill_port_owner", port=profile.port, pid=owner["pid"])
            gpus = host.call("gpus", nvidia_smi=cfg.nvidia_smi)  # it may have been what held them
        else:
            how = (
                f"Stop it yourself, or {OTHER_PORT}."
                if cfg.foreign_port == "refuse"
                else f"Stop it yourself, pass --force to let orch kill exactly that process, or {OTHER_PORT}."
            )
            raise HostError(
                f"port {profile.port} on {host.name} is in use by PID {owner['pid']} ({owner['cmdline']}), "
                f"which this orch did not launch; orch will not kill it. {how}"
            )
    record["gpus"] = _gpus_idle(host, gpus)
    return record


# Cleaning up leftovers can take a while (each: grace, SIGKILL, a wait); the agent heartbeats meanwhile.
PREFLIGHT_TIMEOUT_S = 600.0


def _gpus_idle(host: Host, state: dict[str, Any]) -> dict[str, Any]:
    cfg = host.config
    if not state["available"]:
        if cfg.gpus:
            raise HostError(f"{host.name}: the inventory expects {cfg.gpus} GPUs but {state['error']}")
        return state
    problems = gpu_problems(state, cfg.gpu_idle_mib, cfg.gpus)
    if problems:
        raise HostError(f"{host.name} is not idle; orch will not launch: " + "; ".join(problems))
    return state


def check_gpus_idle(host: Host, namespace: str) -> dict[str, Any]:
    """Refuse to launch on GPUs that someone is using; a host without nvidia-smi is recorded, not refused."""
    return _gpus_idle(host, host.call("gpus", nvidia_smi=host.config.nvidia_smi))


def profile_secrets(profile: Profile) -> list[str]:
    """The secret values a profile passes (secret flags' values, secret-named env values), for scrub()."""
    return secret_values(profile.server_flags(), profile.env_dict())


def launch(
    host: Host,
    profile: Profile,
    *,
    simulate: bool,
    namespace: str,
    redaction_key: bytes | None = None,
    extra_args: Sequence[str] = (),
    launch_id: str | None = None,
) -> Launch:
    """Start the server detached; the returned Launch (which gets stored) holds its argv and env with digests
    (keyed with redaction_key) in place of secret values. extra_args: one node's flags of a multi-node launch."""
    launch_id = launch_id or new_launch_id(namespace)
    argv = [*profile.launch_argv(host.python, simulate=simulate), *extra_args]
    env = profile.env_dict()
    if simulate:
        env.update(profile.sim_env())
        if host.sim_pythonpath:
            env["PYTHONPATH"] = host.sim_pythonpath
    # SPT_NOENV stops setproctitle from overwriting /proc/PID/environ, which the env check reads.
    env.update({MARKER: launch_id, PROFILE: profile.name, "SPT_NOENV": "1"})
    log_path = f"{host.workdir}/logs/{launch_id.replace(':', '_')}.log"
    try:
        started = host.call("launch", argv=argv, env=env, log_path=log_path)
    except BaseException:
        # Whether it started is unknown (the connection dropped, or Ctrl-C arrived mid-call): the marker finds it
        # if it did, so tear down by marker before giving up.
        with shielded(QUIET), contextlib.suppress(HostError):
            host.call("teardown", launch_id=launch_id, grace_s=2.0, port_wait_s=0)
        raise
    return Launch(
        launch_id=launch_id,
        profile=profile.name,
        pid=started["pid"],
        pgid=started["pgid"],
        port=profile.port,
        log_path=log_path,
        argv=tuple(redact_argv(argv, redaction_key)),
        env={k: redact(k, v, redaction_key) for k, v in env.items()},
        simulated=simulate,
        started_at=started["started_at"],
    )


LOG_TAIL_EVERY_S = 1.0  # while a server loads, its log's last line is read this often (when progress is shown)
# The agent polls next to the server (a refused connect or one probe request, and a /proc read): cheap there, and
# it bounds how late orch notices that the server is ready.
READY_POLL_S = 0.02
PROBE_TIMEOUT_S = 10.0
# What the readiness call reads beside the server, kept as RunningServer.prefetched for the fingerprint.
PREFETCHED = ("fingerprint", "server_info", "cpu_speed")


def wait_ready(
    host: Host,
    launch_: Launch,
    profile: Profile,
    *,
    timeout_s: float,
    poll_s: float = READY_POLL_S,
    events: Events = QUIET,
    then: dict[str, Any] | None = None,
    extras: dict[str, Any] | None = None,
) -> float:
    """Wait until the engine's readiness probe (a real 1-token generation where the engine has one) succeeds, in one
    host call: the agent polls the port, the probe and the process next to the server and answers ready, exited
    (with the log tail) or timed out. Meanwhile its progress events feed the live view."""
    engine = engines.get(profile.engine)
    probe = engine.ready_probe(profile)
    secrets = profile_secrets(profile)
    t0 = time.monotonic()
    events.phase("loading", profile=profile.name, state="loading", log="")

    def heard(event: dict[str, Any]) -> None:
        state = str(event.get("state", "loading"))
        if event.get("changed"):
            shown = visible(scrub(state, secrets))  # it may quote the server's error message
            events.line(f"{profile.name}: port {launch_.port} answers; {probe.label} says {shown}")
        # For the live view only: what a 30-minute model load is doing (the server's args, keys included, are in
        # that log: scrubbed).
        log = progress.log_line(scrub(str(event.get("log") or ""), secrets))
        events.phase("loading", profile=profile.name, state=state, log=log)

    result = host.call(
        "wait_ready",
        pid=launch_.pid,
        port=launch_.port,
        address=connect_address(profile.host),
        probe=probe.to_dict(),
        log_path=launch_.log_path,
        timeout_s=timeout_s,
        poll_s=poll_s,
        log_every_s=LOG_TAIL_EVERY_S if events.watched else 0.0,
        probe_timeout_s=PROBE_TIMEOUT_S,
        on_progress=heard,
        call_timeout=timeout_s + PROBE_TIMEOUT_S + 60,
        **({"then": then} if then else {}),
    )
    if result["ready"]:
        if extras is not None:  # what `then` asked for, done by the agent in the same call
            extras.update({k: result[k] for k in ("launch_state", *PREFETCHED) if k in result})
        # The CPU probe ran after the server was ready: its half second is not the server's.
        return time.monotonic() - t0 - float(result.get("cpu_speed_s") or 0.0)
    # The server's own startup dump (`server_args=ServerArgs(... api_key='…')`) is in its log: scrub. Its lines stay
    # lines; anything else a terminal would obey (colour, a title, a carriage return over the line) is shown.
    tail = visible(scrub(str(result.get("log_tail", "")), secrets), lines=True)
    if result.get("why") == "port_taken":
        owner = result.get("owner") or {}
        raise ServerError(
            f"{profile.name}: port {launch_.port} was taken by PID {owner.get('pid')} "
            f"({scrub(str(owner.get('cmdline', '?')), secrets)}) while the server started, so the answers on it are "
            f"not this server's; orch did not touch that process. Wait for it to finish, or {OTHER_PORT}. "
            f"Last lines of {launch_.log_path}:\n{tail}"
        )
    if result.get("why") == "exited":
        raise ServerError(
            f"{profile.name}: server process {launch_.pid} exited during startup "
            f"after {time.monotonic() - t0:.1f}s. Last lines of {launch_.log_path}:\n{tail}"
        )
    state = visible(scrub(str(result.get("state")), secrets))
    raise ServerError(
        f"{profile.name}: not ready after {timeout_s:.0f}s (still {state}). Last lines of {launch_.log_path}:\n{tail}"
    )


def health_problem(base_url: str, profile: Profile, *, timeout_s: float) -> str | None:
    """None if the engine's health check (a 1-token generation where that is as cheap as its health endpoint)
    answers 200 within timeout_s, else what it did instead."""
    import httpx  # only attached servers and a failed run's check send HTTP from here

    probe = engines.get(profile.engine).health_probe(profile)
    path = probe.label
    try:
        resp = httpx.request(
            probe.method,
            base_url + probe.path,
            json=dict(probe.body) if probe.body is not None else None,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 2.0)),
        )
    except httpx.TimeoutException:
        return f"the server is not healthy: {path} gave no answer within {timeout_s:.0f}s"
    except httpx.TransportError as e:
        return f"the server is not healthy: {path} unreachable ({type(e).__name__})"
    if resp.status_code != 200:
        return f"the server is not healthy: {path} answered HTTP {resp.status_code}"
    return None


def verify_env(host: Host, launch_: Launch, profile: Profile, *, redaction_key: bytes | None = None) -> EnvReport:
    """Read every process's environment back and compare with the profile (secrets as keyed digests)."""
    return read_back(host, launch_, profile, redaction_key=redaction_key)[0]


def read_back(
    host: Host, launch_: Launch, profile: Profile, *, redaction_key: bytes | None = None
) -> tuple[EnvReport, list[dict[str, Any]]]:
    """One host round trip once ready: the env check (verify_env) and every process of the launch (PID and start
    time), recorded for liveness checks during runs and for teardown."""
    args, expected = state_args(launch_, profile, redaction_key)
    return from_state(host.call("launch_state", **args), expected, launch_, profile, args["digest_key"])


def state_args(launch_: Launch, profile: Profile, redaction_key: bytes | None) -> tuple[dict[str, Any], dict[str, str]]:
    """launch_state's arguments and the env the profile expects, secrets as digests under the same key."""
    # The host digests with the same key, so equal values compare equal without leaving the host in clear.
    key = redaction_key or os.urandom(32)
    expected = {k: redact(k, v, key) for k, v in profile.env_dict().items()}
    args = {
        "launch_id": launch_.launch_id,
        "pid": launch_.pid,
        "keys": sorted(expected),
        "digest_key": key.hex(),
        "prefixes": list(engines.get(profile.engine).env_prefixes),
    }
    return args, expected


def from_state(
    state: dict[str, Any], expected: dict[str, str], launch_: Launch, profile: Profile, digest_key: str
) -> tuple[EnvReport, list[dict[str, Any]]]:
    """The env check and the launch's processes from launch_state's answer. The host's agent digests secret names and
    URL userinfo itself (stdlib); secret-looking parts under other names (config/secretpatterns) are digested here,
    with the same key, before anything is compared, shown or stored."""
    key = bytes.fromhex(digest_key)
    environ = [
        {**proc, "env": remask(proc["env"], key), "other_env": remask(proc["other_env"], key)}
        for proc in state["environ"]
    ]
    return _env_report(environ, expected, launch_, profile), state["procs"]


def _env_report(procs: list[dict[str, Any]], expected: dict[str, str], launch_: Launch, profile: Profile) -> EnvReport:
    engine = engines.get(profile.engine)
    if not procs:
        raise ServerError(f"{profile.name}: no process carrying launch marker {launch_.launch_id} was found")
    mismatches = []
    for proc in procs:
        for var, want in expected.items():
            got = proc["env"].get(var)
            if got != want:
                mismatches.append(
                    EnvMismatch(
                        pid=proc["pid"],
                        cmdline=proc["cmdline"],
                        var=var,
                        expected=want,
                        actual=got,
                        note=engine.env_overrides.get(var, ""),
                    )
                )
    # What the launching environment leaked into the server without the profile saying so.
    main = next((p for p in procs if p["pid"] == launch_.pid), procs[0])
    inherited = {k: v for k, v in main["other_env"].items() if k not in expected}
    return EnvReport(processes=len(procs), mismatches=tuple(mismatches), inherited=inherited)


def teardown(
    host: Host,
    launch_: Launch,
    *,
    grace_s: float = 10.0,
    port_wait_s: float = 60.0,
    known: list[dict[str, Any]] | None = None,
    gpu_wait_s: float | None = None,
    profile: str = "",
    events: Events = QUIET,
) -> dict[str, Any]:
    """Stop the launch (see agent/ops.op_teardown); with gpu_wait_s, the agent then waits (bounded) for the GPUs'
    memory to be back to idle, in the same round trip (`gpus_after`)."""
    args: dict[str, Any] = {}
    if known:
        args["known"] = known
    if gpu_wait_s is not None:
        cfg = host.config
        args.update(gpu_wait_s=gpu_wait_s, nvidia_smi=cfg.nvidia_smi, gpu_idle_mib=cfg.gpu_idle_mib)

    def waiting(event: dict[str, Any]) -> None:
        if event.get("step") == "gpu wait":
            events.phase("gpu wait", profile=profile, timeout_s=gpu_wait_s)

    report: dict[str, Any] = host.call(
        "teardown",
        launch_id=launch_.launch_id,
        pgid=launch_.pgid,
        port=launch_.port,
        grace_s=grace_s,
        port_wait_s=port_wait_s,
        on_progress=waiting,
        **args,
    )
    return report


HEALTH_TIMEOUT_S = 5.0


@dataclass(kw_only=True)
class RunningServer:
    """A ready server orch launched, everything recorded on the way, and how it is measured; teardown fills in at
    the end."""

    launch: Launch
    base_url: str
    preflight: dict[str, Any]
    ready_s: float = 0.0
    env_report: EnvReport | None = None
    teardown: dict[str, Any] | None = None
    # Every process of the launch once it was ready (PID, start time): for liveness checks during runs and for a
    # teardown that also finds members which dropped the marker.
    processes: list[dict[str, Any]] = field(default_factory=list)
    # Read by the agent while waiting for readiness (fingerprint.collect uses them instead of asking again):
    # "fingerprint" ({"value": op_fingerprint's answer} or {"error": …}), "server_info" (GET the engine's info
    # paths) and "cpu_speed" (agent/cpu, for a real engine).
    prefetched: dict[str, Any] = field(default_factory=dict)
    probes_gpus: ClassVar[bool] = True  # its host's GPUs are its own: the runs read them

    @property
    def launch_id(self) -> str:
        return self.launch.launch_id

    @property
    def record(self) -> LaunchRecord:
        la = self.launch
        return LaunchRecord(launch_id=la.launch_id, started_at=la.started_at, argv=la.argv, env=la.env, pid=la.pid)

    @property
    def env_ok(self) -> bool | None:
        return None if self.env_report is None else self.env_report.ok

    def env_record(self) -> dict[str, Any]:
        assert self.env_report is not None
        return self.env_report.to_dict()

    def fingerprint(
        self, host: Host, profile: Profile, *, workload_digest: str, redaction_key: bytes | None
    ) -> dict[str, Any]:
        return fingerprint.collect(
            host, self, profile, workload_digest=workload_digest, redaction_key=redaction_key, orch_version=__version__
        )

    def notes(self, profile: Profile, fp: dict[str, Any]) -> list[str]:
        """What is said of the server once it is fingerprinted: its env check."""
        assert self.env_report is not None
        return describe_env(self.env_report)

    def runner(self, host: Host, profile: Profile, bench: BenchConfig) -> Runner:
        engine = engines.get(profile.engine)
        address = connect_address(profile.host)
        return runner_for(host, address, self.launch.port, self.base_url, bench, engine, watch=self.processes)

    def recover(self, host: Host, profile: Profile, events: Events, err: str) -> bool:
        """After failed requests: whether the run may be repeated (the connection and the server are whole)."""
        events.line(f"{profile.name}: {err}")
        host.ensure_connected()
        problem = server_problem(host, self, profile)
        if problem is not None:
            tail = self.failure_tail(host, 20)
            events.line(f"{profile.name}: {problem}; not repeating the run. Last lines of its log:\n{tail}")
            return False
        return True

    def failure_tail(self, host: Host, lines: int = 20) -> str:
        """The server's last log lines, to show why it failed (a multi-node launch: those of the ranks that died)."""
        return visible(str(host.call("log_tail", path=self.launch.log_path, lines=lines)), lines=True)

    def problem(self, host: Host) -> str | None:
        """Why the launch is no longer healthy, or None: a recorded process exited."""
        if not self.processes:
            return None
        state: dict[str, Any] = host.call("launch_health", procs=self.processes)
        return None if state["ok"] else str(state["problem"])


def server_problem(host: Host, srv: RunningServer, profile: Profile) -> str | None:
    """Why a server that failed requests should not be used again, or None if it is whole and answers its health
    check. A run is only ever repeated against a healthy server: repeating it against a hung one only waits again."""
    # A crashing server closes its port a moment before its processes are gone: give it that moment, so a crash is
    # reported as one, not retried as if the network had dropped.
    for _ in range(15):
        problem = srv.problem(host)
        if problem is None and not host.call("alive", pid=srv.launch.pid)["alive"]:
            problem = f"the server process {srv.launch.pid} exited"
        if problem is not None:
            return problem
        time.sleep(0.2)
    return health_problem(srv.base_url, profile, timeout_s=HEALTH_TIMEOUT_S)


def describe_env(report: EnvReport) -> list[str]:
    """Human lines for an env check: one per differing variable, grouping the processes it differs in."""
    if report.ok:
        where = "the server's one process" if report.processes == 1 else f"all {report.processes} processes"
        lines = [f"env check ok: every profile variable reached {where}"]
    else:
        groups: dict[tuple[str, str, str | None, str], list[int]] = {}
        for m in report.mismatches:
            groups.setdefault((m.var, m.expected, m.actual, m.note), []).append(m.pid)
        noun = "process" if report.processes == 1 else "processes"
        lines = [f"ENV MISMATCH in {len({m.pid for m in report.mismatches})} of {report.processes} {noun}:"]
        for (var, want, got, note), pids in sorted(groups.items()):
            actual = "missing" if got is None else f"={got}"
            pid_list = ", ".join(str(p) for p in pids)
            lines.append(
                f"  {var}: profile says {want!r}, PID {pid_list} has {actual}" + (f" ({note})" if note else "")
            )
    if report.inherited:
        inherited = ", ".join(f"{k}={v}" for k, v in sorted(report.inherited.items()))
        lines.append(f"note: inherited from the launching environment, not set by the profile: {inherited}")
    return lines


def shielded(events: Events) -> contextlib.AbstractContextManager[None]:
    """Let a teardown finish even if the user presses Ctrl-C again (or cron sends SIGTERM, or the terminal hangs up)
    while it runs, or a flood of them comes (stopsignals.deferred); a first one heard during it stops orch once the
    teardown is done."""
    return stopsignals.deferred(lambda: events.line("teardown in progress; orch exits as soon as the server is gone"))


def allocation_ended_line(e: AllocationEnded) -> str:
    """What a teardown says when Slurm had ended the allocation under the server (a group says it per rank)."""
    return f"teardown: nothing left to stop — Slurm ended allocation {e.job_id} ({e.state}) and every process in it"


def _owners(td: dict[str, Any]) -> str:
    owners = td.get("port_owner") or []
    if not owners:
        return ""
    o = owners[0]
    return (
        f", held by PID {o.get('pid')} ({o.get('cmdline')}) which carries no marker of this launch and was not "
        "recorded as one of its processes: it escaped orch's tracking, and orch will not kill it"
    )


def teardown_line(profile: Profile, td: dict[str, Any]) -> str:
    left = td.get("remaining") or []
    gpus = td.get("gpus_after") or {}
    return (
        f"{profile.name}: torn down in {td['seconds']:.1f}s"
        + (f" (SIGKILL needed for {len(td['sigkill'])})" if td.get("sigkill") else "")
        + (f" (killed {len(td['escaped'])} escaped from its process group)" if td.get("escaped") else "")
        + (f" ({len(td['unmarked'])} had dropped the launch marker)" if td.get("unmarked") else "")
        + ("" if td.get("port_free", True) else f"; port {profile.port} still busy{_owners(td)}")
        + (f"; {len(left)} process(es) would not die" if left else "")
        + (f"; GPU memory idle after {gpus['waited_s']}s" if gpus.get("idle") else "")
        + (f"; GPUs NOT idle: {'; '.join(gpus['problems'])}" if gpus.get("idle") is False else "")
    )

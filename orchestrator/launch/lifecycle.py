"""The one launch lifecycle: a server for an arm prepared, started, ready, read back, and stopped in `finally`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from orchestrator import engines
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import Profile
from orchestrator.config.workload import BenchConfig
from orchestrator.errors import AllocationEnded, HostError, OrchError
from orchestrator.hosts.base import Host, connect_address
from orchestrator.hosts.group import GroupHost
from orchestrator.launch import attach, fingerprint, group, single
from orchestrator.launch.benchmark import Runner
from orchestrator.ui.events import QUIET, Events


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How every launch of an experiment is made and stopped."""

    namespace: str
    simulate: bool = False
    ready_timeout_s: float | None = None  # None: the profile's own
    grace_s: float = 10.0
    gpu_wait_s: float = 120.0
    force: bool = False  # kill a foreign port owner where the host's policy allows it
    redaction_key: bytes | None = None  # the store's key for the digests of secret values (None: a random one)

    def ready_timeout(self, profile: Profile) -> float:
        return self.ready_timeout_s if self.ready_timeout_s is not None else profile.ready_timeout_s


def settings(config: ABConfig, redaction_key: bytes | None = None) -> Settings:
    """The launch part of an experiment's config."""
    return Settings(
        namespace=config.namespace,
        simulate=config.simulate,
        ready_timeout_s=config.ready_timeout_s,
        grace_s=config.grace_s,
        gpu_wait_s=config.gpu_wait_s,
        force=config.force,
        redaction_key=redaction_key,
    )


class Server(Protocol):
    """What an arm is measured on, whatever its kind: single.RunningServer (group.GroupServer) or
    attach.AttachedServer. Where the kinds differ in what is recorded or said, the server says it."""

    base_url: str

    @property
    def launch_id(self) -> str: ...

    @property
    def record(self) -> single.LaunchRecord: ...

    @property
    def ready_s(self) -> float | None:
        """Seconds until it answered (None: orch did not start it)."""

    @property
    def preflight(self) -> dict[str, Any]: ...

    @property
    def env_ok(self) -> bool | None:
        """Whether every process holds the profile's environment (None: not read back)."""

    @property
    def teardown(self) -> dict[str, Any] | None:
        """How it was stopped, once it was (None: nothing to record)."""

    @property
    def probes_gpus(self) -> bool:
        """Whether the GPUs its host reads are its own (the runs read them; the launch stores them)."""

    def env_record(self) -> dict[str, Any]: ...

    def fingerprint(
        self, host: Host, profile: Profile, *, workload_digest: str, redaction_key: bytes | None
    ) -> dict[str, Any]: ...

    def notes(self, profile: Profile, fp: dict[str, Any]) -> list[str]:
        """Lines said once it is fingerprinted (its env check; an attached server's other model)."""

    def runner(self, host: Host, profile: Profile, bench: BenchConfig) -> Runner: ...

    def recover(self, host: Host, profile: Profile, events: Events, err: str) -> bool:
        """After failed requests, whether the run may be repeated on it."""


def _ignore(_: Server) -> None:
    pass


@contextlib.contextmanager
def running(
    host: Host,
    profile: Profile,
    settings: Settings,
    events: Events = QUIET,
    *,
    on_launch: Callable[[Server], None] = _ignore,
    on_teardown: Callable[[Server], None] = _ignore,
) -> Iterator[Server]:
    """A ready server for the profile, however it comes: launched fresh on the host (one node, or profile.nnodes
    nodes of a group) with its environment read back, or attached to (a health check). Whatever was started is
    stopped however the block exits, shielded from a second Ctrl-C: a launch torn down (a failed teardown raises
    only if the block did not), an attached server left running.

    on_launch: once it is started (the launch to record); on_teardown: once it is stopped, if there is a teardown
    to record (an attached server's: only after a block that did not raise)."""
    steps = _steps(host, profile, settings, events)

    def phase(name: str) -> None:
        if steps.launches:  # an attached server is neither cleaned up, launched, read back nor torn down
            events.phase(name, profile=profile.name)

    phase("cleanup")
    steps.prepare()
    phase("launch")
    failed = True
    try:
        srv = steps.start(on_launch)
        steps.wait_ready()
        phase("env check")
        steps.read_back()
        yield srv
        failed = False
    finally:
        started = steps.server
        if started is not None:
            with single.shielded(events):
                phase("teardown")
                error = steps.stop(failed)
                if started.teardown is not None:
                    on_teardown(started)
                if error is not None and not failed:
                    raise error


class _Steps(Protocol):
    launches: bool

    @property
    def server(self) -> Server | None:
        """The server once started, partly or wholly (what `stop` stops)."""

    def prepare(self) -> None: ...
    def start(self, on_launch: Callable[[Server], None]) -> Server: ...
    def wait_ready(self) -> None: ...
    def read_back(self) -> None: ...
    def stop(self, failed: bool) -> OrchError | None:
        """Stop what was started; the error a teardown failed with (raised by `running` if the block did not)."""


def _steps(host: Host, profile: Profile, settings: Settings, events: Events) -> _Steps:
    url = attach.url_of(profile)
    if url is not None:
        return _Attached(host, profile, settings, events, url)
    if isinstance(host, GroupHost) and profile.nnodes > 1:
        return _Group(host, profile, settings, events)
    return _Single(host, profile, settings, events)


class _Single:
    """One process tree on one host."""

    launches = True

    def __init__(self, host: Host, profile: Profile, settings: Settings, events: Events) -> None:
        self.host, self.profile, self.settings, self.events = host, profile, settings, events
        self.pre: dict[str, Any] = {}
        self.srv: single.RunningServer | None = None
        # The agent answers the wait with the env read-back and the fingerprint's host part, so a ready server is
        # benchmarked without more round trips (and the package probe ran while the server loaded).
        self.extras: dict[str, Any] = {}
        self.state_args: dict[str, Any] = {}
        self.expected: dict[str, str] = {}  # the env, secrets as digests under the key in state_args

    @property
    def server(self) -> Server | None:
        return self.srv

    def prepare(self) -> None:
        self.pre = single.preflight(
            self.host, self.profile, self.settings.namespace, self.events, force=self.settings.force
        )

    def start(self, on_launch: Callable[[Server], None]) -> Server:
        host, profile, s = self.host, self.profile, self.settings
        launched = single.launch(
            host, profile, simulate=s.simulate, namespace=s.namespace, redaction_key=s.redaction_key
        )
        self.events.line(f"{profile.name}: launched PID {launched.pid} ({launched.launch_id}), log {launched.log_path}")
        # Held and recorded before the URL is asked for: an SSH or Slurm tunnel that fails to open must still leave
        # a launch for `running` to stop (left running, it would make the next arm's preflight refuse the port).
        self.srv = srv = single.RunningServer(launch=launched, base_url="", preflight=self.pre)
        on_launch(srv)
        srv.base_url = host.url(profile.port, connect_address(profile.host))
        return srv

    def wait_ready(self) -> None:
        srv, host, profile = self._srv(), self.host, self.profile
        self.state_args, self.expected = single.state_args(srv.launch, profile, self.settings.redaction_key)
        probe = fingerprint.host_probe(host, srv.launch, profile)
        info_paths = list(engines.get(profile.engine).info_paths_of(srv.launch.simulated))
        then: dict[str, Any] = {"launch_state": self.state_args, "fingerprint": probe, "server_info": info_paths}
        if not srv.launch.simulated:
            then["cpu_speed"] = True  # the simulator's speed is its model's, not this CPU's
        timeout = self.settings.ready_timeout(profile)
        srv.ready_s = single.wait_ready(
            host, srv.launch, profile, timeout_s=timeout, events=self.events, then=then, extras=self.extras
        )
        self.events.line(f"{profile.name}: ready after {srv.ready_s:.1f}s")

    def read_back(self) -> None:
        srv, extras = self._srv(), self.extras
        state = extras.get("launch_state") or self.host.call("launch_state", **self.state_args)
        srv.env_report, srv.processes = single.from_state(
            state, self.expected, srv.launch, self.profile, self.state_args["digest_key"]
        )
        srv.prefetched = {k: extras[k] for k in single.PREFETCHED if k in extras}

    def stop(self, failed: bool) -> OrchError | None:
        srv, profile, s = self._srv(), self.profile, self.settings
        try:
            srv.teardown = single.teardown(
                self.host, srv.launch, grace_s=s.grace_s, known=srv.processes, gpu_wait_s=s.gpu_wait_s,
                profile=profile.name, events=self.events,
            )  # fmt: skip
        except AllocationEnded as e:
            # Not a failed teardown: Slurm already ended every process. The error itself is said once, at the end.
            srv.teardown = {"error": str(e), "allocation_ended": e.state}
            self.events.line(f"{profile.name}: {single.allocation_ended_line(e)}")
            return e
        except HostError as e:
            srv.teardown = {"error": str(e)}
            self.events.line(f"{profile.name}: TEARDOWN FAILED: {e}")
            return e
        self.events.line(single.teardown_line(profile, srv.teardown))
        return None

    def _srv(self) -> single.RunningServer:
        assert self.srv is not None
        return self.srv


class _Group:
    """profile.nnodes nodes of a group: every node made fresh first, then rank 0..N-1 launched with the engine's node
    flags; ready when rank 0 serves and every rank is up; env verified and torn down on every node."""

    launches = True

    def __init__(self, host: GroupHost, profile: Profile, settings: Settings, events: Events) -> None:
        n = profile.nnodes
        if len(host.nodes) < n:
            raise OrchError(f"{profile.name} has nnodes: {n} but group {host.name} has {len(host.nodes)} hosts")
        self.host, self.profile, self.settings, self.events = host, profile, settings, events
        stride = host.group.port_stride
        self.ranks = [
            group.Rank(index=i, host=host.nodes[i], profile=replace(profile, port=profile.port + i * stride))
            for i in range(n)
        ]
        self.srv: group.GroupServer | None = None
        self.init = self.base_id = ""

    @property
    def server(self) -> Server | None:
        return self.srv

    def prepare(self) -> None:
        # Every node before any launch: on nodes that share a machine, a fresh launch would otherwise look like a
        # live session's leftover to the next node's cleanup.
        s = self.settings
        for rank in self.ranks:
            rank.preflight = single.preflight(rank.host, rank.profile, s.namespace, self.events, force=s.force)
        port = group.free_port(self.ranks[0].host, {r.profile.port for r in self.ranks})
        self.init = f"{group.init_address(self.host)}:{port}"
        self.base_id = single.new_launch_id(s.namespace)

    def start(self, on_launch: Callable[[Server], None]) -> Server:
        profile, s, ranks = self.profile, self.settings, self.ranks
        engine = engines.get(profile.engine)
        for rank in ranks:
            rank.launch = single.launch(
                rank.host,
                rank.profile,
                simulate=s.simulate,
                namespace=s.namespace,
                redaction_key=s.redaction_key,
                extra_args=engine.node_flags(len(ranks), rank.index, self.init),
                launch_id=self.base_id if rank.index == 0 else f"{self.base_id}-rank{rank.index}",
            )
            self.events.line(
                f"{profile.name}: {rank.label} launched PID {rank.launch.pid} ({rank.launch.launch_id}), "
                f"log {rank.launch.log_path}"
            )
            if rank.index == 0:  # held before anything else can fail, as in _Single.start
                self.srv = group.GroupServer(launch=rank.launch, base_url="", preflight=rank.preflight, ranks=ranks)
                on_launch(self.srv)
        srv = self._srv()
        srv.base_url = self.host.url(profile.port, connect_address(profile.host))
        srv.preflight = {**ranks[0].preflight, "nodes": [{**r.to_dict(), "preflight": r.preflight} for r in ranks]}
        self.events.line(f"{profile.name}: {len(ranks)} nodes rendezvous at {self.init}")
        return srv

    def wait_ready(self) -> None:
        srv, profile = self._srv(), self.profile
        timeout = self.settings.ready_timeout(profile)
        srv.ready_s = group.wait_group_ready(srv, profile, timeout_s=timeout, events=self.events)
        self.events.line(f"{profile.name}: ready after {srv.ready_s:.1f}s (every node)")

    def read_back(self) -> None:
        reports = []
        for rank in self.ranks:
            assert rank.launch is not None
            key = self.settings.redaction_key
            report, rank.processes = single.read_back(rank.host, rank.launch, rank.profile, redaction_key=key)
            reports.append((rank, report))
        srv = self._srv()
        srv.env_report = group.merged_env_report(reports)
        srv.processes = self.ranks[0].processes

    def stop(self, failed: bool) -> OrchError | None:
        ranks, s = self.ranks, self.settings
        ended = group.teardown_all(ranks, self.profile, grace_s=s.grace_s, gpu_wait_s=s.gpu_wait_s, events=self.events)
        self._srv().teardown = {
            **(ranks[0].teardown or {}),
            "nodes": [{**r.to_dict(), "teardown": r.teardown} for r in ranks],
        }
        if ended is not None:
            return ended  # said once (every node of one allocation ended with it), with its own hint
        errors = [r for r in ranks if "error" in (r.teardown or {})]
        if errors:
            return HostError("; ".join(f"{r.label}: {(r.teardown or {})['error']}" for r in errors))
        return None

    def _srv(self) -> group.GroupServer:
        assert self.srv is not None
        return self.srv


class _Attached:
    """A server someone else runs: its health check is its readiness; nothing is launched, read back or stopped."""

    launches = False

    def __init__(self, host: Host, profile: Profile, settings: Settings, events: Events, url: str) -> None:
        self.host, self.profile, self.settings, self.events, self.url = host, profile, settings, events, url
        self.address, self.port, self.base_url = attach.reach(host, url)
        self.srv: attach.AttachedServer | None = None

    @property
    def server(self) -> Server | None:
        return self.srv

    def prepare(self) -> None:
        attach.check_health(self.base_url, self.url, self.profile)

    def start(self, on_launch: Callable[[Server], None]) -> Server:
        self.events.line(
            f"{self.profile.name}: attached to {self.url}: orch did not launch it and will not stop it; this block is "
            "another benchmark session on the same running server (state NOT fresh, environment NOT verified)"
        )
        record = single.LaunchRecord(launch_id=single.new_launch_id(self.settings.namespace), started_at=time.time())
        self.srv = srv = attach.AttachedServer(
            url=self.url, address=self.address, port=self.port, base_url=self.base_url, record=record
        )
        on_launch(srv)
        return srv

    def wait_ready(self) -> None:
        pass  # its health check, before it was recorded

    def read_back(self) -> None:
        pass

    def stop(self, failed: bool) -> OrchError | None:
        if not failed:  # a session cut short leaves its teardown unrecorded, as it leaves the server
            self._srv().teardown = self._srv().not_torn_down()
        return None

    def _srv(self) -> attach.AttachedServer:
        assert self.srv is not None
        return self.srv

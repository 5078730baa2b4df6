"""Multi-node launches: one arm's server spread over an inventory group's hosts, node rank i on the group's i-th."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from orchestrator import engines
from orchestrator.common.printable import visible
from orchestrator.config.profile import Profile
from orchestrator.config.secretpatterns import scrub
from orchestrator.errors import AllocationEnded, HostError, InputError, OrchError, ServerError
from orchestrator.hosts.base import Host, connect_address
from orchestrator.hosts.group import GroupHost
from orchestrator.launch import fingerprint, single
from orchestrator.ui.events import Events

# How long one readiness call on node rank 0 may wait before orch looks at the other ranks again: a rank that dies
# while rank 0 waits for it to join is seen within this.
READY_SLICE_S = 0.5
LOG_LINES = 20


class NodeMismatchError(OrchError):
    """The nodes of a group differ in something that must be equal on every node of one server."""


def node_facts(
    group: GroupHost, packages: Sequence[str], *, allow_mismatch: bool = False
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every node's host facts (with the versions of `packages`: engines.fact_packages), and how the nodes differ
    (GPU model, driver, engine package versions: one line per field). Nodes that differ are refused
    (NodeMismatchError, exit 1) before anything is launched, unless allow_mismatch (--allow-node-mismatch; `orch
    hosts check` only reports them)."""
    facts = {
        node.name: node.call("facts", nvidia_smi=node.config.nvidia_smi, packages=list(packages))
        for node in group.nodes
    }
    problems = fingerprint.node_mismatches(facts)
    if problems and not allow_mismatch:
        # The remedy first: a nightly summary shows an error's first 300 characters, and the fields can be long.
        fields = ", ".join(p.partition(":")[0] for p in problems)
        raise NodeMismatchError(
            f"the nodes of {group.name} differ ({fields}); add --allow-node-mismatch (nightly: "
            "`allow_node_mismatch: true` on the item) to launch anyway, and the experiment records the mismatch and "
            "its reports show it. orch launched nothing: one server spread over these nodes would not be what the "
            "profile describes. How they differ: " + "; ".join(problems)
        )
    return facts, problems


def check_ports(group: GroupHost, facts: dict[str, dict[str, Any]], nnodes: int) -> None:
    """Node ranks on nodes that are one machine (same hostname and boot) need a port_stride, or every rank
    would bind the profile's port there: refused (exit 2) before anything launches, naming where to set it."""
    problem = port_clash(group, facts, nnodes)
    if problem:
        raise InputError(problem)


def port_clash(group: GroupHost, facts: dict[str, dict[str, Any]], nnodes: int) -> str | None:
    """Why check_ports refuses the first `nnodes` nodes of the group (`orch hosts check` reports it), or None."""
    if group.group.port_stride or nnodes < 2:
        return None
    seen: dict[tuple[Any, Any], str] = {}
    for node in group.nodes[:nnodes]:
        f = facts.get(node.name) or {}
        # The boot by the kernel's boot_id where the agent reads one: boot_time moves with a wall-clock step, and one
        # machine read twice across a step would pass for two.
        machine = (f.get("hostname"), f.get("boot_id") or f.get("boot_time"))
        if machine[0] is None:
            continue
        if machine not in seen:
            seen[machine] = node.name
            continue
        config = node.config
        if config.capabilities.allocates_nodes and not config.source:
            where = (
                f"--host {config.kind}:PARTITION has no inventory entry: write one with `scheduler: {config.kind}`, "
                "the partition and"
            )
        elif config.capabilities.allocates_nodes:
            where = f"in {config.source}, give the {config.capabilities.allocator} entry {config.name}"
        else:
            where = f"in {group.group.source or 'the inventory'}, give the group {group.name}"
        return (
            f"{seen[machine]} and {node.name} of {group.name} are one machine ({machine[0]}), so their node ranks "
            f"would both serve on the profile's port there; {where} `port_stride: 1` (node rank i then serves on "
            "port + i)"
        )
    return None


@dataclass(kw_only=True)
class Rank:
    """One node's part of the launch."""

    index: int
    host: Host
    profile: Profile  # this node's port
    preflight: dict[str, Any] = field(default_factory=dict)
    launch: single.Launch | None = None
    processes: list[dict[str, Any]] = field(default_factory=list)
    teardown: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return f"node rank {self.index} ({self.host.name})"

    def to_dict(self) -> dict[str, Any]:
        launch = self.launch
        return {
            "rank": self.index,
            "host": self.host.name,
            "port": self.profile.port,
            "launch_id": launch.launch_id if launch else None,
            "pid": launch.pid if launch else None,
            "log_path": launch.log_path if launch else None,
            "argv": list(launch.argv) if launch else None,
        }


@dataclass
class GroupServer(single.RunningServer):
    """Node rank 0's server (the API, benchmarked) and every rank, for health checks, log tails and teardown."""

    ranks: list[Rank] = field(default_factory=list)

    def dead_ranks(self) -> list[tuple[Rank, str]]:
        """Ranks with a process gone (ranks >= 1 first: rank 0 going down is usually the echo of another's death)."""
        out = []
        for rank in [*self.ranks[1:], *self.ranks[:1]]:
            if rank.launch is None:
                continue
            if rank.processes:
                state = rank.host.call("launch_health", procs=rank.processes)
                if not state["ok"]:
                    out.append((rank, str(state["problem"])))
            elif not rank.host.call("alive", pid=rank.launch.pid)["alive"]:
                out.append((rank, f"process {rank.launch.pid} exited"))
        return out

    def problem(self, host: Host) -> str | None:
        dead = self.dead_ranks()
        return "; ".join(f"{rank.label}: {why}" for rank, why in dead) or None

    def failure_tail(self, host: Host, lines: int = LOG_LINES) -> str:
        dead = [rank for rank, _ in self.dead_ranks()] or self.ranks[:1]
        return _tails(dead, lines)


def _tails(ranks: list[Rank], lines: int) -> str:
    parts = []
    for rank in ranks:
        assert rank.launch is not None
        tail = visible(str(rank.host.call("log_tail", path=rank.launch.log_path, lines=lines)), lines=True)
        parts.append(f"--- {rank.label}, {rank.launch.log_path}:\n{tail}".rstrip())
    return "\n".join(parts)


def init_address(group: GroupHost) -> str:
    """Where the other nodes reach node rank 0: the group's init_address, else rank 0's address as orch reaches it."""
    if group.group.init_address:
        return group.group.init_address
    return group.nodes[0].reach_address or "127.0.0.1"


def free_port(host: Host, avoid: set[int], tries: int = 20) -> int:
    """A port nothing listens on at `host` (for the distributed init: rank 0 listens there)."""
    draw = random.SystemRandom()
    for _ in range(tries):
        # Below Linux's ephemeral range (32768-60999): an outgoing connection's local port is not a listener, so
        # port_owner cannot see it, yet it would make rank 0's bind fail.
        port = draw.randrange(20000, 32768)
        if port not in avoid and not host.call("port_owner", port=port):
            return port
    raise HostError(f"{host.name}: found no free port for the distributed init address in {tries} tries")


def _poll(rank: Rank, probe: dict[str, Any], profile: Profile, slice_s: float) -> str:
    """One readiness call on a rank's host: ready, exited, or waiting (after up to slice_s)."""
    launch = rank.launch
    assert launch is not None
    result = rank.host.call(
        "wait_ready",
        pid=launch.pid,
        port=rank.profile.port,
        address=connect_address(profile.host),
        probe=probe,
        log_path=launch.log_path,
        timeout_s=slice_s,
        poll_s=single.READY_POLL_S,
        log_every_s=0.0,
        probe_timeout_s=single.PROBE_TIMEOUT_S,
        call_timeout=slice_s + single.PROBE_TIMEOUT_S + 60,
    )
    if result["ready"]:
        return "ready"
    return "exited" if result.get("why") == "exited" else "waiting"


def wait_group_ready(srv: GroupServer, profile: Profile, *, timeout_s: float, events: Events) -> float:
    """Until node rank 0 answers the engine's readiness probe and every other rank its own (SGLang: the dummy
    /health, up once every rank has joined); a rank that exits meanwhile fails the launch with its log tail."""
    engine = engines.get(profile.engine)
    probes = {0: engine.ready_probe(profile).to_dict(), 1: engine.rank_probe().to_dict()}
    secrets = single.profile_secrets(profile)
    pending = {rank.index for rank in srv.ranks}
    t0 = time.monotonic()
    events.phase("loading", profile=profile.name, state="loading", log="")
    while True:
        for rank in [*srv.ranks[1:], *srv.ranks[:1]]:
            if rank.index not in pending:
                continue
            left = timeout_s - (time.monotonic() - t0)
            slice_s = 0.0 if rank.index else max(0.0, min(READY_SLICE_S, left))
            state = _poll(rank, probes[min(rank.index, 1)], profile, slice_s)
            if state == "exited":
                dead = [r for r, _ in srv.dead_ranks()] or [rank]
                names = ", ".join(r.label for r in dead)
                raise ServerError(
                    f"{profile.name}: {names} exited during startup after {time.monotonic() - t0:.1f}s; every "
                    "node of the launch is torn down. Last lines of its log:\n" + scrub(_tails(dead, 30), secrets)
                )
            if state == "ready":
                pending.discard(rank.index)
                events.line(f"{profile.name}: {rank.label} ready")
        if not pending:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            missing = ", ".join(r.label for r in srv.ranks if r.index in pending)
            raise ServerError(
                f"{profile.name}: not ready after {timeout_s:.0f}s (still waiting for {missing}). Last lines of "
                f"node rank 0's log:\n" + scrub(_tails(srv.ranks[:1], 30), secrets)
            )


def merged_env_report(reports: list[tuple[Rank, single.EnvReport]]) -> single.EnvReport:
    """Every node's env check as one: a mismatch names its node."""
    mismatches = []
    for rank, report in reports:
        for m in report.mismatches:
            note = f"{m.note}; " if m.note else ""
            mismatches.append(dataclasses.replace(m, note=f"{note}on {rank.label}"))
    return single.EnvReport(
        processes=sum(r.processes for _, r in reports),
        mismatches=tuple(mismatches),
        inherited=reports[0][1].inherited if reports else {},
    )


def teardown_all(
    ranks: list[Rank], profile: Profile, *, grace_s: float, gpu_wait_s: float, events: Events
) -> AllocationEnded | None:
    """Every launched rank at once (each on its own host; nodes that share a machine each wait for the GPUs only
    once every rank there is gone); the AllocationEnded of a rank whose Slurm allocation had ended, if any."""
    launched = [r for r in ranks if r.launch is not None]
    ended: dict[str, AllocationEnded] = {}  # rank label: Slurm had ended its allocation

    def one(rank: Rank) -> None:
        assert rank.launch is not None
        try:
            rank.teardown = single.teardown(
                rank.host,
                rank.launch,
                grace_s=grace_s,
                known=rank.processes,
                gpu_wait_s=gpu_wait_s,
                profile=profile.name,
                events=events,
            )
        except AllocationEnded as e:
            rank.teardown = {"error": str(e), "allocation_ended": e.state}
            ended[rank.label] = e
        except HostError as e:
            rank.teardown = {"error": str(e)}

    if launched:
        with ThreadPoolExecutor(max_workers=len(launched)) as pool:
            list(pool.map(one, launched))
    for rank in launched:
        td = rank.teardown or {}
        if rank.label in ended:
            # Slurm ended every process of the job: not a failed teardown (the error is said once, at the end).
            events.line(f"{profile.name}: {rank.label}: {single.allocation_ended_line(ended[rank.label])}")
        elif "error" in td:
            events.line(f"{profile.name}: {rank.label}: TEARDOWN FAILED: {td['error']}")
        else:
            events.line(f"{rank.label}: " + single.teardown_line(rank.profile, td))
    return next(iter(ended.values()), None)

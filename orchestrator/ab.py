"""A/B experiments: every arm from a fresh, verified launch on the same host in the same session."""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import hashlib
import json
import os
import random
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from orchestrator import __version__, attach, engines, fingerprint, multinode, progress, server
from orchestrator.bench import (
    BenchConfig,
    RunResult,
    request_items,
    run_benchmark,
    runner_for,
)
from orchestrator.errors import BenchError, HostError, InputError, OrchError, ServerError, was_interrupted
from orchestrator.hosts.base import Host, connect_address
from orchestrator.hosts.group import GroupHost
from orchestrator.profile import Profile
from orchestrator.redaction import scrub
from orchestrator.results import (
    ABResult,
    Design,
    LaunchResult,
    arm_label,
    auto_look,
    has_valid_run,
    spec_steps,
    stored_launches,
    with_auto_notes,
)
from orchestrator.stats import (
    DEFAULT_MIN_EFFECT,
)
from orchestrator.stats_seq import SequentialPlan
from orchestrator.store import Store


class StrictEnvError(ServerError):
    """--strict-env and the workers did not get the profile's environment (a resume cannot fix that)."""


class NoValidRunsError(BenchError):
    """An arm has no valid timed run, so the experiment has nothing to compare."""


@dataclass(frozen=True)
class ABConfig:
    bench: BenchConfig = field(default_factory=BenchConfig)
    simulate: bool = False
    namespace: str = "default"
    ready_timeout_s: float | None = None
    grace_s: float = 10.0
    strict_env: bool = False
    force: bool = False  # kill a foreign port owner when the host's policy allows it
    lock_wait_s: float = 0.0  # how long to queue behind another orch session on the host
    gpu_wait_s: float = 120.0  # after teardown, how long GPU memory may take to return to idle
    target_tps: float | None = None  # for the speculative explanation: what would reaching this take
    blocks: int = 1  # each block launches every arm once
    auto: SequentialPlan | None = None  # --blocks auto: from auto.min_blocks, one more block per undecided look
    order: str = "random"  # random | fixed | abba
    order_seed: int | None = None  # None: drawn at random, then recorded with the experiment
    min_effect: float = DEFAULT_MIN_EFFECT  # the smallest relative difference worth calling
    allow_mixed: bool = False  # compare arms on servers orch did not launch (attached) with launched ones
    allow_node_mismatch: bool = False  # launch on a group whose nodes differ (recorded in the host facts)


# Names this orch process in the host lock, so after a silent network drop it can take its own lock back.
SESSION = uuid.uuid4().hex


def new_experiment_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def comparable_profile(profile: Profile, redaction_key: bytes | None = None) -> dict[str, Any]:
    """What must not change between the sessions of one resumed experiment (where the file lives may)."""
    d = profile.to_dict(redaction_key=redaction_key)
    for key in ("source", "description"):
        d.pop(key, None)
    return d


def requests_digest(bench: BenchConfig) -> str:
    """A fingerprint of every request the workload sends (an edited prompts file changes it)."""
    return hashlib.sha256(json.dumps(request_items(bench), sort_keys=True).encode()).hexdigest()


def experiment_config(
    profiles: Sequence[Profile],
    config: ABConfig,
    facts: dict[str, Any],
    provenance: dict[str, Any] | None = None,
    redaction_key: bytes | None = None,
) -> dict[str, Any]:
    """Everything a resume (and later `orch reproduce`) needs to run the same experiment again."""
    return {
        "bench": config.bench.to_dict(),
        "requests_sha256": requests_digest(config.bench),
        "host_facts": facts,
        "strict_env": config.strict_env,
        "ports": sorted({p.port for p in profiles}),
        "profiles": [comparable_profile(p, redaction_key) for p in profiles],
        "profile_sources": [str(Path(p.source).resolve()) for p in profiles],  # a resume may run from elsewhere
        "min_effect": config.min_effect,
        "target_tps": config.target_tps,
        "allow_mixed": config.allow_mixed,
        **({"allow_node_mismatch": True} if config.allow_node_mismatch else {}),  # a resume allows it too
        **(provenance or {}),
    }


def bench_config_from(stored: dict[str, Any]) -> BenchConfig:
    known = {f.name for f in fields(BenchConfig)}
    data = {k: v for k, v in stored.items() if k in known}
    data["concurrency"] = tuple(data.get("concurrency", (1,)))
    return BenchConfig(**data)


def check_resumable(
    exp: dict[str, Any],
    profiles: Sequence[Profile],
    bench: BenchConfig | None = None,
    *,
    redaction_key: bytes | None = None,
) -> None:
    """Refuse to resume what cannot be continued as the same experiment."""
    if exp["status"] == "complete":
        raise OrchError(f"experiment {exp['id']} is already complete (`orch show {exp['id']}` prints it)")
    if exp["kind"] != "ab" or not exp.get("design_json"):
        raise OrchError(f"experiment {exp['id']} was stored by an older orch without a design; it cannot be resumed")
    config = json.loads(exp["config_json"])
    stored = config.get("profiles") or []
    if len(stored) != len(profiles):
        raise OrchError(f"experiment {exp['id']} has {len(stored)} arms, not {len(profiles)}")
    for want, prof in zip(stored, profiles, strict=True):
        now = comparable_profile(prof, redaction_key)
        changed = sorted(k for k in set(want) | set(now) if want.get(k) != now.get(k))
        if changed:
            raise OrchError(
                f"profile {prof.name!r} changed since experiment {exp['id']} started (fields: {', '.join(changed)}); "
                "a resumed experiment must run the same configuration: restore the profile or start a new experiment"
            )
    if bench is not None and config.get("requests_sha256") not in (None, requests_digest(bench)):
        raise OrchError(
            f"the requests of experiment {exp['id']} changed since it started (was the prompts file "
            f"{bench.prompts!r} edited?); a resumed experiment must send the same requests"
        )


def check_same_machine(exp_id: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    """A resume must run where the experiment started: launches on two machines are not one experiment."""

    def gpu_ids(facts: dict[str, Any]) -> list[Any]:
        return [g.get("uuid") for g in facts.get("gpus") or []]

    if gpu_ids(before):
        # GPU UUIDs identify the machine even where hostnames do not (a container gets a new one per run).
        if gpu_ids(before) != gpu_ids(after):
            now = gpu_ids(after) or f"none readable ({after.get('gpu_error') or 'nvidia-smi gave no GPUs'})"
            raise OrchError(
                f"experiment {exp_id} ran on GPUs {gpu_ids(before)}; this host has {now}. "
                "A resumed experiment must run on the same GPUs"
            )
    elif before.get("hostname") and before.get("hostname") != after.get("hostname"):
        raise OrchError(
            f"experiment {exp_id} ran on machine {before['hostname']!r}; this host is {after.get('hostname')!r}. "
            "A resumed experiment must run on the same machine"
        )


def run_ab(
    host: Host,
    profiles: Sequence[Profile],
    config: ABConfig,
    store: Store,
    *,
    on_event: Callable[[str], None] = lambda _: None,
    on_run: Callable[[str, RunResult], None] = lambda _p, _r: None,
    resume: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> ABResult:
    """Run every launch of the design from fresh state; persist as we go; tear down whatever happens.

    With `resume`, continue that stored experiment: its completed launches stand, the rest of its schedule runs
    (same seed, same order); launches cut short earlier are kept in the store but left out of the statistics.
    `provenance` (how it was started: the --host given, the workdir) is stored with a new experiment.
    """
    if not profiles:
        raise OrchError("an A/B needs at least one profile")
    engines.check_use(profiles, config.bench.endpoint, simulate=config.simulate)
    attach.check_arms(profiles, allow_mixed=config.allow_mixed, strict_env=config.strict_env, simulate=config.simulate)
    # Secret values are stored as digests keyed per store; errors and printed log tails are scrubbed of them.
    key = store.redaction_key
    secrets = [v for p in profiles for v in server.profile_secrets(p)]
    on_event = _scrubbing(on_event, secrets)
    check_nodes(host, profiles)
    resumed = store.find_experiment(resume) if resume is not None else None
    exp_id = resumed["id"] if resumed is not None else new_experiment_id()
    facts = host_facts(host, config, resumed, on_event)
    if isinstance(host, GroupHost):
        multinode.check_ports(host, facts["nodes"], nodes_needed(profiles))
    # The host lock comes before any write: a session that cannot have the host changes nothing in the store.
    locked = lock_nodes(host, exp_id, config.lock_wait_s, on_event)
    try:
        notes: list[str] = []
        launches: list[LaunchResult] = []
        if resume is not None:
            exp = store.find_experiment(exp_id)  # read again under the lock: another session may have resumed it
            check_resumable(exp, profiles, config.bench, redaction_key=key)
            stored = json.loads(exp["config_json"])
            check_same_machine(exp_id, stored.get("host_facts") or {}, facts)
            design = Design.from_dict(json.loads(exp["design_json"]))
            changed = facts_changed(stored.get("host_facts") or {}, facts)
            if changed:
                notes.append(f"host facts changed since the experiment started: {', '.join(changed)}")
                on_event(f"NOTE: {notes[-1]}")
            if stored.get("namespace") not in (None, config.namespace):
                # Cleanup before each launch only sees its own namespace: leftovers of the other would be "foreign".
                notes.append(f"started in namespace {stored['namespace']!r}, resumed in {config.namespace!r}")
                on_event(f"NOTE: {notes[-1]}")
            launches, cut = stored_launches(store, exp_id)
            if cut:
                discarded = len(cut)
                notes.append(f"{discarded} launch(es) cut short are kept in the store but left out of the statistics")
            store.reopen_experiment(exp_id)
        else:
            seed = config.order_seed if config.order_seed is not None else random.SystemRandom().randrange(2**31)
            blocks = config.auto.min_blocks if config.auto is not None else config.blocks
            design = Design.make(len(profiles), blocks, config.order, seed, config.auto)
            store.create_experiment(
                exp_id,
                kind="ab",
                simulated=config.simulate,
                host=host.name,
                arms=[p.name for p in profiles],
                config=experiment_config(profiles, config, facts, provenance, redaction_key=key),
                orch_version=__version__,
                design=design.to_dict(),
            )
        names = [p.name for p in profiles]
        try:  # from here on the stored experiment ends interrupted, failed or complete, whatever happens
            progress.phase("experiment", id=exp_id, arms=names, simulated=config.simulate)
            auto = f"blocks auto ({design.auto.min_blocks} to {design.auto.max_blocks})" if design.auto else ""
            on_event(
                f"experiment {exp_id} on {host.name}: {' vs '.join(names)}, {auto or f'{design.blocks} block(s)'}, "
                f"order {design.order} (seed {design.seed})" + (" (SIMULATED server)" if config.simulate else "")
            )
            if design.blocks < 2 and len(profiles) > 1:
                on_event(
                    "NOTE: one launch per arm cannot separate restart noise from a real difference; use --blocks 3+"
                )
            if resume is not None:
                on_event(f"resuming {exp_id}: {len(launches)} of {len(design.slots())} launches already complete")
            n = 0
            while True:
                done = {(launch.block, launch.arm_index) for launch in launches}
                n = max(n, len(done))
                for block, position, arm in [slot for slot in design.slots() if (slot[0], slot[2]) not in done]:
                    n += 1
                    cap = f" (at most {design.auto.max_blocks})" if design.auto else ""
                    progress.phase(
                        "slot",
                        n=n,
                        total=len(design.slots()),
                        block=block + 1,
                        blocks=design.blocks,
                        max_blocks=design.auto.max_blocks if design.auto else None,
                        arm=arm_label(names, arm),
                    )
                    on_event(
                        f"launch {n}/{len(design.slots())}: block {block + 1}/{design.blocks}{cap}, "
                        f"{arm_label(names, arm)}"
                    )
                    launches.append(
                        _run_launch(
                            host, profiles[arm], arm, block, position, exp_id, config, store, on_event, on_run, key
                        )
                    )
                if design.auto is None:
                    break
                progress.phase("look")
                now = ABResult(exp_id, config.simulate, host.name, tuple(names), tuple(launches), facts)
                stop, line = auto_look(dataclasses.replace(now, design=design, min_effect=config.min_effect))
                on_event(line)
                if stop:
                    break
                design = design.extended(design.blocks + 1)
                store.update_design(exp_id, design.to_dict())
            empty = [arm_label(names, i) for i in range(len(profiles)) if not has_valid_run(launches, i)]
            if empty:
                raise NoValidRunsError(
                    f"no valid timed run in {', '.join(empty)}: every run was invalid (`orch show {exp_id}` lists "
                    "each run's reason); nothing can be compared"
                )
        except KeyboardInterrupt:
            store.finish_experiment(exp_id, "interrupted", "interrupted by the user")
            if len(profiles) > 1:
                on_event(f"experiment {exp_id} interrupted; continue it with: orch ab --resume {exp_id}")
            raise
        except BaseException as e:
            store.finish_experiment(exp_id, "failed", scrub(str(e), secrets) or type(e).__name__)
            if len(profiles) > 1 and not isinstance(e, (StrictEnvError, NoValidRunsError)):
                on_event(
                    f"experiment {exp_id} failed; after fixing the cause, continue it with: orch ab --resume {exp_id}"
                )
            raise
        store.finish_experiment(exp_id, "complete")
    finally:
        # Never let a failed unlock hide why we are here; the lock also goes when the agent's connection closes.
        for node in reversed(locked):
            with contextlib.suppress(Exception):
                node.call("unlock", path=node.lock_path)
    return with_auto_notes(
        ABResult(
            exp_id,
            config.simulate,
            host.name,
            tuple(names),
            tuple(launches),
            facts,
            config.target_tps,
            design,
            config.min_effect,
            notes=tuple(notes),
        )
    )


def _scrubbing(on_event: Callable[[str], None], secrets: list[str]) -> Callable[[str], None]:
    """on_event, printing no secret: events can carry a server's log tail (which has its args in clear)."""
    return lambda msg: on_event(scrub(msg, secrets))


# Host facts that legitimately differ between two sessions on the same host.
_VOLATILE_FACTS = {"time", "uptime_s", "load", "loadavg", "mem_available_bytes", "disk_free_bytes", "pid"}


def facts_changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(before) | set(after) if k not in _VOLATILE_FACTS and before.get(k) != after.get(k))


def nodes_needed(profiles: Sequence[Profile]) -> int:
    """How many nodes the experiment's largest launched profile spans (what a Slurm host asks Slurm for)."""
    return max((p.nnodes for p in profiles if attach.url_of(p) is None), default=1)


def host_facts(
    host: Host, config: ABConfig, resumed: dict[str, Any] | None, on_event: Callable[[str], None]
) -> dict[str, Any]:
    """The host facts stored with the experiment. A group's: every node's, compared before anything starts; rank
    0's stand for the experiment (its API is measured), every node's under `nodes`, and how they differ under
    `node_mismatches` when --allow-node-mismatch (or the resumed experiment's own) let them launch anyway."""
    if not isinstance(host, GroupHost):
        facts: dict[str, Any] = host.call("facts", nvidia_smi=host.config.nvidia_smi)
        return facts
    allowed = config.allow_node_mismatch or (
        resumed is not None and bool(json.loads(resumed["config_json"]).get("allow_node_mismatch"))
    )
    per_node, mismatches = multinode.node_facts(host, allow_mismatch=allowed)
    if not mismatches:
        return {**per_node[host.nodes[0].name], "nodes": per_node}
    on_event(
        f"WARNING: the nodes of {host.name} differ ({'; '.join(mismatches)}); launching anyway "
        "(--allow-node-mismatch): the experiment records it and its reports show it"
    )
    return {**per_node[host.nodes[0].name], "nodes": per_node, "node_mismatches": mismatches}


def check_nodes(host: Host, profiles: Sequence[Profile]) -> None:
    """A multi-node profile needs an inventory group with enough hosts as --host (exit 2 otherwise)."""
    check_nodes_for(profiles, len(host.nodes) if isinstance(host, GroupHost) else 1, host.name)


def check_nodes_for(profiles: Sequence[Profile], nodes: int, host_name: str, is_slurm: bool = False) -> None:
    """check_nodes before connecting (the CLI, from the inventory alone): `nodes` hosts under --host `host_name`; a
    Slurm host asks Slurm for as many nodes as the profiles need, so it always has enough."""
    if is_slurm:
        return
    for p in profiles:
        if p.nnodes == 1 or attach.url_of(p) is not None:
            continue
        if nodes < p.nnodes:
            what = f"group {host_name} has {nodes} host(s)" if nodes > 1 else f"{host_name} is one host"
            raise InputError(
                f"profile {p.name!r} has nnodes: {p.nnodes}, so --host must name an inventory group of at least "
                f"{p.nnodes} hosts (hosts.yaml: `gpu-pair: {{nodes: [gpu-a, gpu-b]}}` under hosts) or a Slurm host "
                f"(`slurm:PARTITION`: orch asks for {p.nnodes} nodes), but {what}"
            )


def lock_nodes(host: Host, exp_id: str, wait_s: float, on_event: Callable[[str], None]) -> list[Host]:
    """The host lock of every node (a group's in name order, so two sessions wanting overlapping groups cannot
    deadlock); the hosts whose lock this session now holds."""
    if not isinstance(host, GroupHost):
        acquire_host_lock(host, host.lock_path, exp_id, wait_s, on_event)
        return [host]
    held: list[Host] = []

    def ours(holder: dict[str, Any]) -> bool:
        return holder.get("session") == SESSION and holder.get("experiment_id") == exp_id

    try:
        for node in sorted(host.nodes, key=lambda h: h.name):
            if acquire_host_lock(node, node.lock_path, exp_id, wait_s, on_event, shared_ok=ours):
                held.append(node)
            else:
                on_event(f"NOTE: {node.name} is the same machine as another node of {host.name} (one host lock)")
    except BaseException:
        for node in held:
            with contextlib.suppress(Exception):
                node.call("unlock", path=node.lock_path)
        raise
    return held


def acquire_host_lock(
    host: Host,
    path: str,
    exp_id: str,
    wait_s: float,
    on_event: Callable[[str], None],
    *,
    purpose: str = "run",
    shared_ok: Callable[[dict[str, Any]], bool] | None = None,
) -> bool:
    """One orch session per host: two sessions launching on one box would measure each other (or, for `orch down`,
    stop each other's servers). False: not taken because shared_ok accepts its holder (this session already holds
    that machine's lock as another node of a group)."""
    holder = {
        "session": SESSION,
        "user": getpass.getuser(),
        "machine": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "experiment_id": exp_id,
        "command": " ".join(sys.argv[:12]),
    }
    got = host.call("lock", path=path, holder=holder, wait_s=0)
    if not got["acquired"] and shared_ok is not None and shared_ok(got.get("holder") or {}):
        return False
    if not got["acquired"] and wait_s > 0:
        on_event(f"{host.name} is busy ({describe_holder(got['holder'])}); waiting up to {wait_s:.0f}s")
        progress.phase("lock wait", holder=describe_holder(got["holder"]))
        got = host.call("lock", path=path, holder=holder, wait_s=wait_s)
    if not got["acquired"]:
        if purpose == "orch down":
            raise HostError(
                f"{host.name} is in use by a live orch session ({describe_holder(got['holder'])}); orch down "
                "leaves its servers alone. Wait for it to finish, or pass --force to stop its servers anyway."
            )
        raise HostError(
            f"{host.name} is busy: another orch session holds it ({describe_holder(got['holder'])}). "
            "Use --wait SECONDS to queue behind it. (The lock goes away by itself when that session ends or "
            "its connection drops.)"
        )
    return True


def describe_holder(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    return (
        f"{holder.get('user', '?')}@{holder.get('machine', '?')} pid {holder.get('pid', '?')} since "
        f"{holder.get('since', '?')}, experiment {holder.get('experiment_id', '?')}"
    )


def _run_launch(
    host: Host,
    profile: Profile,
    index: int,
    block: int,
    position: int,
    exp_id: str,
    config: ABConfig,
    store: Store,
    on_event: Callable[[str], None],
    on_run: Callable[[str, RunResult], None],
    redaction_key: bytes | None = None,
) -> LaunchResult:
    if attach.url_of(profile) is not None:  # a server someone else runs: nothing to launch, verify or tear down
        args = (host, profile, index, block, position, exp_id, config, store, on_event, on_run, redaction_key)
        return attach.run_session(*args)
    runs: list[RunResult] = []
    state: dict[str, Any] = {}

    def launched(launch: server.Launch) -> None:
        state["launch"] = launch
        store.add_launch(
            launch.launch_id,
            experiment_id=exp_id,
            arm_index=index,
            block=block,
            position=position,
            profile=profile.name,
            profile_dict=profile.to_dict(redaction_key=redaction_key),
            argv=list(launch.argv),
            env=launch.env,
            pid=launch.pid,
            started_at=launch.started_at,
        )

    def torn_down(srv: server.RunningServer) -> None:
        state["teardown"] = srv.teardown or {}
        store.update_launch(srv.launch.launch_id, teardown_json=srv.teardown)

    def record(run: RunResult) -> None:
        runs.append(run)
        store.add_run(state["launch"].launch_id, run.to_dict())
        on_run(profile.name, run)

    multi = isinstance(host, GroupHost) and profile.nnodes > 1
    lifecycle: Callable[..., contextlib.AbstractContextManager[server.RunningServer]] = (
        multinode.running if multi else server.running
    )
    try:
        with lifecycle(
            host,
            profile,
            simulate=config.simulate,
            namespace=config.namespace,
            ready_timeout_s=config.ready_timeout_s,
            grace_s=config.grace_s,
            gpu_wait_s=config.gpu_wait_s,
            force=config.force,
            on_event=on_event,
            on_launch=launched,
            on_teardown=torn_down,
            redaction_key=redaction_key,
        ) as srv:
            env = srv.env_report
            assert env is not None
            store.update_launch(
                srv.launch.launch_id,
                ready_s=srv.ready_s,
                preflight_json=srv.preflight,
                env_report_json=env.to_dict(),
            )
            fp = fingerprint.collect(
                host,
                srv,
                profile,
                workload_digest=fingerprint.workload_digest(config.bench),
                redaction_key=redaction_key,
                orch_version=__version__,
            )
            store.update_launch(srv.launch.launch_id, fingerprint_json=fp)
            for line in describe_env(env):
                on_event(f"{profile.name}: {line}")
            if config.strict_env and not env.ok:
                raise StrictEnvError(
                    f"{profile.name}: environment check failed (--strict-env); see above. Fix the profile or the "
                    "host's environment and start a new experiment"
                )

            def recover(err: str) -> bool:
                on_event(f"{profile.name}: {err}")
                host.ensure_connected()
                problem = server_problem(host, srv, profile)
                if problem is not None:
                    tail = srv.failure_tail(host, 20)
                    on_event(f"{profile.name}: {problem}; not repeating the run. Last lines of its log:\n{tail}")
                    return False
                return True

            bench = config.bench
            runner = runner_for(
                host,
                connect_address(profile.host),
                srv.launch.port,
                srv.base_url,
                bench,
                engines.get(profile.engine),
                watch=srv.processes,
            )
            model = profile.served_model_name or profile.model_path
            run_benchmark(runner, bench, model=model, on_run=record, recover=recover)
            ready_s = srv.ready_s
            # Read during the first timed run: clocks and temperatures that drift between launches make them unequal.
            gpus = next((r.gpus for r in runs if r.gpus and r.gpus.get("available")), None)
            store.update_launch(srv.launch.launch_id, gpus_json=gpus)
    except BaseException as e:
        interrupted = was_interrupted(e)
        if "launch" in state:
            status = "interrupted" if interrupted else "failed"
            error = scrub(str(e), server.profile_secrets(profile)) or type(e).__name__
            store.update_launch(state["launch"].launch_id, status=status, error=error)
        if interrupted and not isinstance(e, KeyboardInterrupt):
            # Ctrl-C came first and the teardown that followed failed too (seen: the SSH agent restarting after an
            # interrupted call). It is still an interrupt: exit 130 and an `interrupted` experiment, with the
            # teardown's error shown.
            on_event(f"{profile.name}: after the interrupt, cleaning up failed: {type(e).__name__}: {e}")
            raise KeyboardInterrupt from e
        raise
    store.update_launch(state["launch"].launch_id, status="complete")
    return LaunchResult(
        profile.name,
        state["launch"].launch_id,
        tuple(runs),
        ready_s,
        env.to_dict(),
        state.get("teardown", {}),
        spec_steps=spec_steps(profile.to_dict()),
        block=block,
        position=position,
        arm_index=index,
        gpus=gpus,
        fingerprint=fp,
    )


def server_problem(host: Host, srv: server.RunningServer, profile: Profile) -> str | None:
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
    return server.health_problem(srv.base_url, profile, timeout_s=HEALTH_TIMEOUT_S)


HEALTH_TIMEOUT_S = 5.0


def describe_env(report: server.EnvReport) -> list[str]:
    """Human lines for an env check: one per differing variable, grouping the processes it differs in."""
    if report.ok:
        lines = [f"env check ok: every profile variable reached all {report.processes} processes"]
    else:
        groups: dict[tuple[str, str, str | None, str], list[int]] = {}
        for m in report.mismatches:
            groups.setdefault((m.var, m.expected, m.actual, m.note), []).append(m.pid)
        lines = [f"ENV MISMATCH in {len({m.pid for m in report.mismatches})} of {report.processes} processes:"]
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

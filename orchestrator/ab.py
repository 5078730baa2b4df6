"""A/B experiments: every arm from a fresh, verified launch on the same host in the same session."""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator import __version__, server
from orchestrator.bench import BenchConfig, RunResult, host_runner, local_runner, run_benchmark
from orchestrator.errors import HostError, OrchError, ServerError
from orchestrator.hosts import Host, connect_address
from orchestrator.profile import Profile
from orchestrator.stats import BreakEven, Summary, ratio, spec_from_run, summarize
from orchestrator.store import Store


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


@dataclass(frozen=True)
class ArmResult:
    """One arm = one launch (for now) and its runs, with what was verified about it."""

    profile: str
    launch_id: str
    runs: tuple[RunResult, ...]
    ready_s: float
    env_report: dict[str, Any]
    teardown: dict[str, Any]
    spec_steps: int | None = None  # draft steps when the arm uses speculative decoding

    @property
    def levels(self) -> list[int]:
        """Concurrency levels in the order they ran."""
        return list(dict.fromkeys(r.concurrency for r in self.runs if not r.warmup))

    def timed_at(self, concurrency: int | None = None) -> list[RunResult]:
        """Valid timed runs at one level (default: the first level, the headline)."""
        level = concurrency if concurrency is not None else (self.levels[0] if self.levels else 1)
        return [r for r in self.runs if not r.warmup and r.valid and r.concurrency == level]

    @property
    def timed(self) -> list[RunResult]:
        return self.timed_at()

    def summary_at(self, concurrency: int | None = None) -> Summary | None:
        """Per-stream tok/s over the level's valid timed runs."""
        timed = self.timed_at(concurrency)
        return summarize([r.tok_s for r in timed]) if timed else None

    def aggregate_at(self, concurrency: int | None = None) -> Summary | None:
        timed = self.timed_at(concurrency)
        return summarize([r.aggregate_tok_s for r in timed]) if timed else None

    @property
    def summary(self) -> Summary | None:
        return self.summary_at()

    def accept_length_at(self, concurrency: int | None = None) -> float | None:
        """Mean accept length over a level's valid timed runs, each from that run's own data (never lifetime)."""
        values = [r.spec_accept_length for r in self.timed_at(concurrency) if r.spec_accept_length is not None]
        return sum(values) / len(values) if values else None

    @property
    def accept_length(self) -> float | None:
        return self.accept_length_at()

    @property
    def invalid_runs(self) -> list[RunResult]:
        return [r for r in self.runs if not r.warmup and not r.valid]


@dataclass(frozen=True)
class Comparison:
    arm: str
    vs: str
    ratio: float | None
    concurrency: int = 1
    aggregate_ratio: float | None = None


@dataclass(frozen=True)
class ABResult:
    experiment_id: str
    simulated: bool
    host: str
    arms: tuple[ArmResult, ...]
    host_facts: dict[str, Any]
    target_tps: float | None = None

    def comparisons_at(self, concurrency: int | None = None) -> list[Comparison]:
        base = self.arms[0]
        level = concurrency if concurrency is not None else (base.levels[0] if base.levels else 1)
        out = []
        for arm in self.arms[1:]:
            r = agg = None
            s, bs = arm.summary_at(level), base.summary_at(level)
            if s and bs:
                r = ratio(s.median, bs.median)
            a, ba = arm.aggregate_at(level), base.aggregate_at(level)
            if a and ba and ba.median > 0:
                agg = ratio(a.median, ba.median)
            out.append(Comparison(arm=arm.profile, vs=base.profile, ratio=r, concurrency=level, aggregate_ratio=agg))
        return out

    @property
    def comparisons(self) -> list[Comparison]:
        """Each arm against the first, at the first concurrency level (the headline)."""
        return self.comparisons_at()

    def speculation(self) -> list[tuple[str, BreakEven]]:
        """For each speculative arm compared with a non-speculative baseline: the break-even arithmetic."""
        base = self.arms[0]
        bs = base.summary
        if bs is None or base.spec_steps is not None:
            return []
        out = []
        for arm in self.arms[1:]:
            s, tau = arm.summary, arm.accept_length
            if arm.spec_steps is None or s is None or tau is None:
                continue
            out.append((arm.profile, spec_from_run(bs.median, s.median, tau, arm.spec_steps, self.target_tps)))
        return out


# Names this orch process in the host lock, so after a silent network drop it can take its own lock back.
SESSION = uuid.uuid4().hex


def new_experiment_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def run_ab(
    host: Host,
    profiles: Sequence[Profile],
    config: ABConfig,
    store: Store,
    *,
    on_event: Callable[[str], None] = lambda _: None,
    on_run: Callable[[str, RunResult], None] = lambda _p, _r: None,
) -> ABResult:
    """Run every arm in order from a fresh launch; persist as we go; tear down whatever happens."""
    if not profiles:
        raise OrchError("an A/B needs at least one profile")
    ports = {p.port for p in profiles}
    exp_id = new_experiment_id()
    facts = host.call("facts", nvidia_smi=host.config.nvidia_smi)
    store.create_experiment(
        exp_id,
        kind="ab",
        simulated=config.simulate,
        host=host.name,
        arms=[p.name for p in profiles],
        config={
            "bench": config.bench.to_dict(),
            "host_facts": facts,
            "strict_env": config.strict_env,
            "ports": sorted(ports),
        },
        orch_version=__version__,
    )
    on_event(
        f"experiment {exp_id} on {host.name}: {' vs '.join(p.name for p in profiles)}"
        + (" (SIMULATED server)" if config.simulate else "")
    )
    arms: list[ArmResult] = []
    lock_path = host.lock_path
    try:
        acquire_host_lock(host, lock_path, exp_id, config.lock_wait_s, on_event)
        try:
            for index, profile in enumerate(profiles):
                arms.append(_run_arm(host, profile, index, exp_id, config, store, on_event, on_run))
        finally:
            with contextlib.suppress(HostError):
                host.call("unlock", path=lock_path)
    except KeyboardInterrupt:
        store.finish_experiment(exp_id, "interrupted", "interrupted by the user")
        raise
    except BaseException as e:
        store.finish_experiment(exp_id, "failed", str(e) or type(e).__name__)
        raise
    store.finish_experiment(exp_id, "complete")
    return ABResult(exp_id, config.simulate, host.name, tuple(arms), facts, config.target_tps)


def acquire_host_lock(host: Host, path: str, exp_id: str, wait_s: float, on_event: Callable[[str], None]) -> None:
    """One orch session per host: two sessions launching on one box would measure each other."""
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
    if not got["acquired"] and wait_s > 0:
        on_event(f"{host.name} is busy ({describe_holder(got['holder'])}); waiting up to {wait_s:.0f}s")
        got = host.call("lock", path=path, holder=holder, wait_s=wait_s)
    if not got["acquired"]:
        raise HostError(
            f"{host.name} is busy: another orch session holds it ({describe_holder(got['holder'])}). "
            "Use --wait SECONDS to queue behind it. (The lock goes away by itself when that session ends or "
            "its connection drops.)"
        )


def describe_holder(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    return (
        f"{holder.get('user', '?')}@{holder.get('machine', '?')} pid {holder.get('pid', '?')} since "
        f"{holder.get('since', '?')}, experiment {holder.get('experiment_id', '?')}"
    )


def _run_arm(
    host: Host,
    profile: Profile,
    index: int,
    exp_id: str,
    config: ABConfig,
    store: Store,
    on_event: Callable[[str], None],
    on_run: Callable[[str, RunResult], None],
) -> ArmResult:
    runs: list[RunResult] = []
    state: dict[str, Any] = {}

    def launched(launch: server.Launch) -> None:
        state["launch"] = launch
        store.add_launch(
            launch.launch_id,
            experiment_id=exp_id,
            arm_index=index,
            profile=profile.name,
            profile_dict=profile.to_dict(),
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

    on_event(f"arm {index + 1}: {profile.name}")
    try:
        with server.running(
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
        ) as srv:
            env = srv.env_report
            assert env is not None
            store.update_launch(
                srv.launch.launch_id,
                ready_s=srv.ready_s,
                preflight_json=srv.preflight,
                env_report_json=env.to_dict(),
            )
            for line in describe_env(env):
                on_event(f"{profile.name}: {line}")
            if config.strict_env and not env.ok:
                raise ServerError(f"{profile.name}: environment check failed (--strict-env); see above")

            def recover(err: str) -> bool:
                on_event(f"{profile.name}: {err}; checking the connection and the server, then repeating the run")
                host.ensure_connected()
                # A crashing server closes its port a moment before its process is gone: give it that moment, so
                # a crash is reported as one, not retried as if the network had dropped.
                for _ in range(15):
                    if not host.call("alive", pid=srv.launch.pid)["alive"]:
                        tail = host.call("log_tail", path=srv.launch.log_path, lines=20)
                        on_event(f"{profile.name}: the server process is gone. Last lines of its log:\n{tail}")
                        return False
                    time.sleep(0.2)
                return True

            bench = config.bench
            runner = (
                host_runner(host, connect_address(profile.host), srv.launch.port, bench)
                if bench.client == "host"
                else local_runner(srv.base_url, bench)
            )
            model = profile.served_model_name or profile.model_path
            run_benchmark(runner, bench, model=model, on_run=record, recover=recover)
            ready_s = srv.ready_s
    except BaseException as e:
        if "launch" in state:
            status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            store.update_launch(state["launch"].launch_id, status=status, error=str(e) or type(e).__name__)
        raise
    store.update_launch(state["launch"].launch_id, status="complete")
    return ArmResult(
        profile.name,
        state["launch"].launch_id,
        tuple(runs),
        ready_s,
        env.to_dict(),
        state.get("teardown", {}),
        # SGLang picks (3, 1, 4) when num_steps is unset
        spec_steps=None if profile.speculative is None else (profile.speculative.num_steps or 3),
    )


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

"""One launch of an A/B arm: a fresh server started, checked, fingerprinted, benchmarked, torn down; all stored."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator import __version__, engines
from orchestrator.common.redaction import scrub
from orchestrator.config.profile import Profile
from orchestrator.errors import ServerError, was_interrupted
from orchestrator.hosts.base import Host, connect_address
from orchestrator.hosts.group import GroupHost
from orchestrator.launch import attach, fingerprint, single
from orchestrator.launch import group as multinode
from orchestrator.launch.benchmark import run_benchmark, runner_for
from orchestrator.results.model import LaunchResult, spec_steps
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store

if TYPE_CHECKING:
    from orchestrator.config.design import ABConfig


class StrictEnvError(ServerError):
    """--strict-env and the workers did not get the profile's environment (a resume cannot fix that)."""


def run_launch(
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

    def launched(launch: single.Launch) -> None:
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

    def torn_down(srv: single.RunningServer) -> None:
        state["teardown"] = srv.teardown or {}
        store.update_launch(srv.launch.launch_id, teardown_json=srv.teardown)

    def record(run: RunResult) -> None:
        runs.append(run)
        store.add_run(state["launch"].launch_id, run.to_dict())
        on_run(profile.name, run)

    multi = isinstance(host, GroupHost) and profile.nnodes > 1
    lifecycle: Callable[..., contextlib.AbstractContextManager[single.RunningServer]] = (
        multinode.running_group if multi else single.running
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
            error = scrub(str(e), single.profile_secrets(profile)) or type(e).__name__
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


def server_problem(host: Host, srv: single.RunningServer, profile: Profile) -> str | None:
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
    return single.health_problem(srv.base_url, profile, timeout_s=HEALTH_TIMEOUT_S)


HEALTH_TIMEOUT_S = 5.0


def describe_env(report: single.EnvReport) -> list[str]:
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

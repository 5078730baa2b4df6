"""One launch of an A/B arm: a server from the launch lifecycle, fingerprinted, benchmarked, all stored."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestrator import engines
from orchestrator.config.design import ABConfig
from orchestrator.config.profile import Profile
from orchestrator.config.secretpatterns import scrub
from orchestrator.errors import ServerError, was_interrupted
from orchestrator.hosts.base import Host
from orchestrator.launch import fingerprint, lifecycle, single
from orchestrator.launch.benchmark import run_benchmark
from orchestrator.results.model import LaunchResult, spec_steps
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store
from orchestrator.ui.events import QUIET, Events


class StrictEnvError(ServerError):
    """--strict-env and the workers did not get the profile's environment (a resume cannot fix that)."""


@dataclass(frozen=True)
class LaunchSlot:
    """Where one launch sits in an experiment: its arm, its block, and its place in the block's order."""

    experiment_id: str
    arm_index: int
    block: int
    position: int


def _no_run(_name: str, _run: RunResult) -> None:
    pass


@dataclass(frozen=True, kw_only=True)
class ArmContext:
    """What every launch of an experiment shares: where it runs, how, where it is stored and shown."""

    host: Host
    config: ABConfig
    store: Store
    events: Events = QUIET
    on_run: Callable[[str, RunResult], None] = _no_run
    redaction_key: bytes | None = None  # the store's, for the digests of secret values in what is stored

    @property
    def settings(self) -> lifecycle.Settings:
        return lifecycle.settings(self.config, self.redaction_key)


def run_launch(slot: LaunchSlot, profile: Profile, ctx: ArmContext) -> LaunchResult:
    """The profile's server for this slot: recorded as it starts, benchmarked once ready, its status stored however
    it ends (interrupted launches as such: a failed cleanup after Ctrl-C is still an interrupt, exit 130)."""
    host, store, events, key = ctx.host, ctx.store, ctx.events, ctx.redaction_key
    runs: list[RunResult] = []
    launch_id: str | None = None  # once the launch is stored

    def launched(srv: lifecycle.Server) -> None:
        nonlocal launch_id
        rec = srv.record
        store.add_launch(
            rec.launch_id,
            experiment_id=slot.experiment_id,
            arm_index=slot.arm_index,
            block=slot.block,
            position=slot.position,
            profile=profile.name,
            profile_dict=profile.to_dict(redaction_key=key),
            argv=list(rec.argv),
            env=rec.env,
            pid=rec.pid,
            started_at=rec.started_at,
        )
        launch_id = rec.launch_id

    def torn_down(srv: lifecycle.Server) -> None:
        store.update_launch(srv.launch_id, teardown_json=srv.teardown)

    def record(run: RunResult) -> None:
        runs.append(run)
        assert launch_id is not None
        store.add_run(launch_id, run.to_dict())
        ctx.on_run(profile.name, run)

    try:
        with lifecycle.running(host, profile, ctx.settings, events, on_launch=launched, on_teardown=torn_down) as srv:
            env = srv.env_record()
            store.update_launch(srv.launch_id, ready_s=srv.ready_s, preflight_json=srv.preflight, env_report_json=env)
            digest = fingerprint.workload_digest(ctx.config.bench)
            fp = srv.fingerprint(host, profile, workload_digest=digest, redaction_key=key)
            store.update_launch(srv.launch_id, fingerprint_json=fp)
            for line in srv.notes(profile, fp):
                events.line(f"{profile.name}: {line}")
            if ctx.config.strict_env and not srv.env_ok:
                raise StrictEnvError(
                    f"{profile.name}: environment check failed (--strict-env); see above. Fix the profile or the "
                    "host's environment and start a new experiment"
                )
            bench = ctx.config.bench
            model = profile.served_model_name or profile.model_path
            run_benchmark(
                srv.runner(host, profile, bench),
                bench,
                model=model,
                on_run=record,
                recover=lambda err: srv.recover(host, profile, events, err),
                events=events,
                engine=engines.get(profile.engine),
            )
            # Read during the first timed run: clocks and temperatures that drift between launches make them unequal.
            gpus = next((r.gpus for r in runs if r.gpus and r.gpus.get("available")), None)
            if srv.probes_gpus:
                store.update_launch(srv.launch_id, gpus_json=gpus)
    except BaseException as e:
        interrupted = was_interrupted(e)
        if launch_id is not None:
            status = "interrupted" if interrupted else "failed"
            error = scrub(str(e), single.profile_secrets(profile)) or type(e).__name__
            store.update_launch(launch_id, status=status, error=error)
        if interrupted and not isinstance(e, KeyboardInterrupt):
            # Ctrl-C came first and the teardown that followed failed too (seen: the SSH agent restarting after an
            # interrupted call). It is still an interrupt: exit 130 and an `interrupted` experiment, with the
            # teardown's error shown.
            events.line(f"{profile.name}: after the interrupt, cleaning up failed: {type(e).__name__}: {e}")
            raise KeyboardInterrupt from e
        raise
    store.update_launch(srv.launch_id, status="complete")
    return LaunchResult(
        profile=profile.name,
        launch_id=srv.launch_id,
        runs=tuple(runs),
        ready_s=srv.ready_s or 0.0,
        env_report=env,
        teardown=srv.teardown or {},
        spec_steps=spec_steps(profile.to_dict()),
        block=slot.block,
        position=slot.position,
        arm_index=slot.arm_index,
        gpus=gpus,
        fingerprint=fp,
    )

"""A/B experiments: every arm from a fresh, verified launch on the same host in the same session."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator import __version__, engines
from orchestrator.config import datasets, limits
from orchestrator.config.design import ABConfig, new_experiment_id
from orchestrator.config.profile import Profile
from orchestrator.config.secretpatterns import scrub
from orchestrator.config.slo import DEFAULT_METRIC
from orchestrator.config.workload import run_categories
from orchestrator.errors import BenchError, OrchError
from orchestrator.experiment.arm import ArmContext, LaunchSlot, StrictEnvError, run_launch
from orchestrator.experiment.host import check_nodes, facts_changed, host_facts, nodes_needed
from orchestrator.experiment.resume import check_resumable, check_same_machine, comparable_profile, requests_digest
from orchestrator.hosts import lock as locks
from orchestrator.hosts.base import Host
from orchestrator.hosts.group import GroupHost
from orchestrator.launch import attach, ports, single
from orchestrator.launch import group as multinode
from orchestrator.results import datasource
from orchestrator.results.autostop import auto_look, with_auto_notes
from orchestrator.results.byprompt import workload_prompts
from orchestrator.results.categories import dataset_counts
from orchestrator.results.goodput import needs_rows
from orchestrator.results.load import port_note, stored_launches
from orchestrator.results.model import ABResult, Design, LaunchResult, arm_label, has_valid_run
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store
from orchestrator.ui.events import QUIET, Events, Scrubbed


class NoValidRunsError(BenchError):
    """An arm has no valid timed run, so the experiment has nothing to compare."""


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
        # A dataset's origin, licence and sha256 (builtin and random prompts are generated: nothing to record).
        **({"dataset": d} if (d := datasets.provenance(config.bench.prompts)) is not None else {}),
        "host_facts": facts,
        "strict_env": config.strict_env,
        "ports": sorted({p.port for p in profiles}),
        **({"port": config.port} if config.port is not None else {}),  # a resume and a reproduction use it again
        "profiles": [comparable_profile(p, redaction_key) for p in profiles],
        "profile_sources": [str(Path(p.source).resolve()) for p in profiles],  # a resume may run from elsewhere
        "min_effect": config.min_effect,
        "target_tps": config.target_tps,
        "allow_mixed": config.allow_mixed,
        **({"allow_node_mismatch": True} if config.allow_node_mismatch else {}),  # a resume allows it too
        **({"slo": config.slo.to_dict()} if config.slo is not None else {}),  # a resume and a bundle judge on them
        **({"metric": config.metric} if config.metric != DEFAULT_METRIC else {}),
        # --cache-measured decides verdicts (results/cache): a resume, `orch show` and a bundle judge with it too.
        **({"cache_measured": True} if config.cache_measured else {}),
        **(provenance or {}),
    }


def judged(
    exp_id: str,
    config: ABConfig,
    host: str,
    names: Sequence[str],
    launches: Sequence[LaunchResult],
    facts: dict[str, Any],
    design: Design,
    **more: Any,
) -> ABResult:
    """The experiment's launches so far as a result judged as configured (its design, minimum effect, metric, SLO,
    --cache-measured): what each look of --blocks auto decides on, and, with `more` (notes, workload facts), the
    result run_ab returns. One place, so a look and the end never judge by different rules."""
    return ABResult(
        experiment_id=exp_id,
        simulated=config.simulate,
        host=host,
        profiles=tuple(names),
        launches=tuple(launches),
        host_facts=facts,
        design=design,
        min_effect=config.min_effect,
        slo=config.slo,
        metric=config.metric,
        cache_measured=config.cache_measured,
        **more,
    )


def run_ab(  # noqa: PLR0915 (known debt: docs/architecture.md#known-debt)
    host: Host,
    profiles: Sequence[Profile],
    config: ABConfig,
    store: Store,
    *,
    events: Events = QUIET,
    on_run: Callable[[str, RunResult], None] = lambda _p, _r: None,
    resume: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> ABResult:
    """Run every launch of the design from fresh state; persist as we go; tear down whatever happens.

    With `resume`, continue that stored experiment: its completed launches stand, the rest of its schedule runs
    (same seed, same order); launches cut short earlier are kept in the store but left out of the statistics.
    `provenance` (how it was started: the --host given, the workdir) is stored with a new experiment. `events` gets
    every progress line (scrubbed of the profiles' secret values) and phase; `on_run` every finished run.
    """
    if not profiles:
        raise OrchError("an A/B needs at least one profile")
    # Its callers check the plan before they print anything (options, a suite, a bundle, --resume); here again, as
    # the last line before anything is built, for any caller that did not.
    limits.checked_plan(
        config.bench, profiles, blocks=config.auto.max_blocks if config.auto else config.blocks, sim=config.simulate
    )
    engines.check_use(profiles, config.bench.endpoint, simulate=config.simulate, flush_cache=config.bench.flush_cache)
    attach.check_arms(profiles, allow_mixed=config.allow_mixed, strict_env=config.strict_env, simulate=config.simulate)
    # Secret values are stored as digests keyed per store; errors and printed log tails are scrubbed of them.
    key = store.redaction_key
    secrets = [v for p in profiles for v in single.profile_secrets(p)]
    events = Scrubbed(events, secrets)
    check_nodes(host, profiles)
    ports.check(config.port, profiles, host.group if isinstance(host, GroupHost) else host.config)
    profiles = ports.override(profiles, config.port)
    resumed = store.find_experiment(resume) if resume is not None else None
    exp_id = resumed["id"] if resumed is not None else new_experiment_id()
    facts = host_facts(host, config, resumed, events, engines.fact_packages(p.engine for p in profiles))
    if isinstance(host, GroupHost):
        multinode.check_ports(host, facts["nodes"], nodes_needed(profiles))
    # The host lock comes before any write: a session that cannot have the host changes nothing in the store.
    locked = locks.lock_nodes(host, exp_id, config.lock_wait_s, events)
    try:
        notes: list[str] = []
        launches: list[LaunchResult] = []
        if resume is not None:
            store.reap_orphans()  # an owner that died since the store was opened is known gone now
            exp = store.find_experiment(exp_id)  # read again under the lock: another session may have resumed it
            check_resumable(exp, profiles, config.bench, redaction_key=key)
            stored = json.loads(exp["config_json"])
            check_same_machine(exp_id, stored.get("host_facts") or {}, facts)
            design = Design.from_dict(json.loads(exp["design_json"]))
            changed = facts_changed(stored.get("host_facts") or {}, facts)
            if changed:
                notes.append(f"host facts changed since the experiment started: {', '.join(changed)}")
                events.line(f"NOTE: {notes[-1]}")
            if config.port is not None and stored.get("port") != config.port:
                began = (
                    f"started with --port {stored['port']}" if stored.get("port") else "started on its profiles' ports"
                )
                notes.append(f"{began}, resumed with --port {config.port}")
                events.line(f"NOTE: {notes[-1]}")
            if stored.get("namespace") not in (None, config.namespace):
                # Cleanup before each launch only sees its own namespace: leftovers of the other would be "foreign".
                notes.append(f"started in namespace {stored['namespace']!r}, resumed in {config.namespace!r}")
                events.line(f"NOTE: {notes[-1]}")
            launches, cut = stored_launches(store, exp_id, requests=needs_rows(config.slo, config.metric))
            if cut:
                discarded = len(cut)
                notes.append(f"{discarded} launch(es) cut short are kept in the store but left out of the statistics")
            store.reopen_experiment(exp_id, exp)  # only from the state checked: a session that won a race wins
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
        context = ArmContext(host=host, config=config, store=store, events=events, on_run=on_run, redaction_key=key)
        try:  # from here on the stored experiment ends interrupted, failed or complete, whatever happens
            events.phase("experiment", id=exp_id, arms=names, simulated=config.simulate)
            auto = f"blocks auto ({design.auto.min_blocks} to {design.auto.max_blocks})" if design.auto else ""
            events.line(
                f"experiment {exp_id} on {host.name}: {' vs '.join(names)}, {auto or f'{design.blocks} block(s)'}, "
                f"order {design.order} (seed {design.seed})" + (" (SIMULATED server)" if config.simulate else "")
            )
            # A sweep's probe is one block by design: it finds rates to sweep, it judges no difference.
            if design.blocks < 2 and len(profiles) > 1 and not (provenance or {}).get("sweep_probe"):
                events.line(
                    "NOTE: one launch per arm cannot separate restart noise from a real difference; use --blocks 3+"
                )
            if resume is not None:
                events.line(f"resuming {exp_id}: {len(launches)} of {len(design.slots())} launches already complete")
            n = 0
            while True:
                done = {(launch.block, launch.arm_index) for launch in launches}
                n = max(n, len(done))
                for block, position, arm in [slot for slot in design.slots() if (slot[0], slot[2]) not in done]:
                    n += 1
                    cap = f" (at most {design.auto.max_blocks})" if design.auto else ""
                    events.phase(
                        "slot",
                        n=n,
                        total=len(design.slots()),
                        block=block + 1,
                        blocks=design.blocks,
                        max_blocks=design.auto.max_blocks if design.auto else None,
                        arm=arm_label(names, arm),
                    )
                    events.line(
                        f"launch {n}/{len(design.slots())}: block {block + 1}/{design.blocks}{cap}, "
                        f"{arm_label(names, arm)}"
                    )
                    launches.append(run_launch(LaunchSlot(exp_id, arm, block, position), profiles[arm], context))
                if design.auto is None:
                    break
                events.phase("look")
                now = judged(exp_id, config, host.name, names, launches, facts, design)
                stop, line = auto_look(now)
                events.line(line)
                if stop:
                    break
                design = design.extended(design.blocks + 1)
                store.update_design(exp_id, design.to_dict())
            lacking = [i for i in range(len(profiles)) if not has_valid_run(launches, i)]
            if lacking:
                # The first reason, said here: a reason common to every run (client-limited, too short) is the fix.
                first = next(
                    (
                        r.invalid_reason
                        for launch in launches
                        if launch.arm_index in lacking
                        for r in launch.runs
                        if not r.warmup and r.invalid_reason
                    ),
                    None,
                )
                raise NoValidRunsError(
                    f"no valid timed run in {', '.join(arm_label(names, i) for i in lacking)}: every run was invalid "
                    + (f"(first: {first}; " if first else "(")
                    + f"`orch show {exp_id}` lists each run's reason); nothing can be compared"
                )
        except KeyboardInterrupt:
            store.finish_experiment(exp_id, "interrupted", "interrupted by the user")
            if len(profiles) > 1:
                events.line(f"experiment {exp_id} interrupted; continue it with: orch ab --resume {exp_id}")
            raise
        except BaseException as e:
            store.finish_experiment(exp_id, "failed", scrub(str(e), secrets) or type(e).__name__)
            if len(profiles) > 1 and not isinstance(e, (StrictEnvError, NoValidRunsError)):
                events.line(
                    f"experiment {exp_id} failed; after fixing the cause, continue it with: orch ab --resume {exp_id}"
                )
            raise
        store.finish_experiment(exp_id, "complete")
        port = port_note(config.port, launches)
        notes += [port] if port else []
    finally:
        locks.release_quietly(reversed(locked))
    recorded = json.loads(store.find_experiment(exp_id)["config_json"])
    return with_auto_notes(
        judged(
            exp_id,
            config,
            host.name,
            names,
            launches,
            facts,
            design,
            target_tps=config.target_tps,
            notes=tuple(notes),
            # From the stored config, a resumed experiment's too (a resumed sweep's levels name their probe and rates).
            sweep=recorded["sweep"] if isinstance(recorded.get("sweep"), dict) else None,
            categories=run_categories(config.bench) if datasets.categorised(config.bench.prompts) else None,
            dataset_categories=dataset_counts(config.bench),
            dataset=datasource.recorded(recorded),
            prompts=workload_prompts(config.bench),
        )
    )

"""An experiment from `RunOptions` (`run`): planned and refused before anything starts, run, judged under --fail-on."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from orchestrator import engines
from orchestrator.config import coverage, datasets, design, limits, traces
from orchestrator.config import profile as profiles_mod
from orchestrator.config.design import ABConfig
from orchestrator.config.options import OptionError, RunOptions
from orchestrator.config.plan import Plan
from orchestrator.config.sweep import Sweep
from orchestrator.config.workload import DEFAULT_DURATION_S, BenchConfig, check_requests
from orchestrator.errors import OrchError
from orchestrator.experiment import ab, failon, resume, sweep
from orchestrator.experiment import host as experiment_host
from orchestrator.hosts import resolve_host
from orchestrator.hosts.base import Host, HostConfig, default_namespace
from orchestrator.hosts.inventory import HostGroup, lookup
from orchestrator.launch import attach, ports
from orchestrator.report.lines import SIM_BANNER
from orchestrator.results import model
from orchestrator.results.run import RunResult
from orchestrator.results.store import Store, open_existing
from orchestrator.ui.events import Events
from orchestrator.ui.progress import PlainReporter, is_terminal


@dataclass(frozen=True)
class Outcome:
    """A finished experiment, the --fail-on decision on it (None without --fail-on), and the reporter that showed
    its progress (the report goes through it too)."""

    result: model.ABResult
    decision: failon.FailOn | None
    reporter: PlainReporter


def warn_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(
    options: RunOptions,
    *,
    reporter: PlainReporter | None = None,
    warn: Callable[[str], None] = warn_stderr,
) -> Outcome:
    """`orch ab` / `orch bench`: a new experiment from the options, or (options.resume) a stored one continued.
    Refusals come before anything starts, as OptionError (the CLI's usage errors) or other InputErrors."""
    if options.command == "ab" and options.resume is None and len(options.profiles) < 2:
        raise OptionError("an A/B needs at least two profiles (use `orch bench` for one)")
    options.check_metric()
    expect = bench_expect(options) if options.command == "bench" else None
    options.check_verbosity()
    rep = reporter if reporter is not None else reporter_for(options)
    store = Store(options.db) if options.resume is None else open_existing(options.db)
    try:
        result = (
            resume_experiment(store, options.resume, options, rep)
            if options.resume is not None
            else start(store, options, rep, warn)
        )
    finally:
        store.close()
    decision = failon.fail_on_verdict(result, options.fail_on, expect=expect) if options.fail_on else None
    return Outcome(result, decision, rep)


def bench_expect(options: RunOptions) -> profiles_mod.Expect | None:
    """orch bench judges against the profile's expect.tok_s: with --fail-on, one that cannot be decided is refused
    before anything starts (a wasted launch otherwise)."""
    if not options.fail_on:
        return None
    prof = profiles_mod.load(options.profiles[0])
    if (options.rate or options.trace) and any(mode in ("slower", "different") for mode in options.fail_on):
        raise OptionError(
            "--fail-on slower/different judges single-stream tok/s against the profile's expect.tok_s, which an "
            "open-loop level (--rate) does not measure; use --concurrency 1, or --fail-on env alone"
        )
    refusal = failon.single_profile_refusal(prof.name, prof.expect, options.fail_on, options.concurrency)
    if refusal:
        raise OptionError(refusal)
    return prof.expect


def start(
    store: Store, options: RunOptions, rep: PlainReporter, warn: Callable[[str], None] = warn_stderr
) -> model.ABResult:
    options.check_open_loop()
    names = options.profiles
    # --fail-on crossover-below=R / max-rate-slo-below=R that this experiment could never judge: refused before launch.
    slo_pct = options.slo is not None and any(o.percentile is not None for o in options.slo.objectives)
    levels = options.sweep if options.sweep is not None else len(options.rate or options.concurrency)
    blocks = options.blocks if isinstance(options.blocks, int) else None
    refusal = failon.levels_refusal(
        options.fail_on, levels=levels, arms=len(names), percentile_slo=slo_pct, blocks=blocks
    )
    if refusal:
        raise OptionError(refusal)
    profiles = [profiles_mod.load(n) for n in names]
    profiles_mod.check_distinct_names(profiles)
    profiles = attach.apply_options(profiles, options.attach, names)
    attach.check_arms(profiles, allow_mixed=options.allow_mixed, strict_env=options.strict_env, simulate=options.sim)
    check_host_nodes(profiles, options.host_spec, options.inventory, port=options.port)
    # A dataset's runs each send a category-covering order (config/coverage), by default the whole dataset.
    cover = datasets.covers(options.prompt_source) and options.turns is None and options.trace is None
    categories = datasets.categories_of(options.prompt_source) if cover else []
    per_stream = options.requests_per_stream
    if cover and not options.rate and options.sweep is None and not options.gave("requests_per_stream"):
        per_stream = coverage.default_requests_per_stream(len(categories), options.concurrency)
    bench = BenchConfig(
        runs=options.runs,
        warmup=options.warmup,
        max_tokens=options.max_tokens,
        seed=options.seed,
        concurrency=options.concurrency,
        requests_per_stream=per_stream,
        endpoint=options.endpoint or engines.common_endpoint([p.engine for p in profiles]),
        prompts=options.prompt_source,
        input_len=options.input_len,
        client=options.client_place,
        min_run_s=options.min_run_s,
        stall_timeout_s=options.stall_timeout,
        first_token_timeout_s=options.first_token_timeout,
        **open_loop_fields(options),
        check_outputs=options.check_outputs,
        turns=options.turns,
        flush_cache=options.flush_cache,
        cover=cover,
    )
    engines.check_use(profiles, bench.endpoint, simulate=options.sim, flush_cache=bench.flush_cache)
    # The plan is arithmetic on the options: an absurd one is refused before the request sequence is built, with its
    # line; one within the limits is said once the inputs are checked too, so that a refusal is all a bad input prints.
    auto = options.sequential_plan()
    spec = sweep_of(options)
    said: list[str] = []
    try:
        if spec is not None:
            # The sweep's own plan waits for its rates; its probe is planned (and refused) now.
            if spec.concurrency == 1:
                said.append(
                    "sweep: --max-concurrency 1 leaves no range of rates to sweep (one request in flight: the client "
                    "is the limit): one rate level, the synchronous rate a probe launch per arm finds first"
                )
            else:
                # Rates that round alike, or a server that does not saturate, give fewer: "up to", and the probe says.
                said.append(f"sweep: up to {spec.levels} rate levels, found by a probe launch per arm first")
            work = limits.checked_plan(spec.probe_bench(bench), profiles, blocks=1, sim=options.sim, show=said.append)
        else:
            work = limits.checked_plan(
                bench,
                profiles,
                blocks=auto.max_blocks if auto else blocks_of(options),
                sim=options.sim,
                least_blocks=auto.min_blocks if auto else None,
                show=said.append,
            )
    except limits.PlanError as e:
        for line in said:
            rep.line(line)
        raise OptionError(str(e)) from None
    check_requests(bench)  # bad prompt files or options fail here, before the plan line and any server starts
    if spec is None and (covering := coverage.coverage(bench, categories)) is not None:
        said.append(covering.line())
    for line in said:
        rep.line(line)
    for warning in (work.too_short(), time_limit_warning(work, options.host_spec, options.inventory)):
        if warning:
            warn(f"WARNING: {warning}")
    return execute(store, profiles, bench, options, rep, None)


def open_loop_fields(options: RunOptions) -> dict[str, Any]:
    """The workload's open-loop fields from --rate and its options ({} for closed loop); a level given neither
    --duration nor --requests lasts DEFAULT_DURATION_S, recorded as if given. --trace: one level, named by the
    replay's mean rate, of the trace's first --requests requests (all of them by default)."""
    if options.trace is not None:
        replay = traces.load(options.trace, options.requests_per_level)
        traces.check_span(options.trace, replay, options.speed)
        return {
            "rate": (traces.mean_rate(replay, options.speed),),
            "requests_per_level": len(replay),
            "max_concurrency": options.max_concurrency,
            "stop_oversaturated": options.stop_oversaturated,
            "trace": str(Path(options.trace).resolve()),
            "speed": options.speed,
            "trace_sha256": datasets.file_sha256(options.trace),
        }
    if not options.rate:
        return {}
    duration = options.duration
    if duration is None and options.requests_per_level is None:
        duration = DEFAULT_DURATION_S
    return {
        "rate": options.rate,
        "arrivals": options.arrivals,
        "duration_s": duration,
        "requests_per_level": options.requests_per_level,
        "max_concurrency": options.max_concurrency,
        "stop_oversaturated": options.stop_oversaturated,
    }


def sweep_of(options: RunOptions) -> Sweep | None:
    """--sweep auto[:N] and the open-loop options its rate levels run with (None without --sweep)."""
    if options.sweep is None:
        return None
    duration = options.duration
    if duration is None and options.requests_per_level is None:
        duration = DEFAULT_DURATION_S
    return Sweep(
        levels=options.sweep,
        arrivals=options.arrivals,
        duration_s=duration,
        requests_per_level=options.requests_per_level,
        max_concurrency=options.max_concurrency,
    )


def blocks_of(options: RunOptions) -> int:
    return options.blocks if isinstance(options.blocks, int) else 1


def time_limit_warning(work: Plan, host_spec: str, inventory: str | None) -> str | None:
    """A Slurm host whose time limit the plan will outlast: said before asking Slurm, not found out mid-run."""
    try:
        config = lookup(host_spec, inventory)[0]
    except OrchError:
        return None  # opening the host says what is wrong, in its place
    if not isinstance(config, HostConfig) or not config.capabilities.allocates_nodes:
        return None
    if work.seconds <= config.time_limit_min * 60:
        return None
    where = (
        f"time_limit_min of {config.name} in {config.source}"
        if config.source
        else "the default; set time_limit_min in an inventory entry with `scheduler: slurm`"
    )
    after = (
        "launches that finished are kept, and `orch ab --resume ID` continues in a new allocation"
        if work.launches > 1
        else "the launch it cuts short is stored but left out of the statistics, so there would be no result: raise "
        "the time limit, or lower --runs"
    )
    return (
        f"the plan takes {work.time_text()}, longer than the "
        f"{config.time_limit_min} min time limit orch asks Slurm for ({where}): Slurm will end the allocation "
        f"part-way; {after}"
    )


def check_host_nodes(
    profiles: Sequence[profiles_mod.Profile], host_spec: str, inventory: str | None, *, port: int | None = None
) -> None:
    """A multi-node profile on a --host with too few nodes, or a --port that clashes there (ports.clash), refused
    from the inventory alone (no connection), before the plan and the header lines make it look as if the run had
    started; run_ab checks both again on the open host."""
    try:
        target = lookup(host_spec, inventory)[0]
    except OrchError:
        return  # opening the host says what is wrong with the inventory or the spec, in its place
    ports.check(port, list(profiles), target)
    if isinstance(target, HostGroup):
        experiment_host.check_nodes_for(list(profiles), len(target.nodes), host_spec)
    else:
        experiment_host.check_nodes_for(list(profiles), 1, target.name, allocates=target.capabilities.allocates_nodes)


def resume_experiment(store: Store, ref: str, options: RunOptions, rep: PlainReporter) -> model.ABResult:
    """--resume: the stored experiment's own profiles, workload and design, on its host (resume.py: what may
    change); run_ab checks again, under the host lock, that it can be resumed.

    A `--sweep auto` resumes whole, by either of its ids: its probe finished if it was cut short, then its rate
    levels (their experiment continued if it was started, else started with the rates the probe found)."""
    exp = store.find_experiment(ref)
    resume.check_not_running(exp)  # before a host is reached (a Slurm allocation); again under the host lock
    resume.refuse_fixed(exp, options)
    stored = json.loads(exp["config_json"])
    levels = sweep.levels_of(store, exp["id"]) if stored.get("sweep_probe") else None
    if levels is not None:
        rep.line(f"sweep: {exp['id']} is the probe of this sweep; its rate levels are experiment {levels}: resuming it")
        return resume_experiment(store, levels, options, rep)
    arms = json.loads(exp["arms_json"])
    if options.profiles:
        profiles = [profiles_mod.load(n) for n in options.profiles]
        resume.check_arms(exp["id"], arms, profiles)
    else:
        # Where each arm's profile was loaded from, if that file is still there (profiles given by path included).
        sources = stored.get("profile_sources") or [None] * len(arms)
        profiles = [
            profiles_mod.load(src if src and Path(src).is_file() else name)
            for name, src in zip(arms, sources, strict=True)
        ]
    # An arm attached with --attach stays attached to the same server (run_ab checks every profile is unchanged).
    resolved = stored.get("profiles") or [{}] * len(profiles)
    profiles = [attach.with_url(p, d.get("attach")) for p, d in zip(profiles, resolved, strict=True)]
    options = options.replace(host_spec=resume.resumed_host(exp, stored, options))
    options = options.replace(port=resume.resumed_port(exp, stored, options))
    check_host_nodes(profiles, options.host_spec, options.inventory, port=options.port)
    bench = resume.resumed_bench(design.bench_config_from(stored["bench"]), options)
    # A stored experiment meets the limits a new one does (its row may come from an import, or an older orch).
    limits.checked_plan(bench, profiles, blocks=stored_blocks(exp), sim=bool(exp["simulated"]), names={})
    check_requests(bench)
    options = resume.resumed_options(exp, stored, options)
    if stored.get("sweep_probe"):
        options, asked = resume.resumed_sweep(exp, stored, options)
        return execute(store, profiles, asked, options, rep, None, probe=exp["id"])
    return execute(store, profiles, bench, options, rep, exp["id"])


def stored_blocks(exp: dict[str, Any]) -> int:
    """The most blocks a stored experiment's design may run (with --blocks auto: its maximum)."""
    if not exp.get("design_json"):
        return 1
    design = model.Design.from_dict(json.loads(exp["design_json"]))
    return design.auto.max_blocks if design.auto is not None else design.blocks


def ab_config(options: RunOptions, bench: BenchConfig) -> ABConfig:
    return ABConfig(
        bench=bench,
        simulate=options.sim,
        namespace=default_namespace(),
        ready_timeout_s=options.ready_timeout,
        grace_s=options.grace,
        strict_env=options.strict_env,
        force=options.force,
        lock_wait_s=options.lock_wait,
        gpu_wait_s=options.gpu_wait,
        target_tps=options.target_tps,
        blocks=blocks_of(options),
        auto=options.sequential_plan() if options.max_blocks is not None else None,
        order=options.order,
        order_seed=options.order_seed,
        min_effect=options.min_effect,
        allow_mixed=options.allow_mixed,
        allow_node_mismatch=options.allow_node_mismatch,
        port=options.port,
        slo=options.slo,
        metric=options.metric,
        cache_measured=options.cache_measured,
    )


def make_reporter(out: TextIO, *, quiet: bool = False, verbose: bool = False) -> PlainReporter:
    """The live view on a terminal (unless -q), timestamped plain lines anywhere else."""
    if is_terminal(out):
        from orchestrator.ui.live import LiveReporter

        return LiveReporter(out, quiet=quiet, verbose=verbose)
    return PlainReporter(out, quiet=quiet, verbose=verbose)


def reporter_for(options: RunOptions) -> PlainReporter:
    """The command's one progress reporter: stderr under --json (stdout holds only the document); live on a
    terminal, timestamped lines elsewhere; -q and -v as given."""
    options.check_verbosity()
    out = sys.stderr if options.as_json else sys.stdout
    return make_reporter(out, quiet=options.quiet, verbose=options.verbose)


def progress(rep: PlainReporter, bench: BenchConfig) -> tuple[Callable[[str], None], Callable[[str, RunResult], None]]:
    """How an event and a finished run of this workload are printed."""

    def on_run(name: str, run: RunResult) -> None:
        rep.bench = bench
        rep.run(name, run)

    return rep.line, on_run


def host_for(options: RunOptions, host_spec: str, events: Events | None = None, nodes: int = 1) -> Host:
    """The host (or group) `host_spec` names, opened with the options' workdir, inventory and host-key policy."""
    return resolve_host(
        host_spec,
        workdir=options.workdir,
        inventory=options.inventory,
        accept_new_host_key=options.accept_new_host_key,
        events=events,
        nodes=nodes,
    )


def execute(
    store: Store,
    profiles: list[profiles_mod.Profile],
    bench: BenchConfig,
    options: RunOptions,
    rep: PlainReporter,
    resume_id: str | None,
    probe: str | None = None,
) -> model.ABResult:
    """Run (or, `resume_id`, continue) the experiment; a sweep's probe first (`probe`: the one to finish or read
    back, for a sweep resumed from it), then its rate levels."""
    config = ab_config(options, bench)
    event, on_run = progress(rep, bench)
    with rep:  # the live view, from here to the report
        if options.sim:
            event(SIM_BANNER)
        event(f"results database: {store.path}")
        with host_for(options, options.host_spec, rep, nodes=experiment_host.nodes_needed(profiles)) as host:
            where: dict[str, Any] = {
                "host_spec": options.host_spec,
                "workdir": options.workdir,
                "namespace": config.namespace,
            }
            spec = sweep_of(options) if resume_id is None else None
            if spec is not None:
                _, on_probe_run = progress(rep, spec.probe_bench(bench))  # its runs are counted as the probe's
                found = sweep.probe(
                    host, profiles, config, spec, store, events=rep, on_run=on_probe_run, provenance=where, resume=probe
                )
                with sweep.resumable_from(store, found.experiment, rep):
                    rep.line(sweep.found_line(found))
                    config = dataclasses.replace(config, bench=spec.swept_bench(config.bench, found.rates))
                    _, on_run = progress(rep, config.bench)
                    blocks = config.auto.max_blocks if config.auto else config.blocks
                    try:
                        limits.checked_plan(config.bench, profiles, blocks=blocks, sim=options.sim, show=rep.line)
                    except limits.PlanError as e:
                        raise OptionError(f"the rates the probe found cannot be swept: {e}") from None
                    where["sweep"] = found.to_dict()
                    return ab.run_ab(host, profiles, config, store, events=rep, on_run=on_run, provenance=where)
            return ab.run_ab(
                host, profiles, config, store, events=rep, on_run=on_run, resume=resume_id, provenance=where
            )

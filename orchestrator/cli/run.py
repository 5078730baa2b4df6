"""`orch ab` and `orch bench` (and `--resume`): start an experiment from options, or continue a stored one."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import click

from orchestrator import ab, attach, engines, experiment_host, failon, planlimits, ports, results
from orchestrator import profile as profiles_mod
from orchestrator.ab import ABConfig
from orchestrator.bench import BenchConfig, Plan, RunResult, request_items
from orchestrator.cli.complete import profile_names
from orchestrator.cli.jsonout import RunCommand
from orchestrator.cli.options import (
    MEASUREMENT_OPTIONS,
    bench_options,
    fixed_bench_options,
    open_existing,
    option_given,
    verbosity_options,
)
from orchestrator.errors import InputError, OrchError
from orchestrator.hosts import resolve_host
from orchestrator.hosts.base import Host, HostConfig, default_namespace
from orchestrator.hosts.inventory import HostGroup, lookup
from orchestrator.progress import PlainReporter, is_terminal
from orchestrator.report import SIM_BANNER, ab_json, ab_text, attached_banner, comparison_line
from orchestrator.stats_seq import SequentialPlan
from orchestrator.store import Store


def run_experiment(
    profile_names: tuple[str, ...],
    resume: str | None = None,
    *,
    fail_on: tuple[str, ...] = (),
    expect: profiles_mod.Expect | None = None,
    **kw: Any,
) -> None:
    rep = reporter_for(kw)
    store = Store(kw["db"]) if resume is None else open_existing(kw["db"])
    try:
        result = (
            resume_experiment(store, resume, profile_names, kw)
            if resume is not None
            else start(store, profile_names, kw)
        )
    finally:
        store.close()
    decision = failon.fail_on_verdict(result, fail_on, expect=expect) if fail_on else None
    print_result(result, kw["as_json"], decision, rep)
    if decision is not None:
        raise SystemExit(decision.exit_code)


def print_result(
    result: results.ABResult,
    as_json: bool,
    decision: failon.FailOn | None = None,
    rep: PlainReporter | None = None,
) -> None:
    """The report (-q: the verdict alone); under it, with --fail-on, the decision (one JSON document under --json,
    its key "fail_on"). On a terminal verdicts and warnings are coloured."""
    if as_json:
        doc = ab_json(result) | ({"fail_on": decision.to_dict()} if decision is not None else {})
        click.echo(json.dumps(doc, indent=2))
        return
    quiet = rep is not None and rep.quiet
    text = "\n".join(verdict_lines(result)) if quiet else ab_text(result)
    if decision is not None:
        text += ("\n" if quiet else "\n\n") + "\n".join(decision.lines())
    if rep is None:
        click.echo(text)
    else:
        rep.report(text)


def verdict_lines(result: results.ABResult) -> list[str]:
    """-q: what was concluded, and what a reader must know before trusting it (a simulator, warnings)."""
    lines = [SIM_BANNER] if result.simulated else []
    lines += attached_banner(result)
    for level in result.levels or [1]:
        if len(result.arms) > 1:
            lines += [comparison_line(c) for c in result.comparisons_at(level)]
            continue
        arm = result.arms[0]
        spread = arm.spread_at(level)
        if spread is None:
            lines.append(f"{arm.label} @ {level}: no valid timed run")
            continue
        lines.append(
            f"{arm.label} @ {level}: median {spread.median:.1f} tok/s per stream over {len(arm.launches)} launch(es)"
            + (f", CV across launches {spread.cv_across * 100:.2f}%" if spread.cv_across is not None else "")
        )
    lines += [f"WARNING: {w}" for w in result.warnings()]
    return lines


def parse_fail_on(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return failon.parse_modes(value)
    except InputError as e:
        raise click.BadParameter(str(e)) from None


# --fail-on as each command judges it: orch ab against the first arm (and it has --resume), orch bench against the
# profile's expect.tok_s.
FAIL_ON_HELP = {
    "ab": "Set the exit code from the verdict: 3 if MODE fails, 4 if that is undecided (inconclusive, or one block: "
    "no CI), else 0. Modes: slower (an arm slower than the first, at any concurrency level), different (slower or "
    "faster), env (workers without their profile's env, or launches of one arm whose fingerprints differ in engine, "
    "GPUs, env or profile). Repeatable or comma-separated (slower,env); allowed with --resume.",
    "bench": "Set the exit code from the result: 3 if MODE fails, 4 if that cannot be told, else 0. Modes: slower "
    "(single-stream tok/s below the profile's expect.tok_s beyond 3%; refused before launching without it), "
    "different (beyond 3% either way), env (workers without their profile's env, or launches whose fingerprints "
    "differ in engine, GPUs, env or profile). Repeatable or comma-separated (slower,env).",
}


def fail_on_option(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--fail-on", "fail_on", multiple=True, metavar="MODE", callback=parse_fail_on, help=FAIL_ON_HELP[command]
    )


def start(store: Store, profile_names: tuple[str, ...], kw: dict[str, Any]) -> results.ABResult:
    profiles = [profiles_mod.load(n) for n in profile_names]
    profiles_mod.check_distinct_names(profiles)
    given = kw.get("attach") or ()
    profiles = attach.apply_options(profiles, (given,) if isinstance(given, str) else given, profile_names)
    attach.check_arms(
        profiles, allow_mixed=kw.get("allow_mixed", False), strict_env=kw["strict_env"], simulate=kw["sim"]
    )
    check_host_nodes(profiles, kw["host_spec"], kw["inventory"], port=kw.get("port"))
    bench = BenchConfig(
        runs=kw["runs"],
        warmup=kw["warmup"],
        max_tokens=kw["max_tokens"],
        seed=kw["seed"],
        concurrency=kw["concurrency"],
        requests_per_stream=kw["requests_per_stream"],
        endpoint=kw["endpoint"] or engines.common_endpoint([p.engine for p in profiles]),
        prompts=kw["prompt_source"],
        input_len=kw["input_len"],
        client=kw["client_place"],
        min_run_s=kw["min_run_s"],
        stall_timeout_s=kw["stall_timeout"],
        first_token_timeout_s=kw["first_token_timeout"],
    )
    engines.check_use(profiles, bench.endpoint, simulate=kw["sim"])
    # The plan is arithmetic on the options: an absurd one is refused before the request sequence is built.
    auto = sequential_plan(kw)
    try:
        work = planlimits.checked_plan(
            bench,
            profiles,
            blocks=auto.max_blocks if auto else kw["blocks"],
            sim=kw["sim"],
            least_blocks=auto.min_blocks if auto else None,
            show=reporter_for(kw).event,
        )
    except planlimits.PlanError as e:
        raise click.UsageError(str(e)) from None
    short = work.too_short()
    if short:
        click.echo(f"WARNING: {short}", err=True)
    over = time_limit_warning(work, kw["host_spec"], kw["inventory"])
    if over:
        click.echo(f"WARNING: {over}", err=True)
    request_items(bench)  # bad prompt files or options fail here, before any server starts
    return execute(store, profiles, bench, kw["sim"], kw["strict_env"], kw["host_spec"], kw, None)


def time_limit_warning(work: Plan, host_spec: str, inventory: str | None) -> str | None:
    """A Slurm host whose time limit the plan will outlast: said before asking Slurm, not found out mid-run."""
    try:
        config = lookup(host_spec, inventory)[0]
    except OrchError:
        return None  # opening the host says what is wrong, in its place
    if not isinstance(config, HostConfig) or config.scheduler != "slurm" or work.seconds <= config.time_limit_min * 60:
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
    profiles: list[profiles_mod.Profile], host_spec: str, inventory: str | None, *, port: int | None = None
) -> None:
    """A multi-node profile on a --host with too few nodes, or a --port that clashes there (ports.clash), refused
    from the inventory alone (no connection), before the plan and the header lines make it look as if the run had
    started; run_ab checks both again on the open host."""
    try:
        target = lookup(host_spec, inventory)[0]
    except OrchError:
        return  # opening the host says what is wrong with the inventory or the spec, in its place
    ports.check(port, profiles, target)
    if isinstance(target, HostGroup):
        experiment_host.check_nodes_for(profiles, len(target.nodes), host_spec)
    else:
        experiment_host.check_nodes_for(profiles, 1, target.name, is_slurm=target.scheduler == "slurm")


def same_slurm_partition(before: str, after: str, inventory: str | None) -> bool:
    """Both --host values are Slurm hosts of one partition (so a resume may move from one to the other)."""
    try:
        a, b = lookup(before, inventory)[0], lookup(after, inventory)[0]
    except OrchError:
        return False
    slurm = [t for t in (a, b) if isinstance(t, HostConfig) and t.scheduler == "slurm"]
    return len(slurm) == 2 and slurm[0].partition == slurm[1].partition


def sequential_plan(kw: dict[str, Any]) -> SequentialPlan | None:
    """--blocks auto's plan, or None for a fixed number of blocks (where --max-blocks has no meaning)."""
    if kw["blocks"] != "auto":
        if option_given("max_blocks"):
            raise click.UsageError(f"--max-blocks applies to --blocks auto, not to --blocks {kw['blocks']}")
        return None
    return SequentialPlan(max_blocks=kw["max_blocks"])


def resume_experiment(store: Store, ref: str, profile_names: tuple[str, ...], kw: dict[str, Any]) -> results.ABResult:
    exp = store.find_experiment(ref)
    passed = [name for name in MEASUREMENT_OPTIONS if option_given(name) and not (name == "sim" and exp["simulated"])]
    if passed:
        flag = {p.name: p.opts[0] for p in click.get_current_context().command.params}
        flags = ", ".join(flag[n] for n in passed)
        raise click.UsageError(
            f"--resume continues experiment {exp['id']} with its own settings; drop {flags} (or start a new experiment)"
        )
    stored = json.loads(exp["config_json"])
    arms = json.loads(exp["arms_json"])
    if profile_names:
        profiles = [profiles_mod.load(n) for n in profile_names]
        if [p.name for p in profiles] != arms:
            raise click.UsageError(
                f"experiment {exp['id']} compares {' '.join(arms)}; give no profiles with --resume (or exactly those)"
            )
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
    kw["allow_mixed"] = bool(stored.get("allow_mixed"))
    host_spec = stored.get("host_spec", exp["host"])
    if option_given("host_spec") and kw["host_spec"] != host_spec:
        if not same_slurm_partition(host_spec, kw["host_spec"], kw["inventory"]):
            raise click.UsageError(
                f"experiment {exp['id']} ran on {host_spec!r}; it must be resumed there, not on {kw['host_spec']!r} "
                "(a Slurm experiment may resume on another Slurm host of the same partition, e.g. an inventory "
                "entry with a longer time_limit_min)"
            )
        host_spec = kw["host_spec"]  # a new allocation lands on whatever nodes Slurm gives: the partition is the host
    # The port the experiment was given stays its port, unless this session gives another (a port moves no number).
    if not option_given("port"):
        kw["port"] = ports.recorded(stored, f"experiment {exp['id']}")
    check_host_nodes(profiles, host_spec, kw["inventory"], port=kw["port"])
    bench = ab.bench_config_from(stored["bench"])
    # How long to wait for a hung server is not part of what is measured: a resume may change it.
    for option, name in (("stall_timeout", "stall_timeout_s"), ("first_token_timeout", "first_token_timeout_s")):
        if option_given(option):
            bench = dataclasses.replace(bench, **{name: kw[option]})
    # A stored experiment meets the limits a new one does (its row may come from an import, or an older orch).
    planlimits.checked_plan(bench, profiles, blocks=stored_blocks(exp), sim=bool(exp["simulated"]))
    request_items(bench)  # run_ab checks the experiment can be resumed, under the host lock
    if option_given("workdir") and stored.get("workdir") and kw["workdir"] != stored["workdir"]:
        # Its logs (and the launches' log paths stored with the experiment) live in the workdir.
        raise click.UsageError(f"experiment {exp['id']} used --workdir {stored['workdir']}; resume it with that one")
    if stored.get("workdir"):
        kw["workdir"] = stored["workdir"]
    if not option_given("min_effect") and "min_effect" in stored:
        kw["min_effect"] = float(stored["min_effect"])
    if not option_given("target_tps") and stored.get("target_tps") is not None:
        kw["target_tps"] = float(stored["target_tps"])
    return execute(
        store, profiles, bench, bool(exp["simulated"]), bool(stored.get("strict_env")), host_spec, kw, exp["id"]
    )


def stored_blocks(exp: dict[str, Any]) -> int:
    """The most blocks a stored experiment's design may run (with --blocks auto: its maximum)."""
    if not exp.get("design_json"):
        return 1
    design = results.Design.from_dict(json.loads(exp["design_json"]))
    return design.auto.max_blocks if design.auto is not None else design.blocks


def ab_config(kw: dict[str, Any], bench: BenchConfig, sim: bool, strict_env: bool) -> ABConfig:
    return ABConfig(
        bench=bench,
        simulate=sim,
        namespace=default_namespace(),
        ready_timeout_s=kw["ready_timeout"],
        grace_s=kw["grace"],
        strict_env=strict_env,
        force=kw["force"],
        lock_wait_s=kw["lock_wait"],
        gpu_wait_s=kw["gpu_wait"],
        target_tps=kw["target_tps"],
        blocks=kw["blocks"] if isinstance(kw["blocks"], int) else 1,
        auto=sequential_plan(kw) if kw.get("max_blocks") is not None else None,
        order=kw["order"],
        order_seed=kw["order_seed"],
        min_effect=kw["min_effect"],
        allow_mixed=kw.get("allow_mixed", False),
        allow_node_mismatch=kw.get("allow_node_mismatch", False),
        port=kw.get("port"),
    )


def make_reporter(out: TextIO, *, quiet: bool = False, verbose: bool = False) -> PlainReporter:
    """The live view on a terminal (unless -q), timestamped plain lines anywhere else."""
    if is_terminal(out):
        from orchestrator.progress_live import LiveReporter  # rich is imported only for a terminal

        return LiveReporter(out, quiet=quiet, verbose=verbose)
    return PlainReporter(out, quiet=quiet, verbose=verbose)


def reporter_for(kw: dict[str, Any]) -> PlainReporter:
    """The command's one progress reporter: stderr under --json (stdout holds only the document); live on a
    terminal, timestamped lines elsewhere; -q and -v as given."""
    if "_reporter" not in kw:
        if kw.get("quiet") and kw.get("verbose"):
            raise click.UsageError("-q (verdict only) and -v (every request) exclude each other")
        out = sys.stderr if kw["as_json"] else sys.stdout
        kw["_reporter"] = make_reporter(out, quiet=bool(kw.get("quiet")), verbose=bool(kw.get("verbose")))
    rep: PlainReporter = kw["_reporter"]
    return rep


def progress(kw: dict[str, Any]) -> tuple[Callable[[str], None], Callable[[str, RunResult], None]]:
    """How an event and a finished run are printed (the runs once kw["_bench"] is known)."""
    rep = reporter_for(kw)

    def on_run(name: str, run: RunResult) -> None:
        rep.bench = kw["_bench"]
        rep.run(name, run)

    return rep.event, on_run


def open_host(
    kw: dict[str, Any], host_spec: str, on_event: Callable[[str], None] | None = None, nodes: int = 1
) -> Host:
    return resolve_host(
        host_spec,
        workdir=kw["workdir"],
        inventory=kw["inventory"],
        accept_new_host_key=kw["accept_new_host_key"],
        on_event=on_event,
        nodes=nodes,
    )


def execute(
    store: Store,
    profiles: list[profiles_mod.Profile],
    bench: BenchConfig,
    sim: bool,
    strict_env: bool,
    host_spec: str,
    kw: dict[str, Any],
    resume: str | None,
    provenance: dict[str, Any] | None = None,
) -> results.ABResult:
    config = ab_config(kw, bench, sim, strict_env)
    kw["_bench"] = bench
    event, on_run = progress(kw)
    with reporter_for(kw):  # the live view, from here to the report
        if sim:
            event(SIM_BANNER)
        event(f"results database: {store.path}")
        with open_host(kw, host_spec, event, nodes=experiment_host.nodes_needed(profiles)) as host:
            where = {
                "host_spec": host_spec,
                "workdir": kw["workdir"],
                "namespace": config.namespace,
                **(provenance or {}),
            }
            return ab.run_ab(
                host, profiles, config, store, on_event=event, on_run=on_run, resume=resume, provenance=where
            )


@click.command("ab", cls=RunCommand)
@click.argument("profiles", nargs=-1, shell_complete=profile_names)
@click.option(
    "--resume",
    metavar="ID",
    default=None,
    help="Continue an interrupted or failed experiment (id, unique prefix, or 'last') with its own seed, order "
    "and settings; its completed launches stand.",
)
@click.option(
    "--attach",
    "attach",
    multiple=True,
    metavar="ARM=URL",
    help="Measure ARM (a profile given here) on a server someone else runs at http://HOST:PORT (reached from "
    "--host's side): no launch, no port check, no env read-back, no teardown; one GET of its health endpoint must "
    "answer 200. Its state is not fresh and its env not verified, and every report says so. Repeatable.",
)
@click.option(
    "--allow-mixed",
    is_flag=True,
    help="Compare attached arms with launched ones (refused otherwise); every report then carries a WARNING.",
)
@bench_options
@fail_on_option("ab")
@verbosity_options
def ab_cmd(profiles: tuple[str, ...], resume: str | None, **kw: Any) -> None:
    """Compare PROFILES (the first is the baseline), each launch from fresh, verified state.

    Each block launches every arm once, in a recorded order; each arm gets a confidence interval against the
    baseline and a verdict: faster, slower, no difference or inconclusive. --blocks auto (the default) runs 3
    blocks, then adds one at a time until every verdict is decided or --max-blocks is reached, with
    group-sequential CIs that stay honest however often it looks; --blocks N runs exactly N (95% CIs). With
    --fail-on the verdict decides the exit code (3 fail, 4 inconclusive, 0 ok).

    An arm attached to a running server (--attach ARM=URL, or `attach: URL` in its profile) is not launched: each
    block is another benchmark session on that server.

    Example: orch ab baseline eagle3-3step --sim   |   orch ab baseline eagle3-3step --host gpu-box --blocks 5
    """
    if resume is None and len(profiles) < 2:
        raise click.UsageError("an A/B needs at least two profiles (use `orch bench` for one)")
    run_experiment(profiles, resume, **kw)


@click.command("bench", cls=RunCommand)
@click.argument("profile", shell_complete=profile_names)
@click.option(
    "--attach",
    "attach",
    default=None,
    metavar="URL",
    help="Measure a server someone else runs at http://HOST:PORT (reached from --host's side) instead of "
    "launching one: no port check, no env read-back, no teardown; one GET of its health endpoint must answer 200. "
    "Its state is not fresh and its env not verified, and every report says so.",
)
@fixed_bench_options
@fail_on_option("bench")
@verbosity_options
def bench_cmd(profile: str, **kw: Any) -> None:
    """Benchmark one profile from a fresh, verified launch (--blocks N: N launches, with the spread across them).

    With --attach URL (or `attach: URL` in the profile) nothing is launched: each block is another benchmark
    session on the running server at URL.

    With --fail-on slower or different the result is judged against the profile's expect.tok_s (single-stream,
    within 3%).
    """
    expect = None
    if kw["fail_on"]:
        # Refused before anything starts: a run whose verdict cannot be decided is a wasted launch.
        prof = profiles_mod.load(profile)
        expect = prof.expect
        refusal = failon.single_profile_refusal(prof.name, expect, kw["fail_on"], kw["concurrency"])
        if refusal:
            raise click.UsageError(refusal)
    run_experiment((profile,), None, expect=expect, **kw)

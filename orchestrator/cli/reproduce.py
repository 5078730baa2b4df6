"""`orch reproduce` (a bundle, or a profile's claim) and `orch compare`: did it reproduce, and why not."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, cast

import click

from orchestrator import yamlfile
from orchestrator.cli.base import FiniteFloat
from orchestrator.cli.jsonout import RunCommand
from orchestrator.cli.options import db_option, fixed_bench_options, parse_tolerance, run_options
from orchestrator.cli.run import usage_errors
from orchestrator.cli.stored import stored_result
from orchestrator.config import profile as profiles_mod
from orchestrator.config.options import RunOptions
from orchestrator.errors import InputError
from orchestrator.experiment import reproduce as reproduce_mod
from orchestrator.experiment import resume
from orchestrator.experiment import run as experiment
from orchestrator.launch import ports
from orchestrator.report.compare import claim_json, claim_text, compare_json, compare_markdown, compare_text
from orchestrator.report.experiment import SIM_BANNER, ab_json, ab_text
from orchestrator.results import bundle as bundle_mod
from orchestrator.results.compare import claim_verdict
from orchestrator.results.model import ABResult
from orchestrator.results.store import Store
from orchestrator.ui.events import Lines

CLAIM_BLOCKS = 3  # a verdict needs the launch-to-launch spread: one launch per arm cannot give one


def blocks_by_target(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--blocks has no one default here (a bundle's own number, or 3 for a claim), so the shared option's
    "[default: 1]" (true of `orch bench`) is replaced by the rule, and "not given" stays None to be told apart."""
    params = cast(Any, fn).__click_params__
    at = next(i for i, p in enumerate(params) if p.name == "blocks")
    params[at] = click.Option(
        ["--blocks"],
        type=click.IntRange(1, 1000),
        default=None,
        help="Launches per arm: each block launches every arm once [default: a BUNDLE's own number of blocks (1 "
        f"for a bundle from before designs); a PROFILE's claim {CLAIM_BLOCKS}].",
    )
    return fn


@click.command("reproduce", cls=RunCommand)
@click.argument("target", metavar="BUNDLE|PROFILE")
@click.option("--claim", "claim_tps", type=FiniteFloat(min=0, max=1e7, min_open=True), default=None,
              help="The claimed single-stream tok/s of the profile [default: its expect.tok_s].")  # fmt: skip
@click.option("--claim-ratio", type=FiniteFloat(min=0, max=1e3, min_open=True), default=None,
              help="The claimed ratio against --vs [default: its expect.ratio].")  # fmt: skip
@click.option("--vs", "vs_name", default=None, metavar="PROFILE",
              help="The baseline run beside it [default: expect.vs, else a profile named 'baseline'].")  # fmt: skip
@click.option("--tolerance", default="3%", show_default=True, callback=parse_tolerance,
              help="How far a value may be from the recorded one and still count as reproduced.")  # fmt: skip
@blocks_by_target
@fixed_bench_options
def reproduce_cmd(
    target: str, claim_tps: float | None, claim_ratio: float | None, vs_name: str | None, tolerance: float, **_: Any
) -> None:
    """Re-run a colleague's result from fresh state and judge it: REPRODUCED (exit 0), NOT REPRODUCED (exit 3, with
    the fingerprint differences most likely to explain it) or INCONCLUSIVE (exit 4, with how many blocks would
    decide).

    BUNDLE (`orch export ID --format bundle`): the same design, workload, order and seed again, in the bundle's own
    number of blocks unless --blocks says otherwise; every arm's tok/s and every ratio is judged against the recorded
    one.

    PROFILE (a name or a file): its claim comes from --claim/--claim-ratio or its expect: block; it runs with its
    baseline beside it (3 blocks unless --blocks says otherwise).

    Examples: orch reproduce result.orch.json --host gpu-box   |   orch reproduce eagle3-3step --sim --claim 94
    """
    options = run_options(click.get_current_context(), "reproduce")
    if yamlfile.is_file(Path(target)) and Path(target).suffix not in (".yaml", ".yml"):
        if claim_tps is not None or claim_ratio is not None or vs_name is not None:
            raise click.UsageError("--claim, --claim-ratio and --vs judge a profile's claim, not a result bundle")
        _reproduce_bundle(target, tolerance, options)
    _reproduce_claim(target, claim_tps, claim_ratio, vs_name, tolerance, options)


def _reproduce_bundle(path: str, tolerance: float, options: RunOptions) -> NoReturn:
    bundle = bundle_mod.read_bundle(path)
    simulated = bool(bundle["content"]["experiment"]["simulated"])
    passed = resume.fixed_given(options, simulated, but=("blocks",))
    if passed:
        raise click.UsageError(
            f"a bundle is re-run with its own settings; drop {', '.join(passed)} "
            "(--blocks may change the number of blocks)"
        )
    # Before any header line: a multi-node bundle on a --host with too few nodes is refused from the inventory alone,
    # and a plan over the limits from its numbers alone.
    profiles = bundle_mod.profiles_from_bundle(bundle)
    blocks = options.blocks if isinstance(options.blocks, int) else None  # None: the bundle's own
    reproduce_mod.check_plan(bundle, profiles, blocks, path)
    if not options.gave("port"):  # the port the experiment was given, unless this run gives another
        options = options.replace(port=ports.recorded(bundle["content"]["config"], f"{path}: content.config"))
    try:
        experiment.check_host_nodes(profiles, options.host_spec, options.inventory, port=options.port)
    except InputError as e:
        measured = bundle["content"]["experiment"].get("host")
        raise InputError(f"{e} (the bundle was measured on {measured!r})" if measured else str(e)) from None
    store = Store(options.db)
    try:
        rep = experiment.reporter_for(options)
        bench = bundle_mod.bench_config(bundle["content"]["config"])
        event, on_run = experiment.progress(rep, bench)
        if simulated:
            event(SIM_BANNER)
        event(f"reproducing {bundle['content']['experiment']['id']} from {path}; results database: {store.path}")
        # A Slurm host asks for as many nodes as the bundle's largest multi-node profile spans.
        nodes = max((int(p.get("nnodes") or 1) for p in bundle["content"]["profiles"]), default=1)
        with experiment.host_for(options, options.host_spec, nodes=nodes) as host:
            base = experiment.ab_config(options.replace(sim=simulated, strict_env=False), bench)
            new, verdict = reproduce_mod.reproduce_bundle(
                host,
                bundle,
                store,
                base,
                workdir=store.path.parent / "reproduce",
                tolerance=tolerance,
                blocks=blocks,
                source=path,
                events=Lines(event),  # this reporter is not entered (no live view): phases reach no one
                on_run=on_run,
            )
    finally:
        store.close()
    try:
        report = compare_json(verdict), compare_text(verdict)
    except Exception as e:  # the measurement is stored: a failure rendering its verdict must not hide where it is
        raise reproduce_mod.JudgingFailed(new.experiment_id, path, e) from e
    verdict_out(new, "reproduction", *report, options.as_json)
    raise SystemExit(verdict.exit_code)


def _reproduce_claim(
    target: str,
    claim_tps: float | None,
    claim_ratio: float | None,
    vs_name: str | None,
    tolerance: float,
    options: RunOptions,
) -> NoReturn:
    prof = profiles_mod.load(target)
    expect = prof.expect
    claimed_tps = claim_tps if claim_tps is not None else (expect.tok_s if expect else None)
    claimed_ratio = claim_ratio if claim_ratio is not None else (expect.ratio if expect else None)
    if claimed_tps is None and claimed_ratio is None:
        raise click.UsageError(
            f"nothing to judge in {prof.source}: give --claim TOK_S (and/or --claim-ratio R --vs BASELINE), or add "
            "an expect: block (tok_s, ratio, vs) to the profile"
        )
    vs = vs_name or (expect.vs if expect else None)
    if vs is None and prof.name != "baseline" and "baseline" in profiles_mod.available():
        vs = "baseline"
    if claimed_ratio is not None and vs is None:
        raise click.UsageError("a claimed ratio needs a baseline: give --vs PROFILE (or expect.vs in the profile)")
    options = options.replace(
        profiles=(vs, target) if vs else (target,), blocks=CLAIM_BLOCKS if options.blocks is None else options.blocks
    )
    store = Store(options.db)
    try:
        with usage_errors():
            result = experiment.start(store, options, experiment.reporter_for(options), warn=_warn)
    finally:
        store.close()
    verdict = claim_verdict(result, result.arms[-1].label, claimed_tps=claimed_tps, claimed_ratio=claimed_ratio,
                            tolerance=tolerance)  # fmt: skip
    verdict_out(result, "claim", claim_json(verdict), claim_text(verdict), options.as_json)
    raise SystemExit(verdict.exit_code)


def _warn(line: str) -> None:
    click.echo(line, err=True)


def verdict_out(result: ABResult, key: str, doc: dict[str, Any], text: str, as_json: bool) -> None:
    """The new experiment's report, then the verdict under it (or both in one JSON document under `key`)."""
    if as_json:
        click.echo(json.dumps({**ab_json(result), key: doc}, indent=2))
    else:
        click.echo(ab_text(result))
        click.echo("")
        click.echo(text)


def parse_arm_map(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """--map B_ARM=A_ARM, repeatable: which arm of B is which arm of A; an arm of B given twice is refused."""
    out: dict[str, str] = {}
    for value in values:
        new, sep, old = value.partition("=")
        if not sep or not new.strip() or not old.strip():
            raise click.BadParameter(f"{value!r}: expected B_ARM=A_ARM (an arm of B, '=', an arm of A)")
        if new.strip() in out:
            raise click.BadParameter(f"{value!r}: B's arm {new.strip()!r} is already mapped to {out[new.strip()]!r}")
        out[new.strip()] = old.strip()
    return out


@click.command("compare")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@db_option
@click.option("--tolerance", default="3%", show_default=True, callback=parse_tolerance,
              help="How far B may be from A and still count as the same.")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["text", "json", "md"]), default="text", show_default=True,
              help="text for a terminal, json for scripts, md (Markdown) for an issue or a pull request.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--map", "arm_map", multiple=True, metavar="B_ARM=A_ARM", callback=parse_arm_map,
              help="Judge B's arm B_ARM against A's arm A_ARM (arms of other names); repeatable. Arms not named "
              "here are paired by name.")  # fmt: skip
def compare_cmd(
    a: str, b: str, db: str | None, tolerance: float, fmt: str, as_json: bool, arm_map: dict[str, str]
) -> None:
    """Two experiments side by side: B judged against A per arm (tok/s, TTFT, ITL, accept length, with CIs) and per
    ratio, and the fingerprint differences most likely to explain a difference, ranked.

    A and B: experiment ids (or unique prefixes, or `last`) or result bundle files. Arms are paired by name; --map
    pairs arms of other names (never by position unasked: when no name matches, the refusal lists both sides'
    arms and the --map line that pairs them in order). Exit 0 when B reproduces A, 3 when it does not, 4 when that
    cannot be told from these launches, 2 when no arm pairs up or --map names an arm that is not there.
    """
    verdict = reproduce_mod.compare_results(stored_result(a, db), stored_result(b, db), tolerance, arm_map)
    fmt = "json" if as_json else fmt
    if fmt == "json":
        click.echo(json.dumps(compare_json(verdict), indent=2))
    elif fmt == "md":
        click.echo(compare_markdown(verdict), nl=False)
    else:
        click.echo(compare_text(verdict))
    raise SystemExit(verdict.exit_code)

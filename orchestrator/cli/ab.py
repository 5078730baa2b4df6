"""`orch ab` and `orch bench` (and `--resume`): start an experiment from options, or continue a stored one."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from orchestrator.cli.complete import profile_names
from orchestrator.cli.jsonout import RunCommand
from orchestrator.cli.options import (
    bench_options,
    cache_measured_option,
    check_outputs_option,
    fixed_bench_options,
    flush_cache_option,
    judgement_options,
    run_options,
    verbosity_options,
)
from orchestrator.config.options import OptionError
from orchestrator.config.slo import DEFAULT_METRIC, METRICS
from orchestrator.errors import InputError
from orchestrator.experiment import failon
from orchestrator.experiment import run as experiment
from orchestrator.report.jsondoc import ab_json
from orchestrator.report.lines import SIM_BANNER, attached_banner, comparison_line
from orchestrator.report.text import ab_text
from orchestrator.results import model
from orchestrator.results.run import Level, level_name
from orchestrator.ui.progress import PlainReporter


@contextmanager
def usage_errors() -> Iterator[None]:
    """The core's refusals of options, shown as click's usage errors (the usage line, exit 2)."""
    try:
        yield
    except OptionError as e:
        raise click.UsageError(str(e)) from None


def run_command(command: str) -> None:
    """Run the current command's experiment from its options, print its report, exit with --fail-on's code."""
    options = run_options(click.get_current_context(), command)
    with usage_errors():
        outcome = experiment.run(options, warn=lambda line: click.echo(line, err=True))
    print_result(outcome.result, options.as_json, outcome.decision, outcome.reporter)
    if outcome.decision is not None:
        raise SystemExit(outcome.decision.exit_code)


def print_result(
    result: model.ABResult,
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


def verdict_lines(result: model.ABResult) -> list[str]:
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
            lines.append(f"{arm.label} @ {level_name(level)}: no valid timed run")
            continue
        lines.append(
            f"{arm.label} @ {level_name(level)}: median {spread.median:.1f} tok/s per stream over "
            f"{len(arm.launches)} launch(es)"
            + (f", CV across launches {spread.cv_across * 100:.2f}%" if spread.cv_across is not None else "")
            + metric_text(arm, level, result.metric)
        )
    lines += [f"WARNING: {w}" for w in result.warnings()]
    return lines


def metric_text(arm: model.ArmResult, level: Level, metric: str) -> str:
    """-q for one arm: its value of --metric too, where that is not tok/s (and goodput under --slo)."""
    shown = [m for m in dict.fromkeys((metric, "goodput" if arm.slo is not None else DEFAULT_METRIC)) if m != "tok_s"]
    parts = []
    for name in shown:
        spec, spread = METRICS[name], arm.spread_at(level, name)
        if spread is not None:
            parts.append(f"{name} {spread.median * spec.scale:.2f} {spec.unit}")
    return f"; {', '.join(parts)}" if parts else ""


def parse_fail_on(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return failon.parse_modes(value)
    except InputError as e:
        raise click.BadParameter(str(e)) from None


# --fail-on as each command judges it: orch ab against the first arm (and it has --resume), orch bench against the
# profile's expect.tok_s.
FAIL_ON_HELP = {
    "ab": "Set the exit code from the verdict: 3 if MODE fails, 4 if that is undecided (inconclusive, or one block: "
    "no CI), else 0. Modes: slower (an arm slower than the first on --metric, at any level), different "
    "(slower or faster), env (workers without their profile's env, or launches of one arm whose fingerprints differ "
    "in engine, GPUs, env or profile), crossover-below=R (an arm's crossover with the first arm lies below load R: "
    "its 95% CI wholly below R fails, straddling R is undecided; needs two or more levels), max-rate-slo-below=R (an "
    "arm's highest load within --slo lies below R, likewise). R is in the levels' unit: req/s for --rate, streams "
    "for --concurrency. Repeatable or comma-separated (slower,env); allowed with --resume.",
    "bench": "Set the exit code from the result: 3 if MODE fails, 4 if that cannot be told, else 0. Modes: slower "
    "(single-stream tok/s below the profile's expect.tok_s beyond 3%; refused before launching without it), "
    "different (beyond 3% either way), env (workers without their profile's env, or launches whose fingerprints "
    "differ in engine, GPUs, env or profile), max-rate-slo-below=R (the highest load within --slo lies below R, "
    "over two or more levels). Repeatable or comma-separated (slower,env).",
}


def fail_on_option(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--fail-on", "fail_on", multiple=True, metavar="MODE", callback=parse_fail_on, help=FAIL_ON_HELP[command]
    )


@click.command("ab", cls=RunCommand)
@click.argument("profiles", nargs=-1, shell_complete=profile_names)
@click.option(
    "--resume",
    metavar="ID",
    default=None,
    help="Continue an interrupted or failed experiment (id, unique prefix, or 'last') with its own seed, order "
    "and settings; its completed launches stand. A --sweep auto resumes whole from its probe's id or its levels': "
    "the probe finished, then the rate levels.",
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
@judgement_options(default_metric=True)
@fail_on_option("ab")
@verbosity_options
@check_outputs_option
@flush_cache_option
@cache_measured_option
def ab_cmd(**_: Any) -> None:
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
    run_command("ab")


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
@judgement_options(default_metric=True)
@fail_on_option("bench")
@verbosity_options
@flush_cache_option
def bench_cmd(**_: Any) -> None:
    """Benchmark one profile from a fresh, verified launch (--blocks N: N launches, with the spread across them).

    With --attach URL (or `attach: URL` in the profile) nothing is launched: each block is another benchmark
    session on the running server at URL.

    With --fail-on slower or different the result is judged against the profile's expect.tok_s (single-stream,
    within 3%).
    """
    run_command("bench")

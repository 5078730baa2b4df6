"""`orch reproduce` (a bundle, or a profile's claim) and `orch compare`: did it reproduce, and why not."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, cast

import click

from orchestrator.cli.ab import usage_errors
from orchestrator.cli.base import FiniteFloat
from orchestrator.cli.jsonout import JsonCommand, RunCommand
from orchestrator.cli.options import db_option, fixed_bench_options, parse_tolerance, run_options
from orchestrator.cli.stored import stored_result
from orchestrator.experiment import reproduce as reproduce_mod
from orchestrator.experiment.trust import Ask, Trust
from orchestrator.report.compare import claim_json, claim_text, compare_json, compare_markdown, compare_text
from orchestrator.report.jsondoc import ab_json
from orchestrator.report.text import ab_text
from orchestrator.results.model import ABResult


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
        f"for a bundle from before designs); a PROFILE's claim {reproduce_mod.CLAIM_BLOCKS}].",
    )
    return fn


# What --prompts/--dataset and --trace mean to `orch reproduce`: for a PROFILE's claim what they mean to `orch ab`; for
# a BUNDLE, a copy of the data it ran on (experiment/reproduce.bundle_data), refused unless it is that data.
DATA_HELP = {
    "prompt_source": "For a BUNDLE: a copy of the dataset its experiment sent, where the bundle does not carry it "
    "(too big, or only its sha256); checked against the recorded sha256 and refused (exit 2), naming both, if it "
    "holds other data. For a PROFILE's claim, as in orch ab: ",
    "trace": "For a BUNDLE: a copy of the trace its experiment replayed, where the bundle does not carry it; checked "
    "against the recorded sha256 and refused (exit 2), naming both, if it is another trace; not for a PROFILE's "
    "claim. In orch ab: ",
}


def data_by_target(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--prompts/--dataset and --trace say what they mean for a BUNDLE before what they mean for `orch ab`."""
    for param in cast(Any, fn).__click_params__:
        if param.name in DATA_HELP:
            param.help = DATA_HELP[param.name] + (param.help or "")
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
@click.option("--trust-bundle", is_flag=True,
              help="Run a BUNDLE that would make this machine run what its own profiles would not (other commands, "
              "env variables, models) without asking. Without it such a bundle is shown and asked about on a "
              "terminal, and refused (exit 2) elsewhere; see docs/reproduce.md#trust.")  # fmt: skip
@click.option("--allowed-signers", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Run a BUNDLE signed (orch export --sign KEY) by a key FILE lists (ssh-keygen's allowed_signers "
              "format) without asking; a signature that does not verify is refused (exit 2), one by a key FILE does "
              "not list is treated as unsigned; a FILE with no signer line in it (or no regular file) is refused "
              "(exit 2), naming its first bad line.")  # fmt: skip
@blocks_by_target
@data_by_target
@fixed_bench_options
def reproduce_cmd(
    target: str, claim_tps: float | None, claim_ratio: float | None, vs_name: str | None, tolerance: float, **_: Any
) -> None:
    """Re-run a colleague's result from fresh state and judge it: REPRODUCED (exit 0), NOT REPRODUCED (exit 3, with
    the fingerprint differences most likely to explain it) or INCONCLUSIVE (exit 4, with how many blocks would
    decide).

    BUNDLE (`orch export ID --format bundle`): the same design, workload, order and seed again, in the bundle's own
    number of blocks unless --blocks says otherwise; every arm's tok/s and every ratio is judged against the recorded
    one. Its data comes from the bundle (a file's prompts, a trace's lines), from orch (builtin, random, a shipped
    dataset of the same sha256), or from a copy given with --prompts/--dataset PATH or --trace PATH; other data is
    refused (exit 2), never reproduced on.

    A BUNDLE whose profiles differ from this machine's own of the same names (its commands, env variables such as
    PYTHONPATH or LD_PRELOAD, models) would run its author's choices here: before anything starts, orch shows what
    differs and asks on a terminal (default no); elsewhere it refuses (exit 2) unless --trust-bundle is given, or
    --allowed-signers FILE lists the key that signed it (orch export --sign KEY).

    PROFILE (a name or a file): its claim comes from --claim/--claim-ratio or its expect: block; it runs with its
    baseline beside it (3 blocks unless --blocks says otherwise).

    Examples: orch reproduce result.orch.json --host gpu-box   |   orch reproduce eagle3-3step --sim --claim 94
    """
    options = run_options(click.get_current_context(), "reproduce")
    claim = reproduce_mod.Claim(claim_tps, claim_ratio, vs_name)
    with usage_errors():
        plan = reproduce_mod.plan_reproduction(target, claim, options, terminal_question())
    if isinstance(plan, reproduce_mod.BundlePlan):
        new, comparison = reproduce_mod.run_bundle(plan, tolerance)
        try:
            report = compare_json(comparison), compare_text(comparison)
        except Exception as e:  # the measurement is stored: a failure rendering its verdict must not hide where it is
            raise reproduce_mod.JudgingFailed(new.experiment_id, plan.path, e) from e
        verdict_out(new, "reproduction", *report, plan.options.as_json, plan.trust)
        raise SystemExit(comparison.exit_code)
    with usage_errors():
        result, verdict = reproduce_mod.run_claim(plan, tolerance, warn=_warn)
    verdict_out(result, "claim", claim_json(verdict), claim_text(verdict), plan.options.as_json)
    raise SystemExit(verdict.exit_code)


def _warn(line: str) -> None:
    click.echo(line, err=True)


def terminal_question() -> Ask | None:
    """The question before a bundle runs what this machine's own profiles would not: on a terminal (stdin and stderr
    both TTYs, so --json's stdout stays the document), default no; None where there is nobody to ask."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None

    def ask(text: str) -> bool:
        click.echo(text, err=True)
        try:
            return click.confirm("Run it?", default=False, err=True)
        except click.Abort:  # Ctrl-D or Ctrl-C at the question: no
            click.echo("", err=True)
            return False

    return ask


def verdict_out(
    result: ABResult, key: str, doc: dict[str, Any], text: str, as_json: bool, trust: Trust | None = None
) -> None:
    """The new experiment's report, then the verdict under it (or both in one JSON document under `key`); for a
    bundle, what decided it could run here (`bundle_trust`)."""
    if as_json:
        extra = {"bundle_trust": trust.to_dict()} if trust is not None else {}
        click.echo(json.dumps({**ab_json(result), key: doc, **extra}, indent=2))
    else:
        click.echo(ab_text(result))
        click.echo("")
        click.echo(text)
        if trust is not None:
            click.echo(f"  bundle trusted: {trust.note}")


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


@click.command("compare", cls=JsonCommand)
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@db_option
@click.option("--tolerance", default="3%", show_default=True, callback=parse_tolerance,
              help="How far B may be from A and still count as the same.")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["text", "json", "md"]), default="text", show_default=True,
              help="text for a terminal, json for scripts (a failure is one document too: \"status\": \"error\" "
              "and \"error\"), md (Markdown) for an issue or a pull request.")  # fmt: skip
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
    cannot be told from these launches, 2 when no arm pairs up, --map names an arm that is not there, or
    the two measured no level in common (concurrency against rates, or other levels), and 2 when A or B names no
    experiment (or several) or is a bundle that cannot be read. Only the levels both measured are judged; one that
    only one side measured is named with the other side's levels (for a rate, the nearest one: close rates are other
    levels, never paired) and left out of the verdict.
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

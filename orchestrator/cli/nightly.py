"""`orch nightly` (run a suite, judge it, exit 0/1/3) and `orch history` (one item's trend, night by night)."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime

import click

from orchestrator import files
from orchestrator.cli.jsonout import JsonCommand, document_printed, json_option
from orchestrator.cli.options import db_option, open_existing, read_files
from orchestrator.errors import InputError, OrchError
from orchestrator.nightly import history as history_mod
from orchestrator.nightly import night
from orchestrator.nightly import report as report_nightly
from orchestrator.nightly import suite as suite_mod
from orchestrator.nightly.result import NightReport
from orchestrator.results.store import Store
from orchestrator.ui import progress
from orchestrator.ui.events import Lines


def parse_now(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected a date and time such as 2026-11-30T02:00 or 2026-11-30"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time, as cron reads its schedule
    return moment.timestamp()


def stamp(msg: str) -> str:
    """A progress line with the date and time it was said: cron appends the nightly's stderr to one log, night after
    night, so a time of day alone would not say which night a line belongs to. Every line of a message that has
    several (a server's log tail), so that grep finds each with its time."""
    now = time.strftime("%Y-%m-%d %H:%M:%S ")
    return "\n".join(now + line for line in msg.split("\n"))


def _target(path: str | None, option: str, reading: tuple[str, ...]) -> files.Output | None:
    """Refuse an output file that cannot be written before the night, not after it (cron would lose the summary)."""
    return files.output_target(path, option, reading) if path else None


def _write(target: files.Output | None, text: str, what: str) -> None:
    if target is not None:
        try:
            files.write_output(target, text, what)
        except OrchError as e:  # the night is stored and its summary printed: a lost copy is no reason to fail it
            click.echo(f"orch: {e}" if progress.is_terminal(sys.stderr) else stamp(f"orch: {e}"), err=True)


@click.command("nightly", cls=JsonCommand)
@click.argument("suite_file", metavar="SUITE.yaml")
@db_option
@click.option(
    "--now",
    callback=parse_now,
    default=None,
    help="The night's date and time (ISO 8601) [default: now]: for backfills and tests.",
)
@click.option("--only", multiple=True, metavar="ITEM", help="Run only this item (repeatable).")
@click.option(
    "--check",
    is_flag=True,
    help="Validate the suite, its profiles and hosts, warn of what may not work as meant; run nothing (exit 0 or 2).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the night's JSON document instead of the Markdown (on a failure before the night, such as an invalid "
    'suite: "status": "error" and "error").',
)
@click.option("--markdown-out", type=click.Path(allow_dash=True), help="Also write the Markdown summary to this file.")
@click.option("--json-out", type=click.Path(allow_dash=True), help="Also write the JSON document to this file.")
def nightly_cmd(
    suite_file: str,
    db: str | None,
    now: float | None,
    only: tuple[str, ...],
    check: bool,
    as_json: bool,
    markdown_out: str | None,
    json_out: str | None,
) -> None:
    """Run every item of SUITE.yaml (A/B experiments and single-profile checks), store everything, and judge each
    item tonight (its A/B verdicts) and against its history (change points combined with the item's threshold;
    an environment change starts a new history instead of raising an alarm).

    Prints a Markdown summary (one line per item) on stdout, progress on stderr (each line with its date and time
    when stderr is not a terminal). Exit 0: nothing regressed; 3: a regression, or an item's fail_on hit; 1: an
    item could not run (or another night still held the machine); 2: invalid suite; 130: interrupted. See
    docs/nightly.md for the suite format, cron and systemd.
    """
    suite = suite_mod.load(suite_file)
    night.check_hosts(suite)
    reading = read_files(db, suite_file)
    markdown_to = _target(markdown_out, "--markdown-out", reading)
    json_to = _target(json_out, "--json-out", reading)
    unknown = [name for name in only if name not in {i.name for i in suite.items}]
    if unknown:
        raise InputError(
            f"--only {unknown[0]}: no such item in {suite_file}; items: {', '.join(i.name for i in suite.items)}"
        )
    if check:
        if as_json:
            click.echo(json.dumps(night.suite_summary(suite), indent=2))
            document_printed()
            return
        click.echo(f"{suite_file}: suite {suite.name}, {len(suite.items)} item(s), all valid:")
        for item in suite.items:
            metrics = ", ".join(f"{m.key} ({m.threshold * 100:g} %)" for m in item.metrics)
            what = " vs ".join(p.name for p in item.profiles)
            sim = ", SIMULATED" if item.sim else ""
            click.echo(
                f"  {item.name}: {item.kind} {what} on {item.host}{sim}; {metrics}; timeout {item.timeout_s:.0f}s"
            )
        click.echo(f"  hosts: {night.describe_hosts(suite)}")
        for warning in night.check_warnings(suite):
            click.echo(f"  WARNING: {warning}")
        return
    store = Store(db)

    stamped = not progress.is_terminal(sys.stderr)

    def event(msg: str) -> None:
        click.echo(stamp(msg) if stamped else msg, err=True)

    night_at = now if now is not None else datetime.now().timestamp()
    runner = night.NightRunner(suite, store, night_at, Lines(event), only=only)
    try:
        try:
            report = runner.run()
        except (KeyboardInterrupt, night.NightBusyError):
            if runner.last is not None:
                _output(runner.last, as_json, markdown_to, json_to)
            raise
    finally:
        store.close()
    _output(report, as_json, markdown_to, json_to)
    raise SystemExit(report.exit_code)


def _output(
    report: NightReport, as_json: bool, markdown_out: files.Output | None, json_out: files.Output | None
) -> None:
    markdown = report_nightly.night_markdown(report)
    doc = json.dumps(report.to_dict(), indent=2)
    _write(markdown_out, markdown, "the Markdown summary")
    _write(json_out, doc + "\n", "the JSON document")
    click.echo(doc if as_json else markdown.rstrip("\n"))
    sys.stdout.flush()
    document_printed()


@click.command("history", cls=JsonCommand)
@click.argument("item")
@click.option("--host", default=None, help="The host it ran on [default: the only one].")
@click.option(
    "--metric",
    default=None,
    help="Only this metric as the suite names it: tok_s (all its levels), agg_tok_s@32, goodput@0.5 (an open-loop "
    "level by its rate) or crossover [default: all].",
)
@click.option("--arm", default=None, help="Only this arm's series (or a ratio such as eagle3-3step/baseline).")
@click.option(
    "--min-history",
    type=click.IntRange(3, 100),
    default=None,
    help="Nights an environment needs before a regression can be called [default: the suite's min_history].",
)
@json_option
@db_option
def history_cmd(
    item: str,
    host: str | None,
    metric: str | None,
    arm: str | None,
    min_history: int | None,
    as_json: bool,
    db: str | None,
) -> None:
    """ITEM's trend, one line per night: value, 95% CI, change vs the level before, and what was decided then
    (regression, environment change, building history); change points and outlier nights marked in hindsight."""
    store = open_existing(db)
    try:
        known = history_mod.known_items(store)
        if item not in known:
            hint = f"; items with history: {', '.join(known)}" if known else " (no nightly has run on this database)"
            raise InputError(f"no nightly history for item {item!r} in {store.path}{hint}")
        hosts = history_mod.item_hosts(store, item)
        if host is None:
            if len(hosts) > 1:
                raise InputError(f"item {item!r} ran on several hosts ({', '.join(hosts)}); pick one with --host")
            host = hosts[0]
        elif host not in hosts:
            raise InputError(f"item {item!r} never ran on host {host!r}; it ran on {', '.join(hosts)}")
        nights = history_mod.item_nights(store, item, host)
    finally:
        store.close()
    names = list(dict.fromkeys(s.series for n in nights for s in n.series))
    if not names and metric is None and arm is None:
        # Every night failed: what the user needs now is each night's reason.
        if as_json:
            click.echo(json.dumps(report_nightly.history_json(item, host, [], nights), indent=2))
        else:
            click.echo(report_nightly.nights_text(item, host, nights).rstrip("\n"))
        return
    chosen = [
        s
        for s in names
        if (metric is None or _metric_matches(s, metric)) and (arm is None or s.rsplit(":", 1)[0] == arm)
    ]
    if not chosen:
        raise InputError(
            f"item {item!r} has no series"
            + (f" for metric {metric!r}" if metric else "")
            + (f" of arm {arm!r}" if arm else "")
            + f"; it has: {', '.join(names) or 'none (every night failed)'}"
        )
    shown = [report_nightly.series_history(nights, s, min_history) for s in chosen]
    if as_json:
        click.echo(json.dumps(report_nightly.history_json(item, host, shown, nights), indent=2))
    else:
        click.echo(report_nightly.history_text(item, host, shown).rstrip("\n"))


def _metric_matches(series: str, metric: str) -> bool:
    key = series.rsplit(":", 1)[1]
    return key == metric or ("@" not in metric and key.partition("@")[0] == metric)

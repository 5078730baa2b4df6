"""`orch nightly` (run a suite, judge it, exit 0/1/3) and `orch history` (one item's trend, night by night)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from orchestrator import files
from orchestrator.cli.jsonout import JsonCommand, document_printed, json_option
from orchestrator.cli.options import db_option, open_existing, read_files
from orchestrator.errors import InputError, OrchError
from orchestrator.nightly import history as history_mod
from orchestrator.nightly import night
from orchestrator.nightly import page as page_mod
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
@click.option(
    "--html-out",
    type=click.Path(allow_dash=True),
    help="Also write the suite's history, tonight included, as one self-contained HTML page (plots inline, no "
    "scripts, no network) to this file: orch history --suite NAME --html FILE.",
)
@click.option(
    "--with-reports",
    is_flag=True,
    help="With --html-out: also write each experiment's A/B report (orch report ID --html) beside the page, as "
    "report-ID.html, and link every experiment id to it.",
)
def nightly_cmd(
    suite_file: str,
    db: str | None,
    now: float | None,
    only: tuple[str, ...],
    check: bool,
    as_json: bool,
    markdown_out: str | None,
    json_out: str | None,
    html_out: str | None = None,
    with_reports: bool = False,
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
    html_to = _target(html_out, "--html-out", reading)
    if with_reports:
        reports_beside(html_to, "--html-out", html_out)
    if html_to is not None:
        from orchestrator.report import plots

        plots.require_matplotlib()  # before the night: a page that cannot be drawn is said now, not at 3 am
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
            judged = (f"; slo {item.slo.text}" if item.slo is not None else "") + (
                f"; fail_on {', '.join(item.fail_on)}" if item.fail_on else ""
            )
            click.echo(
                f"  {item.name}: {item.kind} {what} on {item.host}{sim}; {metrics}{judged}; timeout "
                f"{item.timeout_s:.0f}s"
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
    runner = night.NightRunner(suite=suite, store=store, night_at=night_at, events=Lines(event), only=only)
    try:
        try:
            report = runner.run()
        except (KeyboardInterrupt, night.NightBusyError):
            if runner.last is not None:
                _output(runner.last, as_json, markdown_to, json_to)
                _page(html_to, store, suite, with_reports, db)
            raise
        _output(report, as_json, markdown_to, json_to)
        _page(html_to, store, suite, with_reports, db)
    finally:
        store.close()
    raise SystemExit(report.exit_code)


def reports_beside(target: files.Output | None, flag: str, given: str | None) -> None:
    """--with-reports writes the A/B reports beside the page: it needs the page's option, and a file to be beside."""
    if target is None:
        raise click.UsageError(f"--with-reports goes with {flag} FILE (the reports are written beside the page)")
    if target.kind != "file":
        raise InputError(f"--with-reports: the reports are written beside the page, and {flag} {given} is not a file")


def _page(
    target: files.Output | None, store: Store, suite: suite_mod.Suite, with_reports: bool, db: str | None
) -> None:
    """The suite's history page, written after the night's summary: a page that fails is said, the night stands.
    With `with_reports`, each experiment's A/B report (from --db `db`) beside it."""
    if target is None:
        return
    try:
        from orchestrator.report import nightly_html

        pairs = [(item.name, item.host) for item in suite.items]
        page = page_mod.build(store, pairs, suite=suite.name)
        if with_reports:
            page = page_mod.with_reports(page, _reports(page, target, db, str(store.path)))
        _write(target, nightly_html.render(page), "the history page")
    except OrchError as e:
        click.echo(f"orch: {e}" if progress.is_terminal(sys.stderr) else stamp(f"orch: {e}"), err=True)


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
@click.argument("item", required=False, metavar="[ITEM]")
@click.option("--host", default=None, help="The host it ran on [default: the only one].")
@click.option(
    "--metric",
    default=None,
    help="Only this metric as the suite names it: tok_s (all its levels), agg_tok_s@32, goodput@0.5 (an open-loop "
    "level by its rate) or crossover; or one series by its whole name (baseline:goodput@0.5) [default: all].",
)
@click.option("--arm", default=None, help="Only this arm's series (or a ratio such as eagle3-3step/baseline).")
@click.option(
    "--min-history",
    type=click.IntRange(3, 100),
    default=None,
    help="Nights an environment needs before a regression can be called [default: the suite's min_history].",
)
@click.option(
    "--suite",
    "suite_name",
    default=None,
    metavar="NAME",
    help="Every item of this suite (on --host, if given) instead of one ITEM: the suite's name as its nights are "
    "stored (its `suite:` field).",
)
@click.option(
    "--html",
    "html_path",
    default=None,
    type=click.Path(allow_dash=True),
    help="Write the history as one self-contained HTML page (plots inline, no scripts, no network) to this file "
    "instead of printing it: each series' nights with their CIs, levels, change points, environment steps and failed "
    "nights, and a table of each item's state tonight.",
)
@click.option(
    "--with-reports",
    is_flag=True,
    help="With --html: also write each experiment's A/B report (orch report ID --html) beside the page, as "
    "report-ID.html, and link every experiment id to it.",
)
@json_option
@db_option
def history_cmd(
    item: str | None,
    host: str | None,
    metric: str | None,
    arm: str | None,
    min_history: int | None,
    suite_name: str | None,
    html_path: str | None,
    with_reports: bool,
    as_json: bool,
    db: str | None,
) -> None:
    """ITEM's trend, one line per night: value, 95% CI, change vs the level before, and what was decided then
    (regression, environment change, building history); change points and outlier nights marked in hindsight.

    With --suite NAME, every item of a suite; with --html FILE, the same as one HTML page with plots."""
    if item is None and suite_name is None:
        raise click.UsageError(
            "Missing argument 'ITEM': give an item's name, or --suite NAME for every item of a suite"
        )
    if item is not None and suite_name is not None:
        raise click.UsageError("give ITEM or --suite NAME, not both")
    if with_reports and html_path is None:
        reports_beside(None, "--html", None)
    if as_json and html_path is not None:
        raise click.UsageError("--html writes the page; --json prints the history as JSON: give one of them")
    target = None
    if html_path is not None:
        target = files.output_target(html_path, "--html", read_files(db))
        if with_reports:
            reports_beside(target, "--html", html_path)
        from orchestrator.report import plots

        plots.require_matplotlib()  # before reading anything: a missing extra is said first
    store = open_existing(db)
    try:
        loaded, chosen = _select(store, item, suite_name, host, metric, arm)
        pairs = [(i, h) for i, h, _ in loaded]
        if target is not None:
            series = [s for names in chosen.values() for s in names] if metric or arm else None
            page = page_mod.build(store, pairs, suite=suite_name, min_history=min_history, series=series)
            reports = _reports(page, target, db, str(store.path)) if with_reports else {}
    finally:
        store.close()
    if target is not None:
        from orchestrator.report import nightly_html

        text = nightly_html.render(page_mod.with_reports(page, reports))
        files.write_output(target, text, "the history page")
        if not target.to_stdout:
            n_series = sum(len(i.series) for i in page.items)
            more = f", {len(reports)} A/B report(s) beside it" if with_reports else ""
            click.echo(
                f"wrote {target.path} (nightly history page, {len(page.items)} item(s), {n_series} series{more})",
                err=True,
            )
        return
    docs, texts = [], []
    for i, h, nights in loaded:
        names = chosen[i, h]
        if not names:
            # Every night failed: what the user needs now is each night's reason.
            docs.append(report_nightly.history_json(i, h, [], nights))
            texts.append(report_nightly.nights_text(i, h, nights))
            continue
        shown = [report_nightly.series_history(nights, s, min_history) for s in names]
        docs.append(report_nightly.history_json(i, h, shown, nights))
        texts.append(report_nightly.history_text(i, h, shown))
    if as_json:
        doc = docs[0] if suite_name is None else {"suite": suite_name, "items": docs}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo("\n".join(t.rstrip("\n") for t in texts))


Selected = list[tuple[str, str, list[history_mod.ItemNight]]]


def _select(
    store: Store, item: str | None, suite: str | None, host: str | None, metric: str | None, arm: str | None
) -> tuple[Selected, dict[tuple[str, str], list[str]]]:
    """The items (item, host, its nights) to show and each one's series; of a suite, those with the series asked for."""
    if suite is not None:
        pairs = page_mod.suite_items(store, suite, host)
        if not pairs:
            suites = page_mod.known_suites(store)
            hint = f"; suites with nights: {', '.join(suites)}" if suites else " (no nightly has run on this database)"
            on = f" on host {host!r}" if host is not None else ""
            raise InputError(f"no nightly history for suite {suite!r}{on} in {store.path}{hint}")
    else:
        assert item is not None
        pairs = [(item, _item_host(store, item, host))]
    loaded = [(i, h, history_mod.item_nights(store, i, h, suite=suite)) for i, h in pairs]
    chosen: dict[tuple[str, str], list[str]] = {}
    refused: list[InputError] = []
    for i, h, n in loaded:
        try:
            chosen[i, h] = _chosen(i, n, metric, arm)
        except InputError as e:
            refused.append(e)
    if refused and (suite is None or not chosen):
        raise refused[0]
    return [(i, h, n) for i, h, n in loaded if (i, h) in chosen], chosen


def _item_host(store: Store, item: str, host: str | None) -> str:
    known = history_mod.known_items(store)
    if item not in known:
        hint = f"; items with history: {', '.join(known)}" if known else " (no nightly has run on this database)"
        raise InputError(f"no nightly history for item {item!r} in {store.path}{hint}")
    hosts = history_mod.item_hosts(store, item)
    if host is None:
        if len(hosts) > 1:
            raise InputError(f"item {item!r} ran on several hosts ({', '.join(hosts)}); pick one with --host")
        return hosts[0]
    if host not in hosts:
        raise InputError(f"item {item!r} never ran on host {host!r}; it ran on {', '.join(hosts)}")
    return host


def _chosen(item: str, nights: list[history_mod.ItemNight], metric: str | None, arm: str | None) -> list[str]:
    """The series of an item to show; [] when every night failed and nothing was asked for."""
    names = list(dict.fromkeys(s.series for n in nights for s in n.series))
    if not names and metric is None and arm is None:
        return []
    chosen = [
        s
        for s in names
        if (metric is None or metric_matches(s, metric)) and (arm is None or s.rsplit(":", 1)[0] == arm)
    ]
    if not chosen:
        raise InputError(
            f"item {item!r} has no series"
            + (f" for metric {metric!r}" if metric else "")
            + (f" of arm {arm!r}" if arm else "")
            + f"; it has: {', '.join(names) or 'none (every night failed)'}"
        )
    return chosen


def _reports(page: Any, target: files.Output, db: str | None, store_path: str) -> dict[str, str]:
    """Each experiment's A/B report written beside the page (report-ID.html); an experiment without a launch to
    report (a server that never started) keeps its id unlinked."""
    from orchestrator.cli.stored import html_report

    where = Path(target.path).resolve().parent
    out = {}
    for exp in page_mod.experiments(page):
        name = f"report-{exp}.html"
        try:
            text, _ = html_report(exp, db)
            files.write_output(files.output_target(where / name, "--with-reports", (store_path,)), text, "a report")
        except OrchError as e:
            click.echo(f"orch: no A/B report for {exp}: {e}", err=True)
            continue
        out[exp] = name
    return out


def metric_matches(series: str, metric: str) -> bool:
    """`tok_s` (every level), `goodput@4` or `goodput@4.0` (one level), or a whole series name as the error lists
    them (`baseline:goodput@4`)."""
    if ":" in metric:
        arm, _, metric = metric.rpartition(":")
        if series.rsplit(":", 1)[0] != arm:
            return False
    key = series.rsplit(":", 1)[1]
    name, at, level = metric.partition("@")
    if at:
        with contextlib.suppress(ValueError):
            metric = f"{name}@{float(level):g}"
    return key == metric or ("@" not in metric and key.partition("@")[0] == metric)

"""`orch report ID --html FILE`: a stored experiment (or a result bundle) as a self-contained HTML report."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from orchestrator.cli.complete import experiment_ids
from orchestrator.cli.options import db_option, open_existing, parse_effect

if TYPE_CHECKING:
    from orchestrator import results
    from orchestrator.store import Store


def load_with_requests(
    ref: str, db: str | None, min_effect: float | None = None
) -> tuple[results.ABResult, dict[str, list[dict[str, object]]]]:
    """The result as `orch show` reads it, plus each launch's per-request rows (for the plots that need them)."""
    from orchestrator.cli.stored import is_file
    from orchestrator.store import Store

    if is_file(ref):
        from orchestrator import bundle as bundle_mod

        bundle = bundle_mod.read_bundle(ref)
        store = Store(":memory:")  # read without importing into the user's store
        try:
            ref = bundle_mod.import_bundle(store, bundle)
            return _read(store, ref, min_effect)
        finally:
            store.close()
    store = open_existing(db)
    try:
        return _read(store, ref, min_effect)
    finally:
        store.close()


def _read(
    store: Store, ref: str, min_effect: float | None
) -> tuple[results.ABResult, dict[str, list[dict[str, object]]]]:
    from orchestrator import results

    result = results.load_result(store, ref, min_effect=min_effect)
    return result, {la.launch_id: store.requests(la.launch_id) for la in result.launches}


def html_report(ref: str, db: str | None, min_effect: float | None = None) -> tuple[str, int]:
    """The report's HTML text and the number of launches in it; matplotlib is imported only here."""
    from orchestrator import plots, report_html
    from orchestrator.cli.stored import require_launches

    plots.require_matplotlib()  # before reading anything: a missing extra is said first
    result, requests = load_with_requests(ref, db, min_effect)
    require_launches(result)
    return report_html.ab_html(result, requests), len(result.launches)


@click.command("report")
@click.argument("experiment", metavar="ID|FILE", shell_complete=experiment_ids)
@db_option
@click.option(
    "--html",
    "html_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Write a self-contained HTML report (plots inline, no network needed to view it) to this file.",
)
@click.option(
    "--min-effect",
    default=None,
    callback=lambda c, p, v: None if v is None else parse_effect(c, p, v),
    help="Judge against another minimum effect than the experiment's.",
)
def report_cmd(experiment: str, db: str | None, html_path: str, min_effect: float | None) -> None:
    """An experiment's report as one self-contained HTML file with plots.

    ID: an id, a unique prefix, or 'last'; FILE: a result bundle. Needs matplotlib: pip install 'orch-bench[report]'."""
    from orchestrator import files

    target = files.writable_target(html_path)
    text, launches = html_report(experiment, db, min_effect)
    files.write_atomically(target, text, "the report")
    click.echo(f"wrote {target} (HTML report, {launches} launches)", err=True)

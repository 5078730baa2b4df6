"""`orch report ID --html FILE`: a stored experiment (or a result bundle) as a self-contained HTML report."""

from __future__ import annotations

import click

from orchestrator.cli.complete import experiment_ids
from orchestrator.cli.options import db_option, parse_effect
from orchestrator.cli.stored import html_report


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

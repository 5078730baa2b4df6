"""`orch report ID --html FILE`: a stored experiment (or a result bundle) as a self-contained HTML report."""

from __future__ import annotations

import click

from orchestrator.cli.complete import experiment_ids
from orchestrator.cli.options import db_option, parse_effect, read_files
from orchestrator.cli.stored import html_report, is_file


@click.command("report")
@click.argument("experiment", metavar="ID|FILE", shell_complete=experiment_ids)
@db_option
@click.option(
    "--html",
    "html_path",
    required=True,
    type=click.Path(allow_dash=True),
    help="Write a self-contained HTML report (plots inline, no network needed to view it) to this file (- for "
    "stdout; an existing file is replaced whole, a device or named pipe written through, anything else refused).",
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

    reading = read_files(db, *([experiment] if is_file(experiment) else []))
    target = files.output_target(html_path, "--html", reading)  # before any work
    text, launches = html_report(experiment, db, min_effect)
    if target.to_stdout:
        click.echo(text, nl=False)
        return
    files.write_output(target, text, "the report")
    click.echo(f"wrote {target.path} (HTML report, {launches} launches)", err=True)

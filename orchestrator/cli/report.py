"""`orch report ID --html FILE`: a stored experiment (or a result bundle) as a self-contained HTML report."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from orchestrator import bundle as bundle_mod
from orchestrator import results, yamlfile
from orchestrator.cli.base import cli
from orchestrator.cli.complete import experiment_ids
from orchestrator.cli.options import db_option, open_existing, parse_effect
from orchestrator.errors import InputError, StoreError
from orchestrator.store import Store


def check_target(path: str) -> Path:
    """Refuse, before any work, a file that could not be written (exit 2: the argument is wrong)."""
    target = Path(path)
    parent = target.parent
    if target.is_dir():
        raise InputError(f"{path}: is a directory; give a file name such as report.html")
    if not parent.is_dir():
        raise InputError(f"{path}: the directory {parent} does not exist")
    # The file is written next to itself and renamed into place, so the directory must be writable too.
    if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(f"{path}: not writable (permission denied)")
    return target


def write_atomically(target: Path, text: str) -> None:
    """Readers see the old file or the whole new one, never half of it."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise StoreError(f"{target}: cannot write the report: {e.strerror or e}") from e


def load_with_requests(
    ref: str, db: str | None, min_effect: float | None = None
) -> tuple[results.ABResult, dict[str, list[dict[str, object]]]]:
    """The result as `orch show` reads it, plus each launch's per-request rows (for the plots that need them)."""
    if yamlfile.is_file(Path(ref)):
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


@cli.command("report")
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
    target = check_target(html_path)
    text, launches = html_report(experiment, db, min_effect)
    write_atomically(target, text)
    click.echo(f"wrote {target} (HTML report, {launches} launches)", err=True)

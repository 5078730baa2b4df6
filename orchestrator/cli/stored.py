"""Stored experiments: `orch list`, `show`, `export` (incl. bundles) and `import`; what `orch report` reads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.complete import experiment_ids
from orchestrator.cli.jsonout import JsonCommand, emit, json_option
from orchestrator.cli.options import db_option, judgement_options, open_existing, parse_effect, read_files
from orchestrator.common.printable import visible
from orchestrator.errors import StoreError
from orchestrator.report.formats import FORMATS

if TYPE_CHECKING:
    from orchestrator.config.slo import SLO
    from orchestrator.files import Output
    from orchestrator.results import model
    from orchestrator.results.store import Store

# `orch list` imports nothing but the store: the results model, reports and bundles are imported by the commands
# that read an experiment (tests/cli/test_startup.py keeps it so).


@click.command("list", cls=JsonCommand)
@db_option
@click.option(
    "--limit", default=20, show_default=True, type=click.IntRange(1, 100000), help="Show at most this many experiments."
)
@json_option
def list_cmd(db: str | None, limit: int, as_json: bool) -> None:
    """Stored experiments, newest first: id, when, status, host, arms, launches done of planned; an experiment of
    `orch nightly` is tagged with its night's date and item."""
    store = open_existing(db)
    try:
        rows = [_list_row(r) for r in store.experiments(limit)]
    finally:
        store.close()
    if as_json:
        emit({"status": "ok", "database": str(store.path), "experiments": rows})
        return
    if not rows:
        click.echo(f"no experiments in {store.path}")
        return
    table = [["id", "started", "status", "host", "arms", "launches", "blocks", ""]]
    for r in rows:
        table.append(
            [
                r["id"],
                time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created_at"])),
                r["status"],
                r["host"],
                " vs ".join(r["arms"]),
                f"{r['launches_complete']}/{r['launches_planned']}",
                str(r["blocks"]),
                " ".join(
                    word
                    for word, on in (
                        ("SIMULATED", r["simulated"]),
                        ("ATTACHED", r["attached"]),
                        _night_tag(r),
                        ("SWEEP PROBE", r["sweep_probe"]),
                    )
                    if on
                ),
            ]
        )
    # Arm names and hosts come from the store (a bundle imported into it): a newline in one stays in its row.
    table = [[visible(c) for c in row] for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _list_row(r: dict[str, Any]) -> dict[str, Any]:
    """One stored experiment as `orch list --json` gives it (and the table is drawn from)."""
    design = json.loads(r["design_json"]) if r.get("design_json") else None
    arms = json.loads(r["arms_json"])
    blocks = int(design["blocks"]) if design else 1
    return {
        "id": r["id"],
        "created_at": r["created_at"],
        "status": r["status"],
        "host": r["host"],
        "arms": arms,
        "launches_complete": r["launches_complete"],
        "launches_planned": len(arms) * blocks,
        "blocks": blocks,
        "simulated": bool(r["simulated"]),
        "attached": _attached(r["config_json"]),
        "night": _night(r["config_json"]),
        # the probe of an `orch ab --sweep auto` (its rates were swept by the experiment that names it)
        "sweep_probe": bool(json.loads(r["config_json"]).get("sweep_probe")),
    }


def _night(config_json: str) -> dict[str, Any] | None:
    """The night an experiment of `orch nightly` ran for (night_id, suite, item, night_at), else None."""
    night = json.loads(config_json).get("nightly")
    return night if isinstance(night, dict) else None


def _night_tag(r: dict[str, Any]) -> tuple[str, bool]:
    """`night 2026-11-30 ITEM`: the night's date (its --now, for a backfill) beside the time it really started."""
    night = r["night"]
    if not night:
        return "", False
    at = night.get("night_at")
    when = time.strftime("%Y-%m-%d", time.localtime(at)) if isinstance(at, int | float) else night.get("night_id")
    return f"night {when} {night.get('item', '?')}", True


def _attached(config_json: str) -> bool:
    """Whether an experiment had an arm on a server orch did not launch (`--attach`)."""
    return any(isinstance(p, dict) and p.get("attach") for p in json.loads(config_json).get("profiles") or [])


def stored_result(
    ref: str,
    db: str | None,
    min_effect: float | None = None,
    slo: SLO | None = None,
    metric: str | None = None,
    say: Callable[[str], None] | None = None,
) -> model.ABResult:
    """ID, prefix or `last` from the store; a path that exists is a result bundle, read without importing it (`say`
    gets a line about its signature, if it has one). `slo` and `metric` judge it on others than its own."""
    from orchestrator.results.load import load_result

    if is_file(ref):
        from orchestrator.results import bundle as bundle_mod

        bundle = bundle_mod.read_bundle(ref)
        if say is not None and (note := signature_note(bundle)) is not None:
            say(note)
        return bundle_mod.result_from_bundle(bundle, min_effect=min_effect, slo=slo, metric=metric)
    store = open_existing(db)
    try:
        return load_result(store, ref, min_effect=min_effect, slo=slo, metric=metric)
    finally:
        store.close()


def signature_note(bundle: dict[str, Any]) -> str | None:
    """What `orch show` and `orch import` say of a signed bundle (nothing is run to check it: that is reproduce's)."""
    from orchestrator.results import bundle as bundle_mod

    key = bundle_mod.signature_key(bundle)
    if key is None:
        return None
    return (
        f"signed with {key.describe()} (not checked here: `orch reproduce FILE --allowed-signers FILE` checks it "
        "against the signers you trust)"
    )


def load_with_requests(
    ref: str, db: str | None, min_effect: float | None = None
) -> tuple[model.ABResult, dict[str, list[dict[str, object]]]]:
    """The result as `orch show` reads it, plus each launch's per-request rows (for the plots that need them)."""
    from orchestrator.results.store import Store

    if is_file(ref):
        from orchestrator.results import bundle as bundle_mod

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
) -> tuple[model.ABResult, dict[str, list[dict[str, object]]]]:
    from orchestrator.results.load import load_result

    result = load_result(store, ref, min_effect=min_effect)
    return result, {la.launch_id: store.requests(la.launch_id) for la in result.launches}


def html_report(ref: str, db: str | None, min_effect: float | None = None) -> tuple[str, int]:
    """The report's HTML text and the number of launches in it; matplotlib is imported only here."""

    html = FORMATS["html"]
    html.check()  # before reading anything: a missing extra is said first
    result, requests = load_with_requests(ref, db, min_effect)
    require_launches(result)
    return html.render(result, requests), len(result.launches)


@click.command("show", cls=JsonCommand)
@click.argument("experiment", metavar="ID|FILE", shell_complete=experiment_ids)
@db_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='The same JSON document as `orch ab --json` (on failure one document too: "status": "error" and "error").',
)
@click.option(
    "--min-effect",
    default=None,
    callback=lambda c, p, v: None if v is None else parse_effect(c, p, v),
    help="Judge against another minimum effect than the experiment's.",
)
@judgement_options(default_metric=False)
def show_cmd(
    experiment: str, db: str | None, as_json: bool, min_effect: float | None, slo: SLO | None, metric: str | None
) -> None:
    """An experiment's report from the store (ID: an id, a unique prefix, or 'last'); partial ones too.

    FILE: a result bundle (`orch export ID --format bundle`), shown without importing it. --slo and --metric judge
    it on other objectives or another metric than its own (goodput is counted from the stored per-request rows).
    An ID that names no experiment (or several) exits 2."""
    from orchestrator.report.jsondoc import ab_json
    from orchestrator.report.text import ab_text

    result = stored_result(experiment, db, min_effect, slo, metric, say=lambda line: click.echo(line, err=True))
    require_launches(result)
    click.echo(json.dumps(ab_json(result), indent=2) if as_json else ab_text(result).lstrip("\n"))


@click.command("export")
@click.argument("experiment", metavar="ID|FILE", shell_complete=experiment_ids)
@db_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice([*FORMATS, "bundle"]),
    default="json",
    show_default=True,
    help="json: the `ab --json` document; csv: one row per timed run; jsonl: one JSON line per request of every "
    "timed run (per-request records: tokens, ttft_s, e2e_s, error); md: the report as Markdown; html: the report "
    "with plots, one self-contained file (`orch report`; needs pip install 'orch-bench[report]'); bundle: one "
    "self-contained file to re-run and judge the experiment elsewhere (`orch reproduce FILE`, `orch import`, "
    "`orch show FILE`), checked as they check it before it is written (a record they would refuse: exit 2).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(allow_dash=True),
    default=None,
    help="Write to this file instead of stdout (a bundle: default <id>.orch.json in the current directory; - for "
    "stdout). An existing file is replaced whole; a device or named pipe is written through; anything else, and the "
    "results database, is refused.",
)
@click.option(
    "--sign",
    "sign_key",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="KEY",
    help="With --format bundle: sign the bundle with this SSH key (ssh-keygen -Y sign, as git signs with SSH keys; "
    "a private key file, or the .pub of a key ssh-agent holds; never asks for a passphrase), so that `orch reproduce "
    "FILE --allowed-signers FILE` can run it without asking (docs/reproduce.md#trust).",
)
def export_cmd(experiment: str, db: str | None, fmt: str, output: str | None, sign_key: str | None) -> None:
    """Export a stored experiment (or a result bundle FILE) as JSON, CSV, JSON Lines, Markdown, HTML or a bundle."""
    from orchestrator import files

    if sign_key is not None and fmt != "bundle":
        raise click.UsageError(f"--sign signs a result bundle, not --format {fmt}: add --format bundle")
    reading = read_files(db, *([experiment] if is_file(experiment) else []))
    # Checked before any work: a refused -o costs nothing, and the store is never written over.
    target = files.output_target(output, "-o", reading) if output is not None else None
    if fmt == "bundle":
        _export_bundle(experiment, db, target, sign_key)
        return
    export = FORMATS[fmt]
    export.check()
    if export.per_request:
        result, requests = load_with_requests(experiment, db)
    else:
        result, requests = stored_result(experiment, db), {}
    require_launches(result)
    text = export.render(result, requests)
    if target is None or target.to_stdout:
        click.echo(text, nl=False)
        return
    files.write_output(target, text, "the export")  # never a half-written export
    click.echo(f"wrote {output} ({fmt}, {len(result.launches)} launches)", err=True)


def _export_bundle(ref: str, db: str | None, target: Output | None, sign_key: str | None) -> None:
    from orchestrator import files
    from orchestrator.results import bundle as bundle_mod
    from orchestrator.results import signing

    if is_file(ref):
        bundle = bundle_mod.read_bundle(ref)  # checked, then written again as it is (or signed anew)
    else:
        store = open_existing(db)
        try:
            bundle = bundle_mod.make_bundle(store, ref)
        finally:
            store.close()
    if sign_key is not None:
        bundle = signing.sign_bundle(bundle, sign_key)
    content = bundle["content"]
    if target is None:
        target = files.output_target(f"{content['experiment']['id']}.orch.json", None, read_files(db, ref))
    if target.to_stdout:
        click.echo(bundle_mod.bundle_text(bundle), nl=False)
        return
    bundle_mod.write_bundle(bundle, target)
    withheld = bundle_mod.WITHHELD in json.dumps(content)
    key = bundle_mod.signature_key(bundle)
    click.echo(
        f"wrote {target.path} (result bundle, {len(content['launches'])} launches"
        + (f"; signed with {key.describe()}" if key is not None else "")
        + ("; secret values withheld, the receiver provides their own" if withheld else "")
        + ")",
        err=True,
    )


@click.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@db_option
def import_cmd(file: str, db: str | None) -> None:
    """Put a result bundle (`orch export ID --format bundle`) into the local store under its own id."""
    from orchestrator.results import bundle as bundle_mod
    from orchestrator.results.store import Store

    bundle = bundle_mod.read_bundle(file)
    store = Store(db)
    try:
        exp_id = bundle_mod.import_bundle(store, bundle, source=str(Path(file).resolve()))
        path = store.path
    except bundle_mod.AlreadyImported as e:
        click.echo(str(e))
        return
    finally:
        store.close()
    launches = len(bundle["content"]["launches"])
    click.echo(f"imported experiment {exp_id} ({launches} launches) into {path}")
    if (note := signature_note(bundle)) is not None:
        click.echo(note)
    click.echo(f"next: orch show {exp_id}    orch reproduce {file}    orch compare {exp_id} ID")


def is_file(ref: str) -> bool:
    """Whether ID|FILE names a file (a result bundle): yamlfile.is_file's answer, without importing YAML for an id."""
    try:
        return Path(ref).is_file()
    except (OSError, ValueError):  # names the OS refuses (too long, NUL bytes) are no file
        return False


def require_launches(result: model.ABResult) -> None:
    if not result.launches:
        note = "; ".join(result.notes)
        raise StoreError(
            f"experiment {result.experiment_id} has no completed launch yet" + (f" ({note})" if note else "")
        )

"""`orch whatif`: predict every draft step count of a speculative drafter from the step counts an experiment ran."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from orchestrator import yamlfile
from orchestrator.cli.base import MAX_TPS, FiniteFloat
from orchestrator.cli.complete import experiment_ids
from orchestrator.cli.jsonout import JsonCommand, emit, json_option
from orchestrator.cli.options import db_option, open_existing
from orchestrator.results import bundle as bundle_mod
from orchestrator.results import model
from orchestrator.results.load import load_result

MAX_STEPS = 64


def parse_steps(ctx: click.Context | None, param: click.Parameter | None, value: str) -> tuple[int, ...]:
    """`1-8`, `2,4,6` or `5`: the step counts to predict (1 to 64)."""
    out: set[int] = set()
    try:
        for part in value.split(","):
            lo, sep, hi = part.strip().partition("-")
            first, last = int(lo), int(hi) if sep else int(lo)
            if first > last:
                raise ValueError
            out.update(range(first, last + 1))
    except ValueError:
        raise click.BadParameter(f"{value!r}: give a range like 1-8, a list like 2,4,6, or one count") from None
    if not out or min(out) < 1 or max(out) > MAX_STEPS:
        raise click.BadParameter(f"{value!r}: step counts must lie between 1 and {MAX_STEPS}")
    return tuple(sorted(out))


def load(ref: str, db: str | None) -> tuple[model.ABResult, list[dict[str, Any] | None]]:
    """The experiment (an id, a unique prefix, `last`, or a result bundle FILE) and each arm's resolved profile."""
    if yamlfile.is_file(Path(ref)):
        bundle = bundle_mod.read_bundle(ref)
        return bundle_mod.result_from_bundle(bundle), list(bundle["content"].get("profiles") or [])
    store = open_existing(db)
    try:
        exp = store.find_experiment(ref)  # an id that names none is ExperimentRefError (exit 2), as everywhere
        result = load_result(store, exp["id"])
        stored = json.loads(exp["config_json"]).get("profiles")
        if isinstance(stored, list) and len(stored) == len(result.profiles):
            return result, stored
        found: dict[int, dict[str, Any]] = {}
        for row in store.launches(exp["id"]):
            found.setdefault(int(row["arm_index"]), json.loads(row["profile_json"]))
        return result, [found.get(i) for i in range(len(result.profiles))]
    finally:
        store.close()


@click.command("whatif", cls=JsonCommand)
@click.argument("experiment", metavar="ID|FILE", shell_complete=experiment_ids)
@db_option
@click.option(
    "--steps",
    default="1-8",
    show_default=True,
    callback=parse_steps,
    help="Step counts to predict: a range (1-8), a list (2,4,6) or one count.",
)
@click.option(
    "--target-tps",
    type=FiniteFloat(min=0, max=MAX_TPS, min_open=True),
    default=None,
    help="Also give, per step count, the per-draft acceptance α this tok/s needs (or 'not reachable').",
)
@click.option(
    "--arms",
    default=None,
    help="Comma-separated arms to fit from (default: every speculative arm of the one drafter with 2+ step counts).",
)
@json_option
def whatif_cmd(
    experiment: str, db: str | None, steps: tuple[int, ...], target_tps: float | None, arms: str | None, as_json: bool
) -> None:
    """Predict accept length, cycle time and tok/s at every draft step count from the ones an experiment measured.

    ID: an id, a unique prefix, or 'last'; FILE: a result bundle. The experiment needs arms of one drafter (same
    engine, base model, TP size and draft model) at two or more step counts, e.g. eagle3-2step and eagle3-3step;
    a baseline arm adds the comparison with not speculating. Model and assumptions: docs/speculative.md."""
    from orchestrator.whatif import predict, text

    result, profiles = load(experiment, db)
    names = [n.strip() for n in arms.split(",") if n.strip()] if arms else None
    w = predict.analyse(result, profiles, steps=steps, target_tps=target_tps, arms=names)
    if as_json:
        emit(text.to_dict(w))
        return
    for line in text.text_lines(w):
        click.echo(line)

"""`orch breakeven`: the speculative break-even arithmetic."""

from __future__ import annotations

import click

from orchestrator.cli.base import MAX_TPS, FiniteFloat
from orchestrator.cli.jsonout import JsonCommand, emit, json_option
from orchestrator.report.lines import breakeven_lines
from orchestrator.stats import estimates


@click.command("breakeven", cls=JsonCommand)
@click.option(
    "--baseline-tps",
    type=FiniteFloat(min=0, max=MAX_TPS, min_open=True),
    required=True,
    help="The baseline's single-stream tok/s (re-measured, not remembered).",
)
@click.option(
    "--cycle-ms",
    type=FiniteFloat(min=0, max=1e6, min_open=True),
    required=True,
    help="One speculative cycle: draft steps + verify, in ms.",
)
@click.option("--steps", type=click.IntRange(1, 64), required=True, help="Draft steps per cycle (k).")
@click.option(
    "--accept-length",
    type=FiniteFloat(min=0, max=65, min_open=True),
    default=None,
    help="A measured accept length, to compare with the break-even.",
)
@click.option(
    "--target-tps",
    type=FiniteFloat(min=0, max=MAX_TPS, min_open=True),
    default=None,
    help="Also say what a target tok/s would need.",
)
@json_option
def breakeven_cmd(
    baseline_tps: float,
    cycle_ms: float,
    steps: int,
    accept_length: float | None,
    target_tps: float | None,
    as_json: bool,
) -> None:
    """Speculative decoding arithmetic: the accept length (and per-token acceptance) needed to break even.

    A break-even at or below 1 token per cycle is always reached: every cycle yields at least one token. The
    numbers given are taken as exact; `orch ab` adds the intervals its estimates carry.

    Example (the seed's): orch breakeven --baseline-tps 82.2 --cycle-ms 30 --steps 3 --target-tps 150
    """
    be = estimates.breakeven(baseline_tps, cycle_ms, steps, measured_tau=accept_length, target_tps=target_tps)
    if as_json:
        # The same field names as the `speculation` entries of `orch ab --json`.
        emit({"status": "ok", **be.to_dict()})
        return
    for line in breakeven_lines(be):
        click.echo(line)

"""An experiment as CSV, one row per timed run (`orch export --format csv`)."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Sequence

from orchestrator.results.goodput import run_attainment
from orchestrator.results.model import ABResult, ArmResult
from orchestrator.results.run import Level
from orchestrator.stats.estimates import t_975

CSV_FIELDS = (
    "experiment_id",
    "simulated",
    "profile",
    "arm_index",
    "label",
    "block",
    "position",
    "launch_id",
    "concurrency",
    "run",
    "valid",
    "tok_s",
    "aggregate_tok_s",
    "tokens",
    "seconds",
    "ttft_s",
    "accept_length",
    "invalid_reason",
    "attached",  # the URL of a server orch did not launch (--attach): state not fresh, env not verified
)
# An open-loop experiment's CSV has one more column: each run's rate, requests per second (its concurrency is 0).
OPEN_LOOP_FIELDS = ("rate",)
# Last on every row (after `rate` where there is one), empty where not measured: the run's goodput under --slo and
# energy per output token, then the arm's at the run's level with its 95 % CI over launches (the same on every row
# of that arm and level). docs/report.md#csv-columns.
MEASURED_FIELDS = (
    "goodput_req_s",
    "goodput_tok_s",
    "j_per_token",
    "arm_goodput_req_s",
    "arm_goodput_req_s_lo",
    "arm_goodput_req_s_hi",
    "arm_goodput_tok_s",
    "arm_goodput_tok_s_lo",
    "arm_goodput_tok_s_hi",
    "arm_j_per_token",
    "arm_j_per_token_lo",
    "arm_j_per_token_hi",
)


def _num(v: float | None, digits: int = 4) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def mean_ci(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """The mean of launch values with its 95 % Student's t interval over launches (one launch: no interval), the
    interval cut at 0 below. An arithmetic mean, since a launch may have no request within the SLO (a goodput of 0)."""
    if not values:
        return None, None, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None, None
    half = t_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, max(0.0, mean - half), mean + half


def arm_measured(result: ABResult, arm: ArmResult, level: Level) -> list[str]:
    """The arm's goodput (req/s, tok/s) and energy per token at one level, each with its CI, as CSV cells."""
    cells: list[str] = []
    for metric in ("goodput", "goodput_tok_s"):
        values = [v for la in arm.launches if (v := la.value_at(level, metric, result.slo)) is not None]
        cells += [_num(x) for x in mean_ci(values)] if result.slo is not None else ["", "", ""]
    energy = arm.energy_at(level)
    cells += [_num(energy.j_per_token), _num(energy.lo), _num(energy.hi)] if energy else ["", "", ""]
    return cells


def ab_csv(result: ABResult) -> str:
    """One row per timed run (invalid ones included, flagged): the raw data for a spreadsheet or pandas."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    open_loop = result.open_loop
    writer.writerow(CSV_FIELDS + (OPEN_LOOP_FIELDS if open_loop else ()) + MEASURED_FIELDS)
    by_level: dict[tuple[int, Level], list[str]] = {}
    for launch in result.launches:
        for r in launch.runs:
            if r.warmup:
                continue
            key = (launch.arm_index, r.level)
            if key not in by_level:
                by_level[key] = arm_measured(result, result.arms[launch.arm_index], r.level)
            got = run_attainment(r, result.slo) if result.slo is not None else None
            writer.writerow(
                [
                    result.experiment_id,
                    int(result.simulated),
                    launch.profile,
                    launch.arm_index,
                    result.arms[launch.arm_index].label,
                    launch.block + 1,
                    launch.position + 1,
                    launch.launch_id,
                    r.concurrency,
                    r.index + 1,
                    int(r.valid),
                    f"{r.tok_s:.4f}",
                    f"{r.aggregate_tok_s:.4f}",
                    r.tokens,
                    f"{r.seconds:.4f}",
                    "" if r.ttft_s is None else f"{r.ttft_s:.6f}",
                    "" if r.spec_accept_length is None else f"{r.spec_accept_length:.4f}",
                    r.invalid_reason or "",
                    (launch.attached or {}).get("url", ""),
                    *([f"{r.rate:g}" if r.rate else ""] if open_loop else []),
                    _num(got.req_s if got else None),
                    _num(got.tok_s if got else None),
                    _num(r.j_per_token),
                    *by_level[key],
                ]
            )
    return buf.getvalue()


def render(result: ABResult, requests: object = None) -> str:
    """`orch export --format csv`."""
    return ab_csv(result)

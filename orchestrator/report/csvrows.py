"""An experiment as CSV, one row per timed run (`orch export --format csv`)."""

from __future__ import annotations

import csv
import io

from orchestrator.results.model import ABResult

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


def ab_csv(result: ABResult) -> str:
    """One row per timed run (invalid ones included, flagged): the raw data for a spreadsheet or pandas."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    open_loop = result.open_loop
    writer.writerow(CSV_FIELDS + (OPEN_LOOP_FIELDS if open_loop else ()))
    for launch in result.launches:
        for r in launch.runs:
            if r.warmup:
                continue
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
                ]
            )
    return buf.getvalue()


def render(result: ABResult, requests: object = None) -> str:
    """`orch export --format csv`."""
    return ab_csv(result)

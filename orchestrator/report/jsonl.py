"""Per-request records of a stored experiment, one JSON line each (`orch export --format jsonl`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.results.model import ABResult

# Field order of `orch export --format jsonl`; counts (block, position, run, request) start at 1, as in the CSV.
JSONL_FIELDS = (
    "experiment_id",
    "simulated",
    "profile",
    "arm_index",
    "label",
    "launch_id",
    "block",
    "position",
    "concurrency",
    "run",
    "run_valid",
    "request",
    "tokens",
    "prompt_tokens",
    "ttft_s",
    "e2e_s",
    "chunks",
    "accept_length",
    "error",
    "attached",
)
# After those, in an open-loop experiment's lines only: the level's rate, when the request was due (seconds from the
# run's start), how late the client sent it, and how long of that a --max-concurrency cap held it.
OPEN_LOOP_FIELDS = ("rate", "scheduled_s", "send_lag_s", "queued_s")


def request_jsonl(result: ABResult, requests: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """One JSON object per line for each request of every timed run (warmups left out, invalid runs flagged), like
    AIPerf's per-record export; `requests` holds the store's rows per launch id (Store.requests)."""
    lines = []
    for launch in result.launches:
        valid = {(r.concurrency, r.rate or 0.0, r.index): r.valid for r in launch.runs if not r.warmup}
        for row in requests.get(launch.launch_id, ()):
            key = (int(row["run_concurrency"]), float(row.get("run_rate") or 0.0), int(row["run_idx"]))
            if row["run_warmup"] or key not in valid:
                continue
            record = {
                "experiment_id": result.experiment_id,
                "simulated": result.simulated,
                "profile": launch.profile,
                "arm_index": launch.arm_index,
                "label": result.arms[launch.arm_index].label,
                "launch_id": launch.launch_id,
                "block": launch.block + 1,
                "position": launch.position + 1,
                "concurrency": key[0],
                "run": key[2] + 1,
                "run_valid": valid[key],
                "request": int(row["idx"]) + 1,
                **{k: row.get(k) for k in ("tokens", "prompt_tokens", "ttft_s", "e2e_s", "chunks", "accept_length")},
                "error": row.get("error"),
                "attached": (launch.attached or {}).get("url"),
                "rate": key[1] or None,
                **{k: row.get(k) for k in ("scheduled_s", "send_lag_s", "queued_s")},
            }
            fields = JSONL_FIELDS + (OPEN_LOOP_FIELDS if key[1] else ())
            lines.append(json.dumps({k: record[k] for k in fields}))
    return "".join(line + "\n" for line in lines)


def render(result: ABResult, requests: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """`orch export --format jsonl`."""
    return request_jsonl(result, requests)

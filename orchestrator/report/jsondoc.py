"""An experiment as the `--json` document (`orch ab --json`, `orch show --json`, `orch export --format json`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.results.model import ABResult, ArmResult, LaunchResult
from orchestrator.results.run import Level, Rate

if TYPE_CHECKING:
    from orchestrator.results.run import RunResult


def _run_json(run: RunResult, launch: LaunchResult | None = None) -> dict[str, Any]:
    return {
        "tokens": run.tokens,
        "seconds": run.seconds,
        "tok_s": run.tok_s,
        "prompt_tokens": run.prompt_tokens,
        "ttft_s": run.ttft_s,
        "spec_accept_length": run.spec_accept_length,
        "spec_verify_ct": run.spec_verify_ct,
        "valid": run.valid,
        "invalid_reason": run.invalid_reason,
        "concurrency": run.concurrency,
        "aggregate_tok_s": run.aggregate_tok_s,
        "requests": run.requests,
        "errors": run.errors,
        "accept_source": run.accept_source,
        "token_source": run.token_source,
        "index": run.index,
        # "index" and "block" count from 0 (kept: a contract); the *_number fields count from 1 like text and CSV.
        "run_number": run.index + 1,
        **({"launch_id": launch.launch_id, "block": launch.block, "block_number": launch.block + 1} if launch else {}),
        **{k: run.metrics.get(k) for k in ("ttft", "itl", "tpot", "e2e", "chunks", "multi_token_chunks")},
        # drafted / accepted tokens and their ratio, where the engine reports them (None where it does not)
        "spec": run.metrics.get("spec"),
        # open loop only: the level's rate, and the run against its schedule (client.summary.open_loop_summary)
        **({"rate": run.rate, "open_loop": run.open_loop} if run.rate else {}),
    }


def level_keys(level: Level) -> dict[str, Any]:
    """Which level an entry is at: {"concurrency": c}, or for an open-loop level {"concurrency": None, "rate": r}."""
    return {"concurrency": None, "rate": float(level)} if isinstance(level, Rate) else {"concurrency": level}


def _level_json(arm: ArmResult, level: Level) -> dict[str, Any]:
    s, spread, agg = arm.summary_at(level), arm.spread_at(level), arm.aggregate_at(level)
    rl = arm.rate_level(level)
    return {
        **level_keys(level),
        "median_tok_s": spread.median if spread else None,
        "median_aggregate_tok_s": agg.median if agg else None,
        "summary": s.to_dict() if s else None,
        "spread": spread.to_dict() if spread else None,
        "launch_values": [launch.value_at(level) for launch in arm.launches],
        "accept_length": arm.accept_length_at(level),
        # open loop only: achieved vs offered rate, latency percentiles from the scheduled send, who limited it
        **({"open_loop": rl.to_dict()} if rl is not None else {}),
    }


def _arm_json(arm: ArmResult) -> dict[str, Any]:
    s, spread = arm.summary, arm.spread_at()
    first = arm.launches[0] if arm.launches else None
    return {
        "profile": arm.profile,
        "label": arm.label,
        "launch_id": arm.launch_id,
        "launch_ids": [launch.launch_id for launch in arm.launches],
        "launches": len(arm.launches),
        "runs": [_run_json(r, launch) for launch in arm.launches for r in launch.runs if not r.warmup],
        "warmup_runs": [_run_json(r, launch) for launch in arm.launches for r in launch.runs if r.warmup],
        "median_tok_s": spread.median if spread else None,
        "summary": s.to_dict() if s else None,
        "spread": spread.to_dict() if spread else None,
        "accept_length": arm.accept_length,
        "by_concurrency": [_level_json(arm, level) for level in arm.levels],
        "ready_s": first.ready_s if first and not first.attached else None,
        "attached": arm.attached_url,
        "env_check": next(
            (launch.env_report for launch in arm.launches if launch.env_report.get("ok", True) is False),
            first.env_report if first else None,
        ),
    }


def _launch_json(result: ABResult, launch: LaunchResult) -> dict[str, Any]:
    return {
        "profile": launch.profile,
        "arm_index": launch.arm_index,
        "label": result.arms[launch.arm_index].label,
        "launch_id": launch.launch_id,
        "block": launch.block,
        "position": launch.position,
        "block_number": launch.block + 1,
        "position_number": launch.position + 1,
        "ready_s": None if launch.attached else launch.ready_s,
        "env_ok": launch.env_report.get("ok", True),
        "attached": launch.attached,
        "values": [
            {
                **level_keys(level),
                "tok_s": launch.value_at(level),
                "aggregate_tok_s": launch.value_at(level, "aggregate_tok_s"),
                "ttft_s": launch.value_at(level, "ttft_s"),
                "runs": len(launch.timed_at(level)),
            }
            for level in launch.levels
        ],
        "gpus": launch.gpus,
    }


def ab_json(result: ABResult) -> dict[str, Any]:
    """The `--json` document. Field names are a contract with cron users: add, never rename."""
    levels = result.levels or [1]
    return {
        "experiment_id": result.experiment_id,
        "simulated": result.simulated,
        "attached": {arm.label: arm.attached_url for arm in result.arms if arm.attached_url},
        "status": result.status,
        "host": result.host,
        "host_facts": result.host_facts,
        "blocks": result.blocks,
        "design": result.design.to_dict(),
        "min_effect": result.min_effect,
        "arms": [_arm_json(a) for a in result.arms],
        "launches": [_launch_json(result, launch) for launch in result.launches],
        "comparisons": [c.to_dict() for c in result.comparisons],
        "speculation": [
            {"arm": arm.profile, "arm_label": arm.label, **be.to_dict()} for arm, be in result.speculation()
        ],
        "comparisons_by_concurrency": [c.to_dict() for level in levels for c in result.comparisons_at(level)],
        "warnings": result.warnings(),
        "notes": list(result.notes),
    }


def render(result: ABResult, requests: object = None) -> str:
    """`orch export --format json`: the document, indented."""
    return json.dumps(ab_json(result), indent=2) + "\n"

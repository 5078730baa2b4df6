"""An experiment as the `--json` document (`orch ab --json`, `orch show --json`, `orch export --format json`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.config.slo import DEFAULT_METRIC, METRICS
from orchestrator.report.lines import energy_note
from orchestrator.report.outputs import outputs_json
from orchestrator.report.sections import NO_JSON, sections
from orchestrator.results.byprompt import by_prompt
from orchestrator.results.cache import arm_cache_at
from orchestrator.results.categories import by_category, unsent
from orchestrator.results.goodput import run_attainment
from orchestrator.results.model import ABResult, ArmResult, LaunchResult
from orchestrator.results.run import Level, Rate
from orchestrator.results.turns import arm_turns_at
from orchestrator.stats.crossover import CAPACITY_METHOD

if TYPE_CHECKING:
    from orchestrator.config.slo import SLO
    from orchestrator.results.run import RunResult


def _run_json(run: RunResult, launch: LaunchResult | None = None, slo: SLO | None = None) -> dict[str, Any]:
    got = run_attainment(run, slo) if slo is not None else None
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
        # cached prompt tokens / prompt tokens of this run (results/cache; None where the server did not say)
        "prefix_cache": run.metrics.get("prefix_cache"),
        # multi-turn sessions only: the run's numbers by turn (client.summary.turn_summary)
        **({"turns": run.metrics["turns"]} if "turns" in run.metrics else {}),
        # under --slo: the run's good requests, goodput (req/s and tok/s) and attainment; null without per-request rows
        **({"goodput": got.to_dict() if got is not None else None} if slo is not None else {}),
        # joules over the steady window from nvidia-smi's power samples ({"error": why} when not measured; None for a
        # run that never tried) and per output token
        "energy": run.energy,
        "j_per_token": run.j_per_token,
        # open loop only: the level's rate, and the run against its schedule (client.summary.open_loop_summary)
        **({"rate": run.rate, "open_loop": run.open_loop} if run.rate else {}),
    }


def level_keys(level: Level) -> dict[str, Any]:
    """Which level an entry is at: {"concurrency": c}, or for an open-loop level {"concurrency": None, "rate": r}."""
    return {"concurrency": None, "rate": float(level)} if isinstance(level, Rate) else {"concurrency": level}


def _level_json(arm: ArmResult, level: Level, metric: str = DEFAULT_METRIC) -> dict[str, Any]:
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
        "prefix_cache": arm_cache_at(arm, level),
        **({"turns": turns} if (turns := arm_turns_at(arm, level)) else {}),
        **({"goodput": _goodput_json(arm, level)} if arm.slo is not None else {}),
        **({"metric": _metric_json(arm, level, metric)} if metric != DEFAULT_METRIC else {}),
        "energy": _energy_json(arm, level),
        # open loop only: achieved vs offered rate, latency percentiles from the scheduled send, who limited it
        **({"open_loop": rl.to_dict()} if rl is not None else {}),
    }


def _goodput_json(arm: ArmResult, level: Level) -> dict[str, Any]:
    """One arm at one level under the SLO: goodput's launch values and spread (req/s and tok/s), every request
    pooled (how many met every limit), and each percentile objective as the arm met it."""
    req, tok, pooled = arm.spread_at(level, "goodput"), arm.spread_at(level, "goodput_tok_s"), arm.attainment_at(level)
    checks = arm.objectives_at(level)
    return {
        "median_req_s": req.median if req else None,
        "median_tok_s": tok.median if tok else None,
        "spread_req_s": req.to_dict() if req else None,
        "spread_tok_s": tok.to_dict() if tok else None,
        "launch_values_req_s": [launch.value_at(level, "goodput", arm.slo) for launch in arm.launches],
        "launch_values_tok_s": [launch.value_at(level, "goodput_tok_s", arm.slo) for launch in arm.launches],
        "requests": pooled.requests if pooled else None,
        "good_requests": pooled.good if pooled else None,
        "attainment": pooled.fraction if pooled else None,
        "objectives": [
            {"objective": o.key, "limit_s": o.limit_s, "value_s": value, "met": met} for o, value, met in checks
        ],
        "slo_met": None if not checks or any(m is None for _, _, m in checks) else all(m for _, _, m in checks),
    }


def _metric_json(arm: ArmResult, level: Level, metric: str) -> dict[str, Any]:
    spread = arm.spread_at(level, metric)
    return {
        "name": metric,
        "median": spread.median if spread else None,
        "spread": spread.to_dict() if spread else None,
        "launch_values": [launch.value_at(level, metric, arm.slo) for launch in arm.launches],
    }


def _energy_json(arm: ArmResult, level: Level) -> dict[str, Any] | None:
    est = arm.energy_at(level)
    if est is not None:
        return {**est.to_dict(), "launch_values": [launch.energy_at(level) for launch in arm.launches]}
    why = arm.energy_missing_at(level)
    return {"j_per_token": None, "not_measured": why} if why else None


def _arm_json(arm: ArmResult, metric: str = DEFAULT_METRIC) -> dict[str, Any]:
    s, spread = arm.summary, arm.spread_at()
    first = arm.launches[0] if arm.launches else None
    return {
        "profile": arm.profile,
        "label": arm.label,
        "launch_id": arm.launch_id,
        "launch_ids": [launch.launch_id for launch in arm.launches],
        "launches": len(arm.launches),
        "runs": [_run_json(r, launch, arm.slo) for launch in arm.launches for r in launch.runs if not r.warmup],
        "warmup_runs": [_run_json(r, launch) for launch in arm.launches for r in launch.runs if r.warmup],
        "median_tok_s": spread.median if spread else None,
        "summary": s.to_dict() if s else None,
        "spread": spread.to_dict() if spread else None,
        "accept_length": arm.accept_length,
        "prefix_cache": arm_cache_at(arm),
        # multi-turn sessions only: TTFT, tok/s and prefix cache by turn at the headline level (results/turns)
        **({"turns": turns} if (turns := arm_turns_at(arm)) else {}),
        "energy": _energy_json(arm, arm.levels[0]) if arm.levels else None,
        "by_concurrency": [_level_json(arm, level, metric) for level in arm.levels],
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
                **({"goodput_req_s": launch.value_at(level, "goodput", result.slo)} if result.slo is not None else {}),
                **(
                    {result.metric: launch.value_at(level, result.metric, result.slo)}
                    if result.metric not in (DEFAULT_METRIC, "aggregate_tok_s")
                    else {}
                ),
            }
            for level in launch.levels
        ],
        "gpus": launch.gpus,
    }


def section_json(result: ABResult) -> dict[str, Any]:
    """The registered report sections (report/sections) that have a JSON value, by key."""
    return {s.key: s.data for s in sections(result) if s.data is not NO_JSON}


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
        # what the comparisons' ratios and verdicts are on (--metric), and the SLO goodput counts against (--slo)
        "metric": result.metric,
        "metric_higher_is_better": METRICS[result.metric].higher_is_better,
        "slo": result.slo.to_dict() if result.slo is not None else None,
        "slo_text": result.slo.text if result.slo is not None else None,
        "arms": [_arm_json(a, result.metric) for a in result.arms],
        "launches": [_launch_json(result, launch) for launch in result.launches],
        "comparisons": [c.to_dict() for c in result.comparisons],
        "speculation": [
            {"arm": arm.profile, "arm_label": arm.label, **be.to_dict()} for arm, be in result.speculation()
        ],
        "comparisons_by_concurrency": [c.to_dict() for level in levels for c in result.comparisons_at(level)],
        # where each arm's ratio to the first crosses 1 over the levels (two or more), with its 95 % CI
        "crossovers": [{"arm": arm.profile, "arm_label": arm.label, **x.to_dict()} for arm, x in result.crossovers()],
        # under --slo with a percentile objective: each arm's highest load within it (status "crosses": "at", "ci")
        "max_within_slo": [
            {"arm": arm.profile, "arm_label": arm.label, **x.to_dict(), "method": CAPACITY_METHOD}
            for arm, x in result.max_within_slo()
        ],
        # blocks whose margin missed the SLO at one level and met it again higher up (capacity at the first miss)
        "max_within_slo_notes": [r.to_dict() for r in result.slo_recoveries()],
        # the A/B on it: each arm's highest load within the SLO against the first arm's, with its CI and verdict
        "max_within_slo_comparisons": [c.to_dict() for c in result.capacity_comparisons()],
        "warnings": result.warnings(),
        "notes": list(result.notes),
        # Every registered section with a JSON value of its own (report/sections), under its key.
        **section_json(result),
        # --check-outputs: each arm's outputs against the baseline's (and the baseline's across blocks); accept
        # length per request: the mean of per-request values beside the token-weighted one (report/outputs)
        **outputs_json(result),
        # --sweep auto: the probe experiment, each arm's synchronous and saturated rates, the rates swept
        "sweep": result.sweep,
        "energy_comparisons_by_concurrency": [
            c.to_dict() for level in levels for c in result.energy_comparisons_at(level)
        ],
        # what the energy figures are (nvidia-smi's power field and its averaging window), or why there are none
        "energy_note": energy_note(result),
        # per prompt category (a dataset with two or more), per level: each arm's tok/s, each comparison's ratio
        "by_category": [bc.to_dict() for level in levels if (bc := by_category(result, level)) is not None],
        # per prompt, for a prompt set of at most 20 prompts that no breakdown by category covers (results/byprompt),
        # per level: each arm's tok/s and accept length, each comparison's ratio, and the prompts against the verdict
        "by_prompt": [bp.to_dict() for level in levels if (bp := by_prompt(result, level)) is not None],
        # the dataset's categories no timed run sent, with their prompts ([] when every one was; null for orch's own
        # prompts or a dataset that can no longer be read as it was)
        "categories_unsent": (
            [{"category": c, "prompts": n} for c, n in missing.items()]
            if (missing := unsent(result)) is not None
            else None
        ),
    }


def render(result: ABResult, requests: object = None) -> str:
    """`orch export --format json`: the document, indented."""
    return json.dumps(ab_json(result), indent=2) + "\n"

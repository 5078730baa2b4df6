"""Rendering results for people (text) and programs (JSON); no measuring, no I/O beyond returning strings."""

from __future__ import annotations

import statistics
from typing import Any

from orchestrator.ab import ABResult, ArmResult
from orchestrator.bench import BenchConfig, RunResult
from orchestrator.stats import BreakEven

SIM_BANNER = "SIMULATED: these numbers come from orch's SGLang simulator, not from a real server on a GPU."


def run_line(run: RunResult, config: BenchConfig) -> str:
    if run.warmup:
        return f"  Warmup {run.index + 1}/{config.warmup} done ({run.tokens} tokens)"
    if run.concurrency == 1:  # the seed's line, character for character
        line = (
            f"  Run {run.index + 1}/{config.runs}: {run.tokens} tokens in {run.seconds:.2f}s = {run.tok_s:.1f} tok/s "
            f"(prompt: {run.prompt_tokens} toks)"
        )
    else:
        itl = run.metrics.get("itl", {})
        line = (
            f"  Run {run.index + 1}/{config.runs} @ {run.concurrency} streams: {run.requests} requests, "
            f"{run.tokens} tokens in {run.seconds:.2f}s = {run.tok_s:.1f} tok/s per stream, "
            f"{run.aggregate_tok_s:.0f} tok/s aggregate"
            + (f", ITL p50 {itl['p50'] * 1000:.1f} ms" if itl.get("p50") is not None else "")
        )
    if run.spec_accept_length is not None:
        line += f" accept len {run.spec_accept_length:.2f}"
    if not run.valid:
        line += f"  INVALID: {run.invalid_reason}"
    return line


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def breakeven_lines(be: BreakEven, indent: str = "") -> list[str]:
    """The speculative-decoding explanation, in words a person checks with a calculator."""

    def alpha(a: float | None, tau: float) -> str:
        if a is None:
            return f"NOT reachable with {be.steps} draft steps (at most {be.steps + 1} tokens per cycle)"
        return f"needs per-token acceptance α ≥ {a:.3f} (chain model, {be.steps} steps)"

    lines = [
        f"baseline: {be.baseline_tps:.1f} tok/s = {be.baseline_token_ms:.2f} ms per token",
        f"speculative cycle: {be.cycle_ms:.1f} ms (draft + verify)",
        f"break-even accept length: {be.cycle_ms:.1f} / {be.baseline_token_ms:.2f} = {be.breakeven_tau:.3f} tokens "
        f"per cycle; {alpha(be.breakeven_alpha, be.breakeven_tau)}",
    ]
    if be.measured_tau is not None:
        verdict = "above" if be.measured_tau > be.breakeven_tau else "below"
        lines.append(
            f"measured accept length: {be.measured_tau:.2f} ({verdict} break-even"
            + (f"; α ≈ {be.measured_alpha:.3f})" if be.measured_alpha is not None else ")")
        )
    if be.target_tps is not None and be.target_tau is not None:
        lines.append(
            f"for {be.target_tps:.0f} tok/s: accept length {be.target_tau:.2f}; {alpha(be.target_alpha, be.target_tau)}"
        )
    return [indent + line for line in lines]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.append("  " + "  ".join(cells).rstrip())
        if n == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return out


def ab_text(result: ABResult) -> str:
    lines = ["", f"========== A/B results ({result.experiment_id}, host {result.host}) =========="]
    if result.simulated:
        lines.append(SIM_BANNER)
    base = result.arms[0]
    for level in base.levels or [1]:
        ratios = {c.arm: c for c in result.comparisons_at(level)}
        rows = [
            [
                "arm",
                "runs",
                "mean",
                "median",
                "min",
                "max",
                "stdev",
                "aggregate",
                "TTFT ms",
                "ITL p50",
                "ITL p99",
                "accept",
                "vs " + base.profile,
            ]
        ]
        for i, arm in enumerate(result.arms):
            s = arm.summary_at(level)
            timed = arm.timed_at(level)
            agg = arm.aggregate_at(level)
            accept = arm.accept_length_at(level)
            cmp = ratios.get(arm.profile)
            vs = "1.000" if i == 0 else (f"{cmp.ratio:.3f}" if cmp and cmp.ratio else "-")
            ttft = _median([r.ttft_s for r in timed if r.ttft_s is not None])
            itl50 = _median([r.metrics["itl"]["p50"] for r in timed if r.metrics.get("itl", {}).get("p50")])
            itl99 = _median([r.metrics["itl"]["p99"] for r in timed if r.metrics.get("itl", {}).get("p99")])
            cells = (
                ["-"] * 5
                if s is None
                else [f"{s.mean:.1f}", f"{s.median:.1f}", f"{s.min:.1f}", f"{s.max:.1f}", f"{s.stdev:.2f}"]
            )
            rows.append(
                [
                    arm.profile,
                    str(len(timed)),
                    *cells,
                    "-" if agg is None else f"{agg.median:.0f}",
                    _ms(ttft),
                    _ms(itl50),
                    _ms(itl99),
                    "-" if accept is None else f"{accept:.2f}",
                    vs,
                ]
            )
        lines.append(f"  tok/s per stream at concurrency {level}" + (" (simulated)" if result.simulated else ""))
        lines += _table(rows)
        for c in result.comparisons_at(level):
            if c.ratio is None:
                lines.append(f"  {c.arm} vs {c.vs} @ {level}: no valid runs to compare")
            else:
                pct = (c.ratio - 1) * 100
                word = "faster" if pct >= 0 else "slower"
                lines.append(
                    f"  {c.arm} vs {c.vs} @ {level}: {c.ratio:.3f}x ({abs(pct):.1f}% {word}, one launch per arm: "
                    "restart-to-restart noise is not estimated)"
                )
        lines.append("")
    for spec_arm, be in result.speculation():
        lines.append(
            f"  why {spec_arm} runs at this speed (speculative decoding vs {base.profile}, concurrency "
            f"{base.levels[0] if base.levels else 1}):"
        )
        lines += breakeven_lines(be, indent="    ")
    for arm in result.arms:
        for r in arm.invalid_runs:
            lines.append(f"  excluded: {arm.profile} run {r.index + 1} @ {r.concurrency}: {r.invalid_reason}")
        sources = {r.accept_source for r in arm.timed_at() if r.accept_source}
        if sources:
            lines.append(f"  {arm.profile}: accept length from {', '.join(sorted(sources))}")
    env_bad = [a.profile for a in result.arms if not a.env_report.get("ok", True)]
    if env_bad:
        lines.append(f"  WARNING: environment mismatches in {', '.join(env_bad)} (see above)")
    return "\n".join(lines).rstrip()


def _run_json(run: RunResult) -> dict[str, Any]:
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
        **{k: run.metrics.get(k) for k in ("ttft", "itl", "tpot", "e2e", "chunks", "multi_token_chunks")},
    }


def _level_json(arm: ArmResult, level: int) -> dict[str, Any]:
    s, agg = arm.summary_at(level), arm.aggregate_at(level)
    return {
        "concurrency": level,
        "median_tok_s": s.median if s else None,
        "median_aggregate_tok_s": agg.median if agg else None,
        "summary": s.to_dict() if s else None,
        "accept_length": arm.accept_length_at(level),
    }


def _arm_json(arm: ArmResult) -> dict[str, Any]:
    s = arm.summary
    return {
        "profile": arm.profile,
        "launch_id": arm.launch_id,
        "runs": [_run_json(r) for r in arm.runs if not r.warmup],
        "warmup_runs": [_run_json(r) for r in arm.runs if r.warmup],
        "median_tok_s": s.median if s else None,
        "summary": s.to_dict() if s else None,
        "accept_length": arm.accept_length,
        "by_concurrency": [_level_json(arm, level) for level in arm.levels],
        "ready_s": arm.ready_s,
        "env_check": arm.env_report,
    }


def ab_json(result: ABResult) -> dict[str, Any]:
    """The `--json` document. Field names are a contract with cron users: add, never rename."""
    levels = result.arms[0].levels or [1]
    return {
        "experiment_id": result.experiment_id,
        "simulated": result.simulated,
        "host": result.host,
        "host_facts": result.host_facts,
        "arms": [_arm_json(a) for a in result.arms],
        "comparisons": [{"arm": c.arm, "vs": c.vs, "ratio": c.ratio} for c in result.comparisons],
        "speculation": [{"arm": arm, **be.to_dict()} for arm, be in result.speculation()],
        "comparisons_by_concurrency": [
            {
                "arm": c.arm,
                "vs": c.vs,
                "concurrency": c.concurrency,
                "ratio": c.ratio,
                "aggregate_ratio": c.aggregate_ratio,
            }
            for level in levels
            for c in result.comparisons_at(level)
        ],
    }

"""Rendering results for people (text) and programs (JSON); no measuring, no I/O beyond returning strings."""

from __future__ import annotations

from typing import Any

from orchestrator.ab import ABResult, ArmResult
from orchestrator.bench import BenchConfig, RunResult

SIM_BANNER = "SIMULATED: these numbers come from orch's SGLang simulator, not from a real server on a GPU."


def run_line(run: RunResult, config: BenchConfig) -> str:
    if run.warmup:
        return f"  Warmup {run.index + 1}/{config.warmup} done ({run.tokens} tokens)"
    line = (
        f"  Run {run.index + 1}/{config.runs}: {run.tokens} tokens in {run.seconds:.2f}s = {run.tok_s:.1f} tok/s "
        f"(prompt: {run.prompt_tokens} toks)"
    )
    if run.spec_accept_length is not None:
        line += f" accept len {run.spec_accept_length:.2f}"
    if not run.valid:
        line += f"  INVALID: {run.invalid_reason}"
    return line


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
    rows = [["arm", "runs", "mean", "median", "min", "max", "stdev", "accept", "vs " + result.arms[0].profile]]
    ratios = {c.arm: c.ratio for c in result.comparisons}
    for i, arm in enumerate(result.arms):
        s = arm.summary
        accept = f"{arm.accept_length:.2f}" if arm.accept_length is not None else "-"
        vs = "1.000" if i == 0 else (f"{ratios[arm.profile]:.3f}" if ratios.get(arm.profile) else "-")
        if s is None:
            rows.append([arm.profile, "0", "-", "-", "-", "-", "-", accept, vs])
        else:
            rows.append(
                [
                    arm.profile,
                    str(s.n),
                    f"{s.mean:.1f}",
                    f"{s.median:.1f}",
                    f"{s.min:.1f}",
                    f"{s.max:.1f}",
                    f"{s.stdev:.2f}",
                    accept,
                    vs,
                ]
            )
    lines.append("  tok/s per single stream" + (" (simulated)" if result.simulated else ""))
    lines += _table(rows)
    for c in result.comparisons:
        if c.ratio is None:
            lines.append(f"  {c.arm} vs {c.vs}: no valid runs to compare")
        else:
            pct = (c.ratio - 1) * 100
            word = "faster" if pct >= 0 else "slower"
            lines.append(
                f"  {c.arm} vs {c.vs}: {c.ratio:.3f}x ({abs(pct):.1f}% {word}, one launch per arm: "
                "restart-to-restart noise is not estimated)"
            )
    env_bad = [a.profile for a in result.arms if not a.env_report.get("ok", True)]
    if env_bad:
        lines.append(f"  WARNING: environment mismatches in {', '.join(env_bad)} (see above)")
    return "\n".join(lines)


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
        "ready_s": arm.ready_s,
        "env_check": arm.env_report,
    }


def ab_json(result: ABResult) -> dict[str, Any]:
    """The `--json` document. Field names are a contract with cron users: add, never rename."""
    return {
        "experiment_id": result.experiment_id,
        "simulated": result.simulated,
        "host": result.host,
        "host_facts": result.host_facts,
        "arms": [_arm_json(a) for a in result.arms],
        "comparisons": [{"arm": c.arm, "vs": c.vs, "ratio": c.ratio} for c in result.comparisons],
    }

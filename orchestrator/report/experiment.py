"""Rendering results for people (text) and programs (JSON); no measuring, no I/O beyond returning strings."""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.results.model import ABResult, ArmResult, Comparison, LaunchResult
from orchestrator.stats.estimates import BreakEven

if TYPE_CHECKING:
    from orchestrator.results.run import RunResult

SIM_BANNER = "SIMULATED: these numbers come from orch's simulator (of SGLang or vLLM), not from a real server on a GPU."


def attached_banner(result: ABResult) -> list[str]:
    """Said before any number: which arms ran on servers orch did not launch, and what that means."""
    arms = [arm for arm in result.arms if arm.attached_url]
    if not arms:
        return []
    mixed = len(arms) < len([arm for arm in result.arms if arm.launches])
    where = ", ".join(f"{arm.label} on {arm.attached_url}" for arm in arms)
    lines = [
        f"ATTACHED: {where}: measured on running server(s) orch did not launch. State NOT fresh (no restart "
        f"between blocks), environment NOT verified; host facts are {result.host}'s, not the attached server's."
    ]
    if mixed:
        lines.append("WARNING: MIXED COMPARISON of attached and launched arms (--allow-mixed); see the warnings below.")
    return lines


def node_mismatch_lines(result: ABResult) -> list[str]:
    """Said before any number (and again among the warnings): the nodes of the multi-node group differed."""
    node = result.node_mismatch()
    return [node] if node else []


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


def text_table(rows: list[list[str]]) -> list[str]:
    """rows (a header first) as aligned plain-text lines: the first column left, the numbers right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.append("  " + "  ".join(cells).rstrip())
        if n == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


HEADER = [
    "arm",
    "launches",
    "runs",
    "median",
    "min",
    "max",
    "CV in",
    "CV across",
    "aggregate",
    "TTFT ms",
    "ITL p50",
    "ITL p99",
    "accept",
]


def _arm_row(arm: ArmResult, level: int, vs: str) -> list[str]:
    """One arm at one level. median = median of launch values; min/max over runs; CVs within/across launches."""
    spread, s = arm.spread_at(level), arm.summary_at(level)
    timed = arm.timed_at(level)
    agg = arm.aggregate_at(level)
    accept = arm.accept_length_at(level)
    ttft = _median([r.ttft_s for r in timed if r.ttft_s is not None])
    itl50 = _median([r.metrics["itl"]["p50"] for r in timed if r.metrics.get("itl", {}).get("p50")])
    itl99 = _median([r.metrics["itl"]["p99"] for r in timed if r.metrics.get("itl", {}).get("p99")])
    return [
        arm.label,
        str(len(arm.launches)),
        str(len(timed)),
        _f(spread.median if spread else None),
        _f(s.min if s else None),
        _f(s.max if s else None),
        _pct(spread.cv_within if spread else None),
        _pct(spread.cv_across if spread else None),
        "-" if agg is None else f"{agg.median:.0f}",
        _ms(ttft),
        _ms(itl50),
        _ms(itl99),
        _f(accept, 2),
        vs,
    ]


def level_rows(result: ABResult, level: int) -> list[list[str]]:
    """The header and one row per arm at one concurrency level (text and Markdown share them)."""
    ratios = {c.arm_index: c for c in result.comparisons_at(level)}
    if not is_ab(result):  # one arm: nothing to be "vs"
        return [HEADER, *(_arm_row(arm, level, "")[:-1] for arm in result.arms)]
    rows = [[*HEADER, "vs " + result.arms[0].label]]
    for i, arm in enumerate(result.arms):
        cmp = ratios.get(i)
        rows.append(_arm_row(arm, level, "1.000" if i == 0 else (f"{cmp.ratio:.3f}" if cmp and cmp.ratio else "-")))
    return rows


def is_ab(result: ABResult) -> bool:
    """Whether the experiment compares arms (`orch ab`) or measures one (`orch bench`)."""
    return len(result.arms) > 1


def title(result: ABResult) -> str:
    """The report's heading: an A/B names what it compares, a single-arm benchmark names its profile."""
    if is_ab(result):
        return f"A/B results ({result.experiment_id}, host {result.host_label})"
    return f"benchmark of {result.arms[0].label} ({result.experiment_id}, host {result.host_label})"


def comparison_line(c: Comparison) -> str:
    """One arm against the baseline: the ratio, its 95 % CI over blocks, and what may be concluded from it."""
    head = f"{c.arm_label or c.arm} vs {c.vs_label or c.vs} @ {c.concurrency}: "
    est = c.estimate
    if c.ratio is None or est is None:
        return head + "no block in which both have valid runs: nothing to compare"
    pct = abs(c.ratio - 1) * 100
    word = "faster" if c.ratio >= 1 else "slower"
    if est.blocks < 2:
        return (
            head + f"{c.ratio:.3f}x ({pct:.1f}% {word} in one block) -> inconclusive: one launch per arm cannot "
            "separate restart noise from a real difference (use --blocks 3 or more)"
        )
    line = head + f"{c.ratio:.3f}x, 95% CI [{est.lo:.3f}, {est.hi:.3f}] over {est.blocks} blocks -> "
    me = c.min_effect * 100
    if c.verdict in ("faster", "slower"):
        line += f"{c.verdict.upper()} by {pct:.1f}%"
    elif c.verdict == "no difference":
        line += f"no difference (the CI lies within ±{me:.1f}%)"
    else:
        line += f"inconclusive (the CI is too wide to call ±{me:.1f}%)"
        if c.advice:
            line += f"; {c.advice}"
    if c.mde is not None:
        line += f"; minimal detectable effect {c.mde * 100:.1f}%"
    return line


def ci_method_line(comparisons: Sequence[Comparison]) -> str | None:
    """How the CIs of these comparisons were built (paired or not, widened or not): said once per level, and only
    where there is a CI (two or more blocks)."""
    methods = list(dict.fromkeys(c.estimate.method for c in comparisons if c.estimate and c.estimate.blocks >= 2))
    return f"CI: {'; '.join(methods)}" if methods else None


def _design_lines(result: ABResult) -> list[str]:
    d = result.design
    head = f"  design: {d.blocks} block(s)" + _order_text(result)
    lines = [head]
    if d.blocks < 2 and len(result.arms) < 2:
        return lines
    by_slot = {(launch.block, launch.arm_index): launch for launch in result.launches}
    cut = {(c.block, c.arm_index): c.status for c in result.cut_short}
    level = result.levels[0] if result.levels else 1
    for b, order in enumerate(d.schedule):
        cells = []
        for arm in order:
            launch = by_slot.get((b, arm))
            if launch is not None:
                state = _f(launch.value_at(level))
            elif (b, arm) in cut:
                state = f"cut short ({cut[(b, arm)]}; not in the statistics)"
            else:
                state = "not run"
            cells.append(f"{result.arms[arm].label} {state}")
        lines.append(f"    block {b + 1}: " + ", ".join(cells))
    return lines


def _order_text(result: ABResult) -> str:
    # With one arm there is no order within a block to speak of.
    d = result.design
    if not is_ab(result):
        return ", one launch each"
    return f", launch order {d.order}" + (f" (seed {d.seed})" if d.order == "random" else "")


def ab_text(result: ABResult) -> str:
    lines = ["", f"========== {title(result)} =========="]
    if result.simulated:
        lines.append(SIM_BANNER)
    lines += attached_banner(result)
    lines += [f"  WARNING: {w}" for w in node_mismatch_lines(result)]
    for note in result.notes:
        lines.append(f"  NOTE: {note}")
    lines += _design_lines(result)
    base = result.arms[0]
    for level in result.levels or [1]:
        rows = level_rows(result, level)
        lines.append(
            f"  tok/s per stream at concurrency {level}" + (" (simulated)" if result.simulated else "") + ": median "
            "of launch medians; min/max over runs; CV within and across launches"
            + ("; vs: mean per-block ratio" if is_ab(result) else "")
        )
        lines += text_table(rows)
        for c in result.comparisons_at(level):
            lines.append("  " + comparison_line(c))
        if method := ci_method_line(result.comparisons_at(level)):
            lines.append(f"    {method}")
        lines.append("")
    for spec_arm, be in result.speculation():
        lines.append(
            f"  why {spec_arm.label} runs at this speed (speculative decoding vs {base.label}, concurrency "
            f"{result.levels[0] if result.levels else 1}):"
        )
        lines += breakeven_lines(be, indent="    ")
    if recommendation := _whatif_line(result):
        lines.append(f"  {recommendation}")
    for arm in result.arms:
        for launch in arm.launches:
            for r in launch.invalid_runs:
                lines.append(
                    f"  excluded: {arm.label} block {launch.block + 1} run {r.index + 1} @ {r.concurrency}: "
                    f"{r.invalid_reason}"
                )
        sources = {r.accept_source for r in arm.timed_at() if r.accept_source}
        if sources:
            lines.append(f"  {arm.label}: accept length from {', '.join(sorted(sources))}")
    for warning in result.warnings():
        lines.append(f"  WARNING: {warning}")
    return "\n".join(lines).rstrip()


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
    }


def _level_json(arm: ArmResult, level: int) -> dict[str, Any]:
    s, spread, agg = arm.summary_at(level), arm.spread_at(level), arm.aggregate_at(level)
    return {
        "concurrency": level,
        "median_tok_s": spread.median if spread else None,
        "median_aggregate_tok_s": agg.median if agg else None,
        "summary": s.to_dict() if s else None,
        "spread": spread.to_dict() if spread else None,
        "launch_values": [launch.value_at(level) for launch in arm.launches],
        "accept_length": arm.accept_length_at(level),
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
                "concurrency": level,
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


def ab_csv(result: ABResult) -> str:
    """One row per timed run (invalid ones included, flagged): the raw data for a spreadsheet or pandas."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
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
                ]
            )
    return buf.getvalue()


def md_table(rows: list[list[str]]) -> list[str]:
    """rows (a header first) as a Markdown table: the first column left-aligned, the numbers right-aligned."""
    out = [
        "| " + " | ".join(rows[0]) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(rows[0]))) + "|",
    ]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows[1:]]
    return out


def ab_markdown(result: ABResult) -> str:
    """The report as Markdown, for a ticket or a pull request."""
    head = "A/B" if is_ab(result) else f"Benchmark of {result.arms[0].label},"
    lines = [f"# {head} {result.experiment_id} on {result.host_label}", ""]
    if result.simulated:
        lines += [f"**{SIM_BANNER}**", ""]
    lines += [line for banner in attached_banner(result) for line in (f"**{banner}**", "")]
    lines += [line for w in node_mismatch_lines(result) for line in (f"**WARNING: {w}**", "")]
    d = result.design
    lines.append(
        f"Status: {result.status}. Design: {d.blocks} block(s)"
        + _order_text(result)
        + f"; minimum effect of interest ±{result.min_effect * 100:.1f}%."
    )
    lines += [f"> NOTE: {n}" for n in result.notes]
    for level in result.levels or [1]:
        rows = level_rows(result, level)
        lines += ["", f"## tok/s per stream at concurrency {level}", ""]
        lines += md_table(rows)
        lines.append("")
        lines += [f"- {comparison_line(c)}" for c in result.comparisons_at(level)]
        if method := ci_method_line(result.comparisons_at(level)):
            lines.append(f"- {method}")
    spec = result.speculation()
    if spec:
        lines += ["", "## Speculative decoding", ""]
        for spec_arm, be in spec:
            lines.append(f"{spec_arm.label}:")
            lines += [f"- {line}" for line in breakeven_lines(be)]
        if recommendation := _whatif_line(result):
            lines.append(f"- {recommendation}")
    warnings = result.warnings()
    if warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def _whatif_line(result: ABResult) -> str | None:
    """`orch whatif`'s one-line recommendation when the experiment measured two or more step counts of one drafter."""
    from orchestrator.whatif import predict

    return predict.recommendation_line(result)

"""What every report of an experiment says, whatever its format: the banners, the table rows, the comparison and
break-even lines, the design in words."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.client.summary import lag_text
from orchestrator.results.model import ABResult, ArmResult, Comparison
from orchestrator.results.run import Level, Rate, level_name, level_phrase
from orchestrator.stats.estimates import BreakEven

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


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def number(value: float | None, digits: int = 1) -> str:
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


def _arm_row(arm: ArmResult, level: Level, vs: str) -> list[str]:
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
        number(spread.median if spread else None),
        number(s.min if s else None),
        number(s.max if s else None),
        _pct(spread.cv_within if spread else None),
        _pct(spread.cv_across if spread else None),
        "-" if agg is None else f"{agg.median:.0f}",
        _ms(ttft),
        _ms(itl50),
        _ms(itl99),
        number(accept, 2),
        vs,
    ]


def level_rows(result: ABResult, level: Level) -> list[list[str]]:
    """The header and one row per arm at one level (text and Markdown share them)."""
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
    head = f"{c.arm_label or c.arm} vs {c.vs_label or c.vs} @ {level_name(c.concurrency)}: "
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


def order_text(result: ABResult) -> str:
    # With one arm there is no order within a block to speak of.
    d = result.design
    if not is_ab(result):
        return ", one launch each"
    return f", launch order {d.order}" + (f" (seed {d.seed})" if d.order == "random" else "")


def whatif_line(result: ABResult) -> str | None:
    """`orch whatif`'s one-line recommendation when the experiment measured two or more step counts of one drafter."""
    from orchestrator.whatif import predict

    return predict.recommendation_line(result)


def level_heading(level: Level) -> str:
    """What a level's table shows, as its heading says it."""
    if isinstance(level, Rate):
        return (
            f"tok/s per stream at {level_phrase(level)} (open loop: each request's time counts from when it was "
            "scheduled)"
        )
    return f"tok/s per stream at {level_phrase(level)}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def rate_lines(result: ABResult, level: Level) -> list[str]:
    """At an open-loop level, each arm's achieved rate against the offered one and its latency percentiles from the
    scheduled send time; a shortfall says who held the rate back (also among the warnings). [] at a concurrency
    level."""
    out = []
    for arm in result.arms:
        rl = arm.rate_level(level)
        if rl is None:
            continue
        achieved = "-" if rl.achieved_rate is None else f"{rl.achieved_rate:.2f}"
        scheduled = "-" if rl.scheduled_rate is None else f"{rl.scheduled_rate:.2f}"
        line = (
            f"{arm.label} @ {level_name(level)}: achieved {achieved} req/s of {scheduled} scheduled "
            f"({rl.rate:g} offered); TTFT p50 {_seconds(rl.ttft_p50_s)}, p99 {_seconds(rl.ttft_p99_s)}; "
            f"E2E p50 {_seconds(rl.e2e_p50_s)}, p99 {_seconds(rl.e2e_p99_s)}; send lag p99 "
            + ("-" if rl.send_lag_p99_s is None else lag_text(rl.send_lag_p99_s))
            + (f"; {rl.held} requests held by the cap" if rl.held else "")
            + (f"; peak {rl.peak_in_flight} in flight" if rl.peak_in_flight is not None else "")
        )
        if rl.limited is not None:
            line += f" -> SHORT OF ITS RATE ({rl.limited}-limited)"
        out.append(line)
    return out

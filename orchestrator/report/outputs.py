"""What every format says of the lossless check (--check-outputs) and of accept length per request."""

from __future__ import annotations

from typing import Any

from orchestrator.results.model import ABResult
from orchestrator.results.outputs import AcceptDistribution, OutputsCheck, accept_distributions, outputs_check
from orchestrator.results.run import Level, level_name

OUTPUTS_HEADING = "lossless check (--check-outputs"


def check_line(c: OutputsCheck) -> str:
    """One comparison of outputs: the share identical, where they diverge, the first divergence."""
    head = f"{c.arm} vs {c.vs}: "
    if not c.compared:
        return head + c.reading()
    share = c.share or 0.0
    text = f"{head}{c.identical}/{c.compared} prompts identical ({share:.1%})"
    first = c.first
    if first is None:
        return text
    where = f" median at {c.median_position:.0%} of the output" if c.median_position is not None else ""
    text += f"; {len(c.divergences)} diverged,{where}"
    text += (
        f"; first: block {first.block + 1} @ {level_name(first.level)} run {first.run + 1} request {first.request} "
        f'after {first.position} of {first.length} {first.unit}s: "{first.base}" vs "{first.arm}"'
    )
    return text


def outputs_lines(result: ABResult) -> list[str]:
    """The heading, then per comparison its line and what it may mean; [] without kept outputs."""
    checks = outputs_check(result)
    if not checks:
        return []
    sent = sorted({t for c in checks for t in c.temperatures}, key=str)
    greedy = all(c.greedy for c in checks)
    said = ", ".join(map(str, sent)) or "unknown"
    out = [f"{OUTPUTS_HEADING}; temperature {said} sent to every arm{': greedy' if greedy else ''}):"]
    for c in checks:
        out.append(check_line(c))
        out.append(f"  {c.reading()}")
        if (versus := c.versus_control) is not None:
            out.append(f"  against the control: {versus.sentence()}")
    return out


def accept_line(d: AcceptDistribution) -> str:
    shown = d.to_dict()
    return (
        f"{d.arm}: mean of per-request {d.per_request_mean:.2f} vs token-weighted {d.token_weighted:.2f} "
        f"({d.requests} requests; p10 {shown['p10']:.2f}, median {shown['median']:.2f}, p90 {shown['p90']:.2f})"
    )


def accept_lines(result: ABResult, level: Level | None = None) -> list[str]:
    """Accept length per request at a level, each arm that has it; [] when no request reported one."""
    found = accept_distributions(result, level)
    if not found:
        return []
    at = level if level is not None else found[0].level
    return [
        f"accept length per request @ {level_name(at)} (token-weighted: all tokens / all target passes, which weighs "
        "each request by its passes, so long and poorly accepted completions count more; vLLM issue 42690):"
    ] + [accept_line(d) for d in found]


def outputs_json(result: ABResult) -> dict[str, Any]:
    """The JSON document's additions: `outputs_check` (null without --check-outputs) and
    `accept_length_per_request` (each level, each arm that reported accept lengths per request)."""
    checks = outputs_check(result)
    return {
        "outputs_check": [c.to_dict() for c in checks] if checks else None,
        "accept_length_per_request": [
            d.to_dict() for level in result.levels or [1] for d in accept_distributions(result, level)
        ],
    }

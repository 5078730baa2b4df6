"""An experiment's report as Markdown, for a ticket or a pull request (`orch export --format md`)."""

from __future__ import annotations

from orchestrator.report.lines import (
    SIM_BANNER,
    attached_banner,
    breakeven_lines,
    category_heading,
    category_lines,
    category_rows,
    ci_method_line,
    comparison_line,
    crossover_lines,
    energy_lines,
    energy_note,
    is_ab,
    level_heading,
    level_rows,
    metric_heading,
    metric_line,
    metric_rows,
    node_mismatch_lines,
    one_category_line,
    order_text,
    rate_lines,
    slo_capacity_lines,
    slo_heading,
    slo_line,
    slo_rows,
    sweep_lines,
    whatif_line,
)
from orchestrator.report.outputs import accept_lines, outputs_lines
from orchestrator.results.cache import cache_lines
from orchestrator.results.categories import by_category
from orchestrator.results.model import ABResult
from orchestrator.results.run import Level, level_name, level_phrase
from orchestrator.results.turns import turn_lines


def md_table(rows: list[list[str]]) -> list[str]:
    """rows (a header first) as a Markdown table: the first column left-aligned, the numbers right-aligned."""
    out = [
        "| " + " | ".join(rows[0]) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(rows[0]))) + "|",
    ]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows[1:]]
    return out


def _category_md(result: ABResult, level: Level) -> list[str]:
    """The level's breakdown by category, or the sentence saying the workload has a single one."""
    if (bc := by_category(result, level)) is not None:
        return [
            *("", f"### By category at {level_name(bc.level)}", "", category_heading(bc) + ".", ""),
            *md_table(category_rows(bc)),
            "",
            *(f"- {line}" for line in category_lines(bc)),
        ]
    return [f"- {one}"] if (one := one_category_line(result)) else []


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
        + order_text(result)
        + f"; minimum effect of interest ±{result.min_effect * 100:.1f}%."
    )
    lines += [f"> NOTE: {n}" for n in result.notes]
    if sweep := sweep_lines(result):
        lines += ["", sweep[0] + "; " + sweep[1].strip() + "."]
    lines += [part for line in (metric_line(result), slo_line(result)) if line for part in ("", line + ".")]
    for level in result.levels or [1]:
        rows = level_rows(result, level)
        lines += ["", f"## {level_heading(level)}", ""]
        lines += md_table(rows)
        if result.slo is not None:
            lines += ["", f"### Goodput at {level_phrase(level)}", "", slo_heading(result, level) + ".", ""]
            lines += md_table(slo_rows(result, level))
        if heading := metric_heading(result, level):
            lines += ["", f"### {result.metric} at {level_phrase(level)}", "", heading + ".", ""]
            lines += md_table(metric_rows(result, level))
        lines.append("")
        lines += [f"- {line}" for line in rate_lines(result, level)]
        lines += [f"- {comparison_line(c)}" for c in result.comparisons_at(level)]
        if method := ci_method_line(result.comparisons_at(level)):
            lines.append(f"- {method}")
        lines += _category_md(result, level)
        if energy := energy_lines(result, level):
            lines += ["", f"### {energy[0][0].upper()}{energy[0][1:]}", ""] + [f"- {line}" for line in energy[1:]]
    if crossings := crossover_lines(result):
        lines += ["", "## Where speculation stops paying", ""] + [f"- {line}" for line in crossings]
    if capacity := slo_capacity_lines(result):
        lines += ["", "## Highest load within the SLO", "", capacity[0]] + [
            f"- {line.strip()}" for line in capacity[1:]
        ]
    spec = result.speculation()
    if spec:
        lines += ["", "## Speculative decoding", ""]
        for spec_arm, be in spec:
            lines.append(f"{spec_arm.label}:")
            lines += [f"- {line}" for line in breakeven_lines(be)]
        if recommendation := whatif_line(result):
            lines.append(f"- {recommendation}")
    if is_ab(result) and (accept := accept_lines(result)):
        lines += ["", "## Accept length per request", "", accept[0]] + [f"- {line}" for line in accept[1:]]
    if checked := outputs_lines(result):
        lines += ["", "## Lossless check", "", checked[0]]
        lines += [f"- {line}" if not line.startswith("  ") else f"  - {line.strip()}" for line in checked[1:]]
    if note := energy_note(result):
        lines += ["", f"_{note}_"]
    if cached := cache_lines(result):
        lines += ["", "## Prefix cache", ""] + [f"- {line}" for line in cached]
    if by_turn := turn_lines(result):
        lines += ["", "## By turn", ""] + [f"- {line}" for line in by_turn]
    warnings = result.warnings()
    if warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def render(result: ABResult, requests: object = None) -> str:
    """`orch export --format md`."""
    return ab_markdown(result)

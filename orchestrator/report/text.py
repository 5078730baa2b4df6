"""An experiment's report as plain text: what `orch ab`, `orch bench` and `orch show` print."""

from __future__ import annotations

from orchestrator.common.printable import visible
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
    number,
    one_category_line,
    order_text,
    prompt_heading,
    prompt_lines,
    prompt_rows,
    rate_lines,
    slo_capacity_lines,
    slo_heading,
    slo_line,
    slo_rows,
    sweep_lines,
    title,
    unsent_lines,
    whatif_line,
)
from orchestrator.report.outputs import accept_lines, outputs_lines
from orchestrator.report.sections import Section, sections
from orchestrator.results.byprompt import by_prompt
from orchestrator.results.categories import by_category
from orchestrator.results.model import ABResult
from orchestrator.results.run import Level, level_name, level_phrase
from orchestrator.results.turns import turn_lines


def text_table(rows: list[list[str]]) -> list[str]:
    """rows (a header first) as aligned plain-text lines: the first column left, the numbers right. A cell's control
    characters are shown as escapes before the columns are measured: a newline in a category or an arm's name
    stays inside its row."""
    rows = [[visible(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.append("  " + "  ".join(cells).rstrip())
        if n == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return out


def section_lines(section: Section) -> list[str]:
    """A report section (report/sections) in the terminal report: its heading, table, sentences and note."""
    lines = [f"  {section.title}:"] if section.text_heading else []
    if section.table:
        lines += text_table([list(row) for row in section.table])
    lines += [f"  {item}" for item in section.items]
    return lines + ([f"  {section.note}"] if section.note else [])


def _design_lines(result: ABResult) -> list[str]:
    d = result.design
    head = f"  design: {d.blocks} block(s)" + order_text(result)
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
                state = number(launch.value_at(level))
            elif (b, arm) in cut:
                state = f"cut short ({cut[(b, arm)]}; not in the statistics)"
            else:
                state = "not run"
            cells.append(f"{result.arms[arm].label} {state}")
        lines.append(f"    block {b + 1}: " + ", ".join(cells))
    return lines


def _breakdown_lines(result: ABResult, level: Level) -> list[str]:
    """The level's results by category (or the one-category sentence), and by prompt for a small prompt set."""
    lines = []
    if (bc := by_category(result, level)) is not None:
        lines.append(f"  {category_heading(bc)}")
        lines += text_table(category_rows(bc))
        lines += [f"  {line}" for line in category_lines(bc)]
    elif one := one_category_line(result):
        lines.append(f"  {one}")
    if (bp := by_prompt(result, level)) is not None:
        lines.append(f"  {prompt_heading(bp)}")
        lines += text_table(prompt_rows(bp))
        lines += [f"  {line}" for line in prompt_lines(bp)]
    return lines


def ab_text(result: ABResult) -> str:
    lines = ["", f"========== {title(result)} =========="]
    if result.simulated:
        lines.append(SIM_BANNER)
    lines += attached_banner(result)
    lines += [f"  WARNING: {w}" for w in node_mismatch_lines(result)]
    for note in result.notes:
        lines.append(f"  NOTE: {note}")
    lines += _design_lines(result)
    lines += [f"  {line}" for line in sweep_lines(result)]
    lines += [f"  {line}" for line in (metric_line(result), slo_line(result)) if line]
    base = result.arms[0]
    for level in result.levels or [1]:
        rows = level_rows(result, level)
        lines.append(
            f"  {level_heading(level)}" + (" (simulated)" if result.simulated else "") + ": median "
            "of launch medians; min/max over runs; CV within and across launches"
            + ("; vs: mean per-block ratio" if is_ab(result) else "")
        )
        lines += text_table(rows)
        if result.slo is not None:
            lines.append(f"  {slo_heading(result, level)}")
            lines += text_table(slo_rows(result, level))
        if heading := metric_heading(result, level):
            lines.append(f"  {heading}")
            lines += text_table(metric_rows(result, level))
        lines += [f"  {line}" for line in rate_lines(result, level)]
        for c in result.comparisons_at(level):
            lines.append("  " + comparison_line(c))
        if method := ci_method_line(result.comparisons_at(level)):
            lines.append(f"    {method}")
        energy = energy_lines(result, level)
        lines += [f"  {line}" if i == 0 else f"    {line}" for i, line in enumerate(energy)]
        lines += _breakdown_lines(result, level)
        lines.append("")
    lines += [f"  {line}" for line in unsent_lines(result)]
    for line in crossover_lines(result):
        lines.append(f"  {line}")
    lines += [f"  {line}" for line in slo_capacity_lines(result)]
    for spec_arm, be in result.speculation():
        lines.append(
            f"  why {spec_arm.label} runs at this speed (speculative decoding vs {base.label}, "
            f"{level_phrase(result.levels[0] if result.levels else 1)}):"
        )
        lines += breakeven_lines(be, indent="    ")
    if recommendation := whatif_line(result):
        lines.append(f"  {recommendation}")
    if is_ab(result):
        lines += [f"  {line}" if i == 0 else f"    {line}" for i, line in enumerate(accept_lines(result))]
    lines += [f"  {line}" if i == 0 else f"    {line}" for i, line in enumerate(outputs_lines(result))]
    for arm in result.arms:
        for launch in arm.launches:
            for r in launch.invalid_runs:
                lines.append(
                    f"  excluded: {arm.label} block {launch.block + 1} run {r.index + 1} @ {level_name(r.level)}: "
                    f"{r.invalid_reason}"
                )
        sources = {r.accept_source for r in arm.timed_at() if r.accept_source}
        if sources:
            lines.append(f"  {arm.label}: accept length from {', '.join(sorted(sources))}")
    if said := energy_note(result):
        lines.append(f"  {said}")
    for section in sections(result):
        lines += section_lines(section)
    lines += [f"  {line}" for line in turn_lines(result)]
    for warning in result.warnings():
        lines.append(f"  WARNING: {warning}")
    # Each line one line: names, categories, notes and reasons come from files, bundles and servers, and a newline or
    # an escape sequence in one must not forge a line of the report nor drive the terminal.
    return "\n".join(visible(line) for line in lines).rstrip()

"""An experiment's report as Markdown, for a ticket or a pull request (`orch export --format md`)."""

from __future__ import annotations

import re

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

# What Markdown (GitHub's, GitLab's: HTML allowed) would read as markup rather than text: each is escaped below.
_ESCAPED = re.compile(
    r"[\\`*|]"  # a backslash (so no escape of ours is undone), code spans, emphasis, table cells
    r"|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])"  # emphasis; not inside a word (snake_case stays as it reads)
    r"|~(?=~)|(?<=~)~"  # strikethrough (~~), not a lone ~ ("~3.2 req/s")
    r"|\](?=[(\[])"  # a link or image ([text](url), ![alt](url)) or a reference to one ([text][ref])
)
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# GFM's extended autolinks, which GitHub's and GitLab's renderers make of bare text. A URL (http, https, ftp; mailto
# and xmpp before an address) and a `www.` link are found while the inlines are parsed: a backslash before the scheme's
# `:` or the `.` after www makes that character an escape of its own, which no link starts from. An address (`a@b.c`)
# is found afterwards, in the text merged back (escapes and entities are text by then): only an element between its
# parts keeps it text, so an empty HTML comment goes before its `@` (renderers that allow HTML drop it). Only before
# a domain with a period and a letter at its end: orch's own `tok_s@8` and `bench@10.1.2.3` are no address.
_SCHEME = re.compile(r"(?i)(https?|ftp|mailto|xmpp):")
_WWW = re.compile(r"(?i)(www)\.")
_LABEL = r"(?:[A-Za-z0-9_-]|\\_)"  # a domain's character, `_` as md_text may have escaped it
_ADDRESS = re.compile(rf"(?<=[A-Za-z0-9.+_-])@(?={_LABEL}+\.(?:{_LABEL}|\.)*[A-Za-z])")
# What starts a block at the beginning of a line (or of a list item's text): a heading, quote, list, rule, or a
# link reference definition (`[ref]: javascript:…`, which only forms there).
_BLOCK_START = re.compile(r"^(\s*)(?:([#+=\[-])|(>)|(\d+)([.)]))")


def md_text(text: str, *, block: bool = True) -> str:
    """Text for a Markdown renderer that allows HTML, shown as it is and never read as markup: control characters
    and newlines as escapes (one line stays one line, a table row one row), `&` and `<` as entities where they could
    start an entity, a tag or an autolink, what would make a link, an image, emphasis, code, a table cell or a
    heading backslash-escaped, and a bare URL, `www.` link or e-mail address kept from becoming a link (GFM's
    extended autolinks) while it reads the same.
    Characters that only mean something in those places (a lone `[`, `~` or `>` inside a sentence) are left as
    they are, so orch's own sentences read the same in the source. block=False for text that cannot start a
    block (a table cell): a leading `-` or `1.` there is text already."""
    text = _ESCAPED.sub(lambda m: "\\" + m.group(0), visible(text))
    # Only where they can start markup: `<` before a tag name, `/`, `!` or `?` (a tag, comment, declaration or
    # autolink), `&` before a name or `#` (an entity). "load <1" and "A & B" stay as they read (orch nightly prints
    # this text on the terminal too).
    text = re.sub(r"&(?=[#A-Za-z])|<(?=[A-Za-z/!?])", lambda m: _HTML[m.group(0)], text)
    text = _ADDRESS.sub("<!-- -->@", _WWW.sub(r"\1\\.", _SCHEME.sub(r"\1\\:", text)))
    return _BLOCK_START.sub(_block_start, text) if block else text


def _block_start(m: re.Match[str]) -> str:
    if m.group(2):
        return f"{m.group(1)}\\{m.group(2)}"
    if m.group(3):
        return f"{m.group(1)}&gt;"
    return f"{m.group(1)}{m.group(4)}\\{m.group(5)}"  # an ordered list's "1." (a digit cannot be escaped)


def md_code(text: str) -> str:
    """text as an inline code span: fenced by more backticks than any run of them in it (CommonMark), control
    characters shown as escapes. Nothing inside a code span is markup."""
    text = visible(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_table(rows: list[list[str]]) -> list[str]:
    """rows (a header first) as a Markdown table: the first column left-aligned, the numbers right-aligned; every
    cell escaped (md_text), so a `|` or a newline in a name stays inside its cell."""
    out = [
        "| " + " | ".join(md_text(c, block=False) for c in rows[0]) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(rows[0]))) + "|",
    ]
    out += ["| " + " | ".join(md_text(c, block=False) for c in row) + " |" for row in rows[1:]]
    return out


def _items(lines: list[str]) -> list[str]:
    """Plain lines as a Markdown list, each item's text escaped."""
    return [f"- {md_text(line)}" for line in lines]


def section_md(section: Section) -> list[str]:
    """A report section (report/sections) in Markdown: a heading, then its table, list and note."""
    parts = [
        md_table([list(row) for row in section.table]) if section.table else [],
        _items(list(section.items)),
        [f"_{md_text(section.note)}_"] if section.note else [],
    ]
    lines = ["", f"## {md_text(section.title)}"]
    for part in parts:
        if part:  # a blank line between blocks: a list or a note right under a table would be read into it
            lines += ["", *part]
    return lines


def _category_md(result: ABResult, level: Level) -> list[str]:
    """The level's breakdown by category, or the sentence saying the workload has a single one."""
    if (bc := by_category(result, level)) is not None:
        return [
            *("", f"### By category at {md_text(level_name(bc.level))}", "", md_text(category_heading(bc) + "."), ""),
            *md_table(category_rows(bc)),
            "",
            *_items(category_lines(bc)),
        ]
    return _items([one]) if (one := one_category_line(result)) else []


def _prompt_md(result: ABResult, level: Level) -> list[str]:
    """The level's results by prompt, for a small prompt set (results/byprompt); nothing otherwise."""
    if (bp := by_prompt(result, level)) is None:
        return []
    return [
        *("", f"### By prompt at {md_text(level_name(bp.level))}", "", md_text(prompt_heading(bp) + "."), ""),
        *md_table(prompt_rows(bp)),
        *(["", *_items(prompt_lines(bp))] if bp.notes else []),
    ]


def ab_markdown(result: ABResult) -> str:
    """The report as Markdown, for a ticket or a pull request. Every sentence is orch's text with names, categories,
    notes and reasons in it (from files, bundles and servers): each is escaped whole (md_text), and the markup is
    added around it."""
    t = md_text
    head = "A/B" if is_ab(result) else f"Benchmark of {result.arms[0].label},"
    lines = [f"# {t(f'{head} {result.experiment_id} on {result.host_label}')}", ""]
    if result.simulated:
        lines += [f"**{t(SIM_BANNER)}**", ""]
    lines += [line for banner in attached_banner(result) for line in (f"**{t(banner)}**", "")]
    lines += [line for w in node_mismatch_lines(result) for line in (f"**{t(f'WARNING: {w}')}**", "")]
    d = result.design
    lines.append(
        t(
            f"Status: {result.status}. Design: {d.blocks} block(s)"
            + order_text(result)
            + f"; minimum effect of interest ±{result.min_effect * 100:.1f}%."
        )
    )
    lines += [f"&gt; {t(f'NOTE: {n}')}" for n in result.notes]
    if sweep := sweep_lines(result):
        lines += ["", t(sweep[0] + "; " + sweep[1].strip() + ".")]
    lines += [part for line in (metric_line(result), slo_line(result)) if line for part in ("", t(line + "."))]
    for level in result.levels or [1]:
        rows = level_rows(result, level)
        lines += ["", f"## {t(level_heading(level))}", ""]
        lines += md_table(rows)
        if result.slo is not None:
            lines += ["", f"### {t(f'Goodput at {level_phrase(level)}')}", "", t(slo_heading(result, level) + "."), ""]
            lines += md_table(slo_rows(result, level))
        if heading := metric_heading(result, level):
            lines += ["", f"### {t(f'{result.metric} at {level_phrase(level)}')}", "", t(heading + "."), ""]
            lines += md_table(metric_rows(result, level))
        lines.append("")
        lines += _items(rate_lines(result, level))
        lines += _items([comparison_line(c) for c in result.comparisons_at(level)])
        if method := ci_method_line(result.comparisons_at(level)):
            lines += _items([method])
        lines += _category_md(result, level)
        lines += _prompt_md(result, level)
        if energy := energy_lines(result, level):
            lines += ["", f"### {t(energy[0][0].upper() + energy[0][1:])}", "", *_items(energy[1:])]
    if unsent_said := unsent_lines(result):
        lines += ["", *_items(unsent_said)]
    if crossings := crossover_lines(result):
        lines += ["", "## Where speculation stops paying", "", *_items(crossings)]
    if capacity := slo_capacity_lines(result):
        lines += ["", "## Highest load within the SLO", "", t(capacity[0]), *_items([c.strip() for c in capacity[1:]])]
    spec = result.speculation()
    if spec:
        lines += ["", "## Speculative decoding", ""]
        for spec_arm, be in spec:
            lines.append(t(f"{spec_arm.label}:"))
            lines += _items(breakeven_lines(be))
        if recommendation := whatif_line(result):
            lines += _items([recommendation])
    if is_ab(result) and (accept := accept_lines(result)):
        lines += ["", "## Accept length per request", "", t(accept[0]), *_items(accept[1:])]
    if checked := outputs_lines(result):
        lines += ["", "## Lossless check", "", t(checked[0])]
        lines += [f"- {t(line)}" if not line.startswith("  ") else f"  - {t(line.strip())}" for line in checked[1:]]
    if note := energy_note(result):
        lines += ["", f"_{t(note)}_"]
    for section in sections(result):
        lines += section_md(section)
    if by_turn := turn_lines(result):
        lines += ["", "## By turn", "", *_items(by_turn)]
    warnings = result.warnings()
    if warnings:
        lines += ["", "## Warnings", "", *_items(warnings)]
    return "\n".join(lines) + "\n"


def render(result: ABResult, requests: object = None) -> str:
    """`orch export --format md`."""
    return ab_markdown(result)

"""A report section as data, built once from a result and rendered by every format (text, Markdown, HTML, JSON)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.results.cache import cache_lines
from orchestrator.results.model import ABResult

# A section's JSON value when it has none of its own (what it says is already elsewhere in the document).
NO_JSON = object()


@dataclass(frozen=True, kw_only=True)
class Section:
    """What one section says, whatever the format: its heading, a table (its header row first), sentences (text
    lines, Markdown and HTML list items) and a note under them. `key` names it in JSON and is its HTML id; `data` is
    its JSON value (NO_JSON: none). `text_heading`: the terminal report prints the heading as a line of its own (a
    section of one or two sentences reads better without)."""

    key: str
    title: str
    table: tuple[tuple[str, ...], ...] = ()
    items: tuple[str, ...] = ()
    note: str = ""
    data: Any = NO_JSON
    text_heading: bool = True

    @property
    def html_id(self) -> str:
        return self.key.replace("_", "-")


Builder = Callable[[ABResult], "Section | None"]


def _prefix_cache(result: ABResult) -> Section | None:
    """Each arm's prefix-cache hit rate (results/cache); in JSON each arm's own prefix_cache says it."""
    said = cache_lines(result)
    if not said:
        return None
    return Section(key="prefix_cache", title="Prefix cache", items=tuple(said), text_heading=False)


# The sections every format renders, in order, each built once per report: a new section is one builder here
# (register), and text, Markdown, HTML and JSON show it where they show these (report/text, markdown, html,
# jsondoc: section_lines, section_md, section_html, section_json).
BUILDERS: list[Builder] = [_prefix_cache]


def register(builder: Builder) -> Builder:
    """Add a section to every format's report (after the ones registered before it)."""
    BUILDERS.append(builder)
    return builder


def unregister(builder: Builder) -> None:
    if builder in BUILDERS:
        BUILDERS.remove(builder)


def sections(result: ABResult) -> list[Section]:
    """The registered sections this result has (a builder returns None for a result it has nothing to say about)."""
    return [s for s in (build(result) for build in BUILDERS) if s is not None]

"""The formats an experiment is exported in, behind one interface: `orch export --format NAME` picks one here."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `orch export --help` names the formats without loading the results model
    from orchestrator.results.model import ABResult

# What a format renders: the result, and the store's per-request rows by launch id (empty unless it asks for them).
Requests = Mapping[str, Sequence[Mapping[str, Any]]]


@dataclass(frozen=True)
class Format:
    """One export format: its `--format` name, the module that renders it, and what it needs."""

    name: str
    module: str  # orchestrator.report.<module>, with `render(result, requests) -> str`; imported only when asked for
    per_request: bool = False  # needs the store's per-request rows
    plots: bool = False  # needs matplotlib (the `report` extra)

    def check(self) -> None:
        """Fails (an OrchError naming the extra) before anything is read when what the format needs is missing."""
        if self.plots:
            from orchestrator.report import plots

            plots.require_matplotlib()

    def render(self, result: ABResult, requests: Requests) -> str:
        render: Callable[[ABResult, Requests], str] = importlib.import_module(
            f"orchestrator.report.{self.module}"
        ).render
        return render(result, requests)


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("json", "jsondoc"),
        Format("csv", "csvrows"),
        Format("jsonl", "jsonl", per_request=True),
        Format("md", "markdown"),
        Format("html", "html", per_request=True, plots=True),
    )
}

"""The export formats behind one interface: every entry renders through its module's `render`, and the CLI offers
exactly these (and the bundle, which is a results file, not a report)."""

from __future__ import annotations

import importlib

import click

from orchestrator.cli.stored import export_cmd
from orchestrator.report.formats import FORMATS


def test_every_format_module_renders() -> None:
    for fmt in FORMATS.values():
        module = importlib.import_module(f"orchestrator.report.{fmt.module}")
        assert callable(getattr(module, "render", None)), f"orchestrator/report/{fmt.module}.py has no render()"


def test_the_export_command_offers_the_formats_and_the_bundle() -> None:
    (option,) = [p for p in export_cmd.params if p.name == "fmt"]
    assert isinstance(option.type, click.Choice)
    assert list(option.type.choices) == [*FORMATS, "bundle"]

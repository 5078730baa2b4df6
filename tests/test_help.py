"""`orch ab/bench/reproduce --help` list their options under headings."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.cli.base import OPTION_GROUPS


@pytest.mark.parametrize("command", ["ab", "bench", "reproduce"])
def test_help_groups_options_and_loses_none(command: str) -> None:
    out = CliRunner().invoke(cli, [command, "--help"]).output
    headings = [line.rstrip(":") for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings[:5] == [name for name, _ in OPTION_GROUPS][: len(headings[:5])]
    assert "Server" in headings and "Workload" in headings and "Output" in headings
    # every option still appears exactly once
    for param in cli.commands[command].params:
        if param.opts and param.opts[0].startswith("-"):
            assert out.count(f"{param.opts[0]} ") + out.count(f"{param.opts[0]},") >= 1, param.opts[0]

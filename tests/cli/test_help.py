"""`orch ab/bench/reproduce --help` list their options under headings."""

from __future__ import annotations

import click
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
    loaded = cli.get_command(click.Context(cli), command)
    assert loaded is not None
    for param in loaded.params:
        if param.opts and param.opts[0].startswith("-"):
            assert out.count(f"{param.opts[0]} ") + out.count(f"{param.opts[0]},") >= 1, param.opts[0]


def test_profile_names_complete_on_ab_bench_and_profiles(tmp_path: object) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    for words, cword in (("orch ab cpu-", 2), ("orch bench cpu-p", 2), ("orch profiles show vllm-", 3)):
        env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(cword), "_ORCH_COMPLETE": "bash_complete",
               "PYTHONPATH": str(repo)}  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-c", "from orchestrator.cli import cli; cli(prog_name='orch')"],
            env=env, capture_output=True, text=True, cwd=str(tmp_path), timeout=60,
        ).stdout  # fmt: skip
        names = [line.split(",", 1)[1] for line in out.splitlines() if "," in line]
        prefix = words.rsplit(" ", 1)[1]
        assert names and all(n.startswith(prefix) for n in names), (words, out)


def test_ab_json_answers_in_json_when_it_fails(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from orchestrator.cli import main

    code = main(["ab", "no-such-profile", "baseline", "--sim", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["status"] == "error" and doc["exit_code"] == 2 and "no-such-profile" in doc["error"]


def _commands(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()) -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        assert sub is not None, name
        found.append((" ".join((*path, name)), sub))
        if isinstance(sub, click.Group):
            found += _commands(sub, click.Context(sub, parent=ctx, info_name=name), (*path, name))
    return found


def test_every_option_of_every_command_has_help() -> None:
    commands = _commands(cli, click.Context(cli, info_name="orch"))
    assert {"down", "list", "hosts check", "compare"} <= {name for name, _ in commands}
    bare = [
        f"{('orch ' + name).strip()} {param.opts[0]}"
        for name, command in [("", cli), *commands]
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]
    assert bare == []


def test_reproduce_blocks_help_gives_the_rule_it_follows() -> None:
    """--blocks of `orch reproduce` has no one default: a bundle's own number of blocks, 3 for a claim (bench: 1)."""

    def blocks_help(command: str) -> str:
        out = " ".join(CliRunner().invoke(cli, [command, "--help"]).output.split())
        return out[out.index("--blocks INTEGER") : out.index("--order [")]

    text = blocks_help("reproduce")
    assert (
        "[default: a BUNDLE's own number of blocks (1 for a bundle from before designs); a PROFILE's claim 3]" in text
    )
    assert "default: 1" not in text
    assert "default: 1;" in blocks_help("bench")

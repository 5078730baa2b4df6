"""The run commands' `--help`: Slurm and groups named, `--fail-on` true for each command, options apart from
arguments."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli


def _help(*words: str) -> str:
    out = CliRunner().invoke(cli, [*words, "--help"], terminal_width=200).output
    return " ".join(out.split())


@pytest.mark.parametrize("command", ["ab", "bench", "reproduce"])
def test_run_help_names_slurm_groups_and_the_remote_workdir(command: str) -> None:
    out = _help(command)
    assert "slurm:PARTITION" in out and "a group of hosts for multi-node profiles" in out
    assert "or a Slurm host with a profile of nnodes > 1" in out  # --allow-node-mismatch
    assert "~/.orch on SSH and Slurm hosts" in out and "the user state dir on this machine" in out


def test_fail_on_help_is_true_for_each_command() -> None:
    ab, bench = _help("ab"), _help("bench")
    assert "allowed with --resume" in ab and "--resume" not in bench
    assert "expect.tok_s" in bench and "an arm slower than the first" in ab and "expect.tok_s" not in ab


@pytest.mark.parametrize("command", ["ab", "bench", "reproduce"])
def test_run_help_lists_options_only(command: str) -> None:
    out = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
    other = out[out.index("Other options:") :]
    assert "PROFILE" not in other and "BUNDLE" not in other  # arguments stay in the usage line (click 8.5.1)
    host = out[out.index("Host:") : out.index("Output:")]
    assert "--allow-node-mismatch" in host


@pytest.mark.parametrize("command", ["status", "down"])
def test_status_and_down_help_say_what_host_takes(command: str) -> None:
    assert "slurm:PARTITION" in _help(command)

"""`--json` is one JSON document on stdout whatever goes wrong (and stderr does not repeat the error), and an experiment
id that names none exits 2 in every command that takes one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest

from orchestrator.cli import cli, main
from orchestrator.results.store import Store

Capsys = pytest.CaptureFixture[str]


def json_commands(
    group: click.Group = cli, ctx: click.Context | None = None, path: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    """Every command of the tree that takes --json, as its words on the command line (a new one is covered too)."""
    ctx = ctx or click.Context(cli, info_name="orch")
    found: list[tuple[str, ...]] = []
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        assert sub is not None, name
        if isinstance(sub, click.Group):
            found += json_commands(sub, click.Context(sub, parent=ctx, info_name=name), (*path, name))
        elif any("--json" in p.opts for p in sub.params):
            found.append((*path, name))
    return found


JSON_COMMANDS = json_commands()


def one_error_document(capsys: Capsys, rc: int, exit_code: int, *needles: str) -> dict[str, Any]:
    """stdout is exactly one JSON document, the error one; stderr does not repeat it (no `Error:` line, no usage
    lines: a script reading both streams sees the error once); rc is the document's."""
    out, err = capsys.readouterr()
    doc = json.loads(out)  # the whole of stdout: a second document or any other line fails to parse
    assert isinstance(doc, dict) and set(doc) == {"status", "error", "exit_code"}, out
    assert doc["status"] == "error" and doc["exit_code"] == exit_code == rc, (rc, out, err)
    assert "Error" not in err and "Usage:" not in err and doc["error"] not in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in doc["error"], (needle, out, err)
    return doc


def test_the_walk_finds_the_commands_with_json() -> None:
    # The walk itself must work, or the tests over it would pass on nothing.
    assert {("list",), ("show",), ("compare",), ("whatif",), ("ab",), ("hosts", "check"), ("profiles", "show")} <= set(
        JSON_COMMANDS
    )


@pytest.mark.parametrize("command", JSON_COMMANDS, ids=" ".join)
def test_every_command_with_json_answers_a_usage_error_in_one_document(
    capsys: Capsys, command: tuple[str, ...]
) -> None:
    """A usage error of click's own parsing (an unknown option, here) given with --json: one document, exit 2."""
    rc = main([*command, "--json", "--no-such-option"])
    one_error_document(capsys, rc, 2, "--no-such-option")


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a bad bundle, a corrupt database, a bad YAML file, a store holding one experiment
    and an empty store."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.orch.json").write_text('{"format": ')
    (tmp_path / "bad.db").write_bytes(b"not a database at all, " * 100)
    (tmp_path / "bad.yaml").write_text("a: [\n")
    store = Store(tmp_path / "good.db")
    store.create_experiment(
        "20261129-1", kind="ab", simulated=True, host="local", arms=["a", "b"], config={}, orch_version="t"
    )
    store.close()
    Store(tmp_path / "empty.db").close()
    return tmp_path


BUNDLE = "bad.orch.json: truncated"
CORRUPT = "bad.db is not an SQLite database"
UNKNOWN = "no experiment 'nope'"
NO_LAST = "no experiments stored yet"

# A bad input for every command with --json, raised by orch itself (not by click's parsing): the argv, the exit code
# the README documents for it (1 error, 2 invalid input) and what the error names.
BAD_INPUTS: dict[tuple[str, ...], list[tuple[list[str], int, str]]] = {
    ("list",): [(["--db", "bad.db"], 1, CORRUPT)],
    ("show",): [
        (["bad.orch.json"], 2, BUNDLE),
        (["last", "--db", "bad.db"], 1, CORRUPT),
        (["nope", "--db", "good.db"], 2, UNKNOWN),
        (["last", "--db", "empty.db"], 2, NO_LAST),
    ],
    ("compare",): [
        (["bad.orch.json", "bad.orch.json"], 2, BUNDLE),
        (["last", "last", "--db", "bad.db"], 1, CORRUPT),
        (["nope", "last", "--db", "good.db"], 2, UNKNOWN),
        (["last", "nope", "--db", "good.db"], 2, UNKNOWN),
        (["last", "last", "--db", "empty.db"], 2, NO_LAST),
        (["last", "nope", "--db", "good.db", "--format", "json"], 2, UNKNOWN),  # --json by another name
    ],
    ("whatif",): [
        (["bad.orch.json"], 2, BUNDLE),
        (["last", "--db", "bad.db"], 1, CORRUPT),
        (["nope", "--db", "good.db"], 2, UNKNOWN),
    ],
    ("history",): [(["item", "--db", "bad.db"], 1, CORRUPT)],
    ("status",): [(["--inventory", "bad.yaml"], 2, "bad.yaml: not valid YAML")],
    ("hosts", "list"): [(["--inventory", "bad.yaml"], 2, "bad.yaml: not valid YAML")],
    ("hosts", "check"): [(["gpu-box", "--inventory", "bad.yaml"], 2, "bad.yaml: not valid YAML")],
    ("profiles", "show"): [(["no-such-profile"], 2, "no profile named 'no-such-profile'")],
    ("profiles", "list"): [(["extra-argument"], 2, "extra-argument")],  # reads no input of its own to get wrong
    ("breakeven",): [(["--baseline-tps", "nan", "--cycle-ms", "30", "--steps", "3"], 2, "'nan'")],  # numbers only
    # The commands that launch servers, refused before anything starts.
    ("ab",): [(["--resume", "nope", "--db", "good.db", "--sim"], 2, UNKNOWN)],
    ("bench",): [(["no-such-profile", "--sim"], 2, "no profile named 'no-such-profile'")],
    ("reproduce",): [(["bad.orch.json"], 2, BUNDLE)],
    ("nightly",): [(["bad.yaml"], 2, "bad.yaml: not valid YAML")],
}


def test_every_command_with_json_has_a_bad_input_case() -> None:
    assert set(JSON_COMMANDS) <= set(BAD_INPUTS), "add a bad input for the new command to BAD_INPUTS"


@pytest.mark.parametrize(
    ("command", "args", "exit_code", "needle"),
    [(command, args, code, needle) for command, cases in BAD_INPUTS.items() for args, code, needle in cases],
    ids=lambda v: " ".join(v) if isinstance(v, tuple | list) else str(v),
)
def test_a_bad_input_with_json_is_one_error_document_with_the_documented_exit_code(
    capsys: Capsys, inputs: Path, command: tuple[str, ...], args: list[str], exit_code: int, needle: str
) -> None:
    argv = [*command, *args] if "--format" in args else [*command, *args, "--json"]
    rc = main(argv)
    one_error_document(capsys, rc, exit_code, needle)


# Every command that takes an experiment id, and where the id goes in its argv.
ID_COMMANDS: dict[str, list[str]] = {
    "show": ["show", "{id}"],
    "compare A": ["compare", "{id}", "{other}"],
    "compare B": ["compare", "{other}", "{id}"],
    "export": ["export", "{id}"],
    "export bundle": ["export", "{id}", "--format", "bundle", "-o", "out.orch.json"],
    "report": ["report", "{id}", "--html", "out.html"],
    "whatif": ["whatif", "{id}"],
    "ab --resume": ["ab", "--resume", "{id}", "--sim"],
}


@pytest.mark.parametrize("command", ID_COMMANDS)
@pytest.mark.parametrize(
    ("ref", "other", "db", "needle"),
    [("nope", "20261129-1", "good.db", UNKNOWN), ("last", "last", "empty.db", NO_LAST)],
)
def test_an_id_that_names_no_experiment_exits_2_in_every_command(
    capsys: Capsys, inputs: Path, command: str, ref: str, other: str, db: str, needle: str
) -> None:
    rc = main([a.format(id=ref, other=other) for a in ID_COMMANDS[command]] + ["--db", db])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and needle in err and "Traceback" not in err, (rc, out, err)
    assert not (inputs / "out.html").exists() and not (inputs / "out.orch.json").exists()


def test_the_id_commands_are_all_there() -> None:
    # Every command whose help says it takes an experiment ID is in ID_COMMANDS: a new one is tested too.
    ctx = click.Context(cli, info_name="orch")
    taking_ids = set()
    for name in cli.list_commands(ctx):
        sub = cli.get_command(ctx, name)
        assert sub is not None
        if any(isinstance(p, click.Argument) and "ID" in (p.metavar or "") for p in sub.params) or name == "compare":
            taking_ids.add(name)
    assert taking_ids == {c.split()[0] for c in ID_COMMANDS} - {"ab"}, taking_ids


@pytest.mark.parametrize("asked", [["--format", "json"], ["--format=json"]])
def test_compare_format_json_answers_a_usage_error_in_one_document_too(capsys: Capsys, asked: list[str]) -> None:
    rc = main(["compare", "only-a", *asked])
    one_error_document(capsys, rc, 2, "Missing argument 'B'")

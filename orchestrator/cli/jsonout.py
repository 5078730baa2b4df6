"""`--json`: one JSON document on stdout, a failure (`"status": "error"`) or an interruption included."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import click

from orchestrator.cli.base import (
    ANSWERED_IN_JSON,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    GroupedCommand,
    interrupted_message,
)
from orchestrator.errors import InputError, OrchError

JSON_HELP = 'Print one JSON document on stdout (also on failure: "status": "error" and "error"; Ctrl-C: "interrupted").'


def emit(doc: dict[str, Any]) -> None:
    click.echo(json.dumps(doc, indent=2))


def error_doc(message: str, exit_code: int) -> dict[str, Any]:
    return {"status": "error", "error": message, "exit_code": exit_code}


def document_printed() -> None:
    """Tell the running JsonCommand its document is out: a failure after it (a night interrupted after some items,
    which prints what it has) must not print a second document on stdout."""
    click.get_current_context().meta[_PRINTED] = True


_PRINTED = "orch.jsonout.printed"


def _answer(e: BaseException, doc: dict[str, Any]) -> None:
    """Print the failure's document and mark the failure answered (cli.base.answered: stderr does not repeat it)."""
    emit(doc)
    setattr(e, ANSWERED_IN_JSON, True)


def _wants_json(ctx: click.Context) -> bool:
    # `orch compare --format json` is its --json by another name: a script reading either gets a document.
    asked = bool(ctx.params.get("as_json")) or ctx.params.get("fmt") == "json"
    return asked and not ctx.meta.get(_PRINTED)


def _json_in_args(args: list[str]) -> bool:
    """Whether the command line asks for JSON (--json, or --format json), read before click parses it."""
    if "--json" in args or "--format=json" in args:
        return True
    return any(a == "--format" and b == "json" for a, b in itertools.pairwise(args))


class JsonCommand(click.Command):
    """A command with `--json` whose failures are JSON too: the document on stdout is the answer, stderr does not
    repeat it. The exception still propagates afterwards (marked answered), so the exit code (1 error, 2 invalid
    input, 130 interrupted) stays the one `orch` always uses."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        # Decided before parsing: a usage error (a bad option value, an unknown option, a missing argument) must
        # answer in JSON as well.
        as_json = _json_in_args(args)
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:
            if as_json:
                _answer(e, error_doc(e.format_message(), e.exit_code))
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OrchError as e:
            if _wants_json(ctx):
                _answer(e, error_doc(str(e), EXIT_USAGE if isinstance(e, InputError) else 1))
            raise
        except click.ClickException as e:
            if _wants_json(ctx):
                _answer(e, error_doc(e.format_message(), e.exit_code))
            raise
        except KeyboardInterrupt as e:
            # Ctrl-C or SIGTERM: still one document, so a script reading stdout learns why there is no result.
            if _wants_json(ctx):
                message = interrupted_message(ctx.find_root().invoked_subcommand)
                _answer(e, {"status": "interrupted", "error": message, "exit_code": EXIT_INTERRUPTED})
            raise
        except (click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except Exception as e:  # a bug in orch: the document still parses
            if _wants_json(ctx):
                _answer(e, error_doc(f"unexpected {type(e).__name__}: {e}", 1))
            raise


class RunCommand(JsonCommand, GroupedCommand):
    """ab, bench, reproduce: options under headings, and with --json a document even when the experiment fails."""


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help=JSON_HELP)(fn)

"""The `orch` command line: a thin click layer over the typed core functions, one module per command group."""

from __future__ import annotations

import os
import sys

import click

# The group imports a command's module only when that command runs (cli/lazy.py): `orch --version` stays fast.
from orchestrator.cli.base import EXIT_INTERRUPTED, EXIT_USAGE, answered, cli, interrupted_message
from orchestrator.cli.lazy import Interrupted
from orchestrator.common.printable import guarded_output
from orchestrator.common.stopsignals import forgiving_output, install, settle
from orchestrator.errors import InputError, OrchError

__all__ = ["cli", "entry", "main"]


# ---------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    # Whatever a command prints, a control character in it (from a dataset, a bundle, a server's reply) is shown as
    # an escape, not obeyed by the terminal; JSON stays JSON (it escapes them itself).
    with guarded_output():
        return _run(argv)


def _run(argv: list[str] | None) -> int:
    debug = os.environ.get("ORCH_DEBUG") == "1"
    try:
        cli.main(args=argv, prog_name="orch", standalone_mode=False)
    except click.ClickException as e:
        if not answered(e):
            e.show()
        return e.exit_code
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort) as e:
        # click turns Ctrl-C into Abort; by the time it reaches here every `finally` has torn its server down.
        if debug:
            _print_traceback()
        cause = e.__cause__ if isinstance(e, click.exceptions.Abort) else e
        if not isinstance(cause, KeyboardInterrupt):
            click.echo("Aborted.", err=True)
            return 1
        # What the interrupted command leaves behind: only ab, bench, reproduce and nightly start servers.
        if not answered(e):
            click.echo(interrupted_message(cause.command if isinstance(cause, Interrupted) else None), err=True)
        return EXIT_INTERRUPTED
    except OrchError as e:
        if debug:
            _print_traceback()
        if not answered(e):  # under --json the error document said it
            click.echo(f"Error: {e}", err=True)
        return EXIT_USAGE if isinstance(e, InputError) else 1
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except Exception as e:  # a bug in orch: still no traceback unless asked for
        if debug:
            raise
        if answered(e):
            return 1
        click.echo(f"Error: unexpected {type(e).__name__}: {e} (set ORCH_DEBUG=1 for the traceback)", err=True)
        return 1
    return 0


def _print_traceback() -> None:
    import traceback

    traceback.print_exc()


def entry() -> None:
    """The console script: also treats SIGTERM (cron timeouts, kill) and SIGHUP (a closed terminal or SSH session)
    like Ctrl-C so servers are torn down, and keeps going when the terminal it prints to is gone. Only the first of
    them stops orch: the rest, however many, neither cut its teardown short nor change its exit status."""
    forgiving_output()
    install()
    code = main()
    settle()
    sys.exit(code)

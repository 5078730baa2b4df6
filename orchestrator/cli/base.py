"""The `orch` command group, and what every command module shares (exit codes, the finite-float and duration option
types)."""

from __future__ import annotations

import math
from typing import Any

import click

from orchestrator import __version__
from orchestrator.cli.lazy import LazyGroup
from orchestrator.fields import FieldError, duration_examples, seconds

EXIT_INTERRUPTED = 130
MAX_TPS = 1e7  # tok/s options: far above any server, low enough that the arithmetic cannot overflow
EXIT_USAGE = 2  # click's code for usage errors; invalid input files (InputError) get it too


# What Ctrl-C (or SIGTERM, SIGHUP) leaves behind, by command: only these launch servers (torn down in `finally`)
# and store results as they come; `orch down` may have stopped only part of what it found.
LAUNCHING_COMMANDS = frozenset({"ab", "bench", "reproduce", "nightly"})


# Set on a failure a JsonCommand (cli/jsonout.py) answered with its document: that document is the whole answer, so
# main() prints no `Error:`, usage or "Interrupted" line for it on stderr (a script reading both streams would see it
# twice). Here, not in jsonout, so that main() reads it without importing a command module.
ANSWERED_IN_JSON = "orch_answered_in_json"


def answered(e: BaseException) -> bool:
    """Whether a JsonCommand answered this failure with its JSON document: the failure itself, or what it was raised
    from (Ctrl-C reaches main() as click's Abort from the group's Interrupted from the command's KeyboardInterrupt)."""
    cause: BaseException | None = e
    while cause is not None:
        if getattr(cause, ANSWERED_IN_JSON, False):
            return True
        cause = cause.__cause__
    return False


def interrupted_message(command: str | None) -> str:
    if command in LAUNCHING_COMMANDS:
        return "Interrupted: servers started by this run were torn down; results so far are stored."
    if command == "down":
        return "Interrupted: orch down may have stopped only some of orch's servers on the host; run it again."
    return "Interrupted."


class FiniteFloat(click.FloatRange):
    """A float option within a range that also refuses nan and inf (every comparison with nan is false, so a
    plain FloatRange lets `--ready-timeout nan` through, and then readiness waits forever)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


# The examples an option's help gives of the units it takes: those of them within the option's range (units).
HELP_UNIT_EXAMPLES = ("500ms", "30s", "5m", "1h30m")


def units(lo: float, hi: float) -> str:
    """What the help of an option that takes a time says of it (Seconds reads them all alike), with examples that
    option takes: `: seconds, or with a unit (30s, 5m, 1h30m).` for a range of 1s to 1d."""
    return f": seconds, or with a unit ({', '.join(duration_examples(lo, hi, HELP_UNIT_EXAMPLES))})."


class Seconds(click.ParamType[float, Any]):
    """An option that takes a time: seconds (30, 2.5) or a duration with units (500ms, 30s, 5m, 3h, 1h30m), within
    [lo, hi]; the value is seconds, a float. The one syntax of every duration orch reads (fields.seconds_of); a value
    refused is told the range and examples within it."""

    name = "duration"

    def __init__(self, lo: float, hi: float) -> None:
        self.check = seconds(lo, hi)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            return self.check(value)
        except FieldError as e:
            self.fail(str(e), param, ctx)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """orch: honest A/B benchmarks of LLM inference servers.

    Every arm starts from a fresh, verified server launch; the environment each worker process
    really got is read back; every run is stored the moment it finishes.
    """


# `orch ab --help` and its kin list their options under these headings (by the option's first name).
OPTION_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Server", ("--sim", "--attach", "--allow-mixed", "--port", "--ready-timeout", "--grace", "--strict-env",
                "--force", "--gpu-wait")),
    ("Workload", ("--runs", "--warmup", "--max-tokens", "--seed", "--concurrency", "--requests-per-stream",
                  "--endpoint", "--prompts", "--input-len", "--turns", "--client", "--min-run-s", "--stall-timeout",
                  "--first-token-timeout", "--flush-cache")),
    ("Open loop", ("--rate", "--sweep", "--arrivals", "--duration", "--requests", "--max-concurrency",
                   "--stop-oversaturated", "--trace", "--speed")),
    ("Design and verdict", ("--resume", "--blocks", "--max-blocks", "--order", "--order-seed", "--min-effect",
                            "--metric", "--slo", "--target-tps", "--fail-on", "--claim", "--claim-ratio", "--vs",
                            "--tolerance", "--cache-measured")),
    ("Host", ("--host", "--workdir", "--wait", "--inventory", "--accept-new-host-key", "--allow-node-mismatch")),
    ("Output", ("--db", "--json", "-q", "-v")),
    ("Bundle trust", ("--trust-bundle", "--allowed-signers")),
)  # fmt: skip


class GroupedCommand(click.Command):
    """A command whose --help shows its options under headings (server, workload, design, host, output), as the
    field's benchmark CLIs do, instead of one list of thirty."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            # click 8.5.1 gives arguments a help row too; click's own layout leaves them to the usage line, as here.
            if record is None or isinstance(param, click.Argument):
                continue
            first = param.opts[0] if param.opts else ""
            group = next((name for name, opts in OPTION_GROUPS if first in opts), "Other options")
            rows.setdefault(group, []).append(record)
        for name in [*(g for g, _ in OPTION_GROUPS), "Other options"]:
            if rows.get(name):
                with formatter.section(name):
                    formatter.write_dl(rows[name])

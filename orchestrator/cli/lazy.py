"""The root group's command table: every command's name and help line, its module imported only when it is used."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

# name -> ("module:attribute", the first paragraph of the command's help). `orch --help` and the completion of command
# names read this table, so that `orch --version` and `orch list` never import what `orch ab` needs (the client,
# asyncio, SSH, psutil, the statistics). tests/cli/test_startup.py checks it against the commands themselves.
COMMANDS: dict[str, tuple[str, str]] = {
    "ab": ("orchestrator.cli.ab:ab_cmd",
           "Compare PROFILES (the first is the baseline), each launch from fresh, verified state."),
    "bench": ("orchestrator.cli.ab:bench_cmd",
              "Benchmark one profile from a fresh, verified launch (--blocks N: N launches, with the spread across "
              "them)."),
    "breakeven": ("orchestrator.cli.breakeven:breakeven_cmd",
                  "Speculative decoding arithmetic: the accept length (and per-token acceptance) needed to break "
                  "even."),
    "compare": ("orchestrator.cli.reproduce:compare_cmd",
                "Two experiments side by side: B judged against A per arm (tok/s, TTFT, ITL, accept length, with "
                "CIs) and per ratio, and the fingerprint differences most likely to explain a difference, ranked."),
    "down": ("orchestrator.cli.hosts:down_cmd",
             "Stop every server orch launched on the host (found by its launch marker; nothing else is touched)."),
    "export": ("orchestrator.cli.stored:export_cmd",
               "Export a stored experiment (or a result bundle FILE) as JSON, CSV, JSON Lines, Markdown, HTML or a "
               "bundle."),
    "history": ("orchestrator.cli.nightly:history_cmd",
                "ITEM's trend, one line per night: value, 95% CI, change vs the level before, and what was decided "
                "then (regression, environment change, building history); change points and outlier nights marked "
                "in hindsight."),
    "hosts": ("orchestrator.cli.hosts:hosts_group", "The host inventory (hosts.yaml) and host checks."),
    "import": ("orchestrator.cli.stored:import_cmd",
               "Put a result bundle (`orch export ID --format bundle`) into the local store under its own id."),
    "list": ("orchestrator.cli.stored:list_cmd",
             "Stored experiments, newest first: id, when, status, host, arms, launches done of planned; an "
             "experiment of `orch nightly` is tagged with its night's date and item."),
    "nightly": ("orchestrator.cli.nightly:nightly_cmd",
                "Run every item of SUITE.yaml (A/B experiments and single-profile checks), store everything, and "
                "judge each item tonight (its A/B verdicts) and against its history (change points combined with "
                "the item's threshold; an environment change starts a new history instead of raising an alarm)."),
    "profiles": ("orchestrator.cli.profiles:profiles_group",
                 "List, show and validate server profiles (./profiles, the user config dir, then the bundled set)."),
    "report": ("orchestrator.cli.report:report_cmd",
               "An experiment's report as one self-contained HTML file with plots."),
    "reproduce": ("orchestrator.cli.reproduce:reproduce_cmd",
                  "Re-run a colleague's result from fresh state and judge it: REPRODUCED (exit 0), NOT REPRODUCED "
                  "(exit 3, with the fingerprint differences most likely to explain it) or INCONCLUSIVE (exit 4, "
                  "with how many blocks would decide)."),
    "show": ("orchestrator.cli.stored:show_cmd",
             "An experiment's report from the store (ID: an id, a unique prefix, or 'last'); partial ones too."),
    "status": ("orchestrator.cli.hosts:status_cmd",
               "What orch launched on the host and is still running: one line per launch (profile, launch id, PID, "
               "port, age, state), then GPU memory. The profile names come from the results database (--db), else "
               "from the launch itself (orch names it in the launch's environment); a launch of an older orch "
               "recorded in another database shows \"(another results store)\"."),
    "whatif": ("orchestrator.cli.whatif:whatif_cmd",
               "Predict accept length, cycle time and tok/s at every draft step count from the ones an experiment "
               "measured."),
}  # fmt: skip


def configure_logging() -> None:
    """Retries and reconnects are logged as warnings: shown, briefly, unless debugging (ORCH_DEBUG=1). Done when a
    command's module is loaded, so `orch --version` does not import logging."""
    import logging

    debug = os.environ.get("ORCH_DEBUG") == "1"
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="orch: %(message)s")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) while `orch COMMAND` ran: main() says what that command leaves behind."""

    def __init__(self, command: str | None) -> None:
        super().__init__(command)
        self.command = command


class LazyGroup(click.Group):
    """A group that knows its commands' names and help lines from COMMANDS and imports a command's module only when
    that command is resolved (click's "lazily loading subcommands"): to run it, show its --help, or complete its
    arguments."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return self.commands.get(cmd_name)
        module, _, attr = COMMANDS[cmd_name][0].partition(":")
        command = getattr(importlib.import_module(module), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{COMMANDS[cmd_name][0]} is not a click command")
        configure_logging()
        self.add_command(command, cmd_name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Interrupted:
            raise
        except KeyboardInterrupt as e:
            raise Interrupted(ctx.invoked_subcommand) from e

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            # click (8.4+) suggests a close name from the commands loaded so far, i.e. none: suggest from them all.
            no_such: Any = getattr(click.exceptions, "NoSuchCommand", None)
            if no_such is None or not isinstance(e, no_such):
                raise
            raise no_such(e.command_name, possibilities=self.list_commands(ctx), ctx=ctx) from None

    def _stand_in(self, name: str) -> click.Command:
        """The command if loaded, else one with its help line alone: click shortens help lines the same way."""
        if name in self.commands:
            return self.commands[name]
        return click.Command(name, help=COMMANDS[name][1])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, self._stand_in(name)) for name in self.list_commands(ctx)]
        rows = [(name, cmd) for name, cmd in rows if not cmd.hidden]
        if not rows:
            return
        # click's own layout: the help column gets what the longest name leaves of the width.
        limit = formatter.width - 6 - max(len(name) for name, _ in rows)
        with formatter.section("Commands"):
            formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        items = [
            CompletionItem(name, help=cmd.get_short_help_str())
            for name in self.list_commands(ctx)
            if name.startswith(incomplete) and not (cmd := self._stand_in(name)).hidden
        ]
        # The group's own options (--version, --help), as click's Command.shell_complete lists them.
        return items + click.Command.shell_complete(self, ctx, incomplete)


def load_all(group: LazyGroup) -> dict[str, click.Command]:
    """Every command, imported (for tests and tools that walk the whole tree)."""
    ctx: Any = None
    return {name: cmd for name in group.list_commands(ctx) if (cmd := group.get_command(ctx, name)) is not None}

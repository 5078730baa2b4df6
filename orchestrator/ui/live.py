"""The live view on a terminal (rich): position, phase and ETA at the bottom, coloured lines scrolling above it."""

from __future__ import annotations

import time
from typing import Any, TextIO

from rich.console import Console, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from orchestrator.common.printable import unguarded, visible
from orchestrator.ui import progress
from orchestrator.ui.progress import PlainReporter, duration, severity

STYLES = {"error": "bold red", "warning": "yellow", "info": ""}

PHASES = {
    "starting": "starting",
    "slot": "next launch",
    "lock wait": "waiting for the host lock",
    "cleanup": "cleanup: leftovers, port, idle GPUs",
    "launch": "launching the server",
    "loading": "loading",
    "env check": "env check: reading every process's environment back",
    "teardown": "teardown",
    "gpu wait": "waiting for GPU memory to return to idle",
    "look": "looking at the blocks so far: another one needed?",
}

# Verdict words of the report (comparison lines, --fail-on's decision) and their colours.
_VERDICTS = (
    ("-> FASTER", "bold green"),
    ("-> SLOWER", "bold red"),
    ("-> no difference", "bold cyan"),
    ("-> inconclusive", "bold yellow"),
    ("-> exit 3", "bold red"),
    ("-> exit 4", "bold yellow"),
    ("-> exit 0", "bold green"),
)


def line_style(line: str) -> str:
    for mark, style in _VERDICTS:
        if mark in line:
            return style
    if line.startswith("SIMULATED"):
        return "magenta"
    return STYLES[severity(line)]


def console_for(out: TextIO) -> Console:
    # soft_wrap: a report's wide tables must not be broken at the terminal's width; NO_COLOR is read by rich. Its
    # colours are escape sequences: it writes past the command line's guard (common/printable), so what it is given
    # to show is made visible here.
    return Console(file=unguarded(out), force_terminal=True, highlight=False, soft_wrap=True, markup=False, emoji=False)


class LiveReporter(PlainReporter):
    """On a terminal: every progress line (coloured by what it says) above a live view of where the experiment is."""

    def __init__(self, out: TextIO, *, quiet: bool = False, verbose: bool = False) -> None:
        super().__init__(out, quiet=quiet, verbose=verbose)
        self.console = console_for(out)
        self.spinner = Spinner("dots", style="cyan")
        self.live = Live(
            console=self.console,
            get_renderable=self.view,
            refresh_per_second=4,
            transient=True,  # the final report takes its place
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def show_phase(self, name: str, data: dict[str, Any]) -> None:
        # A phase of a few milliseconds (env check, cleanup) is still drawn once.
        if self.tracker.update(name, data) and self.live.is_started:
            self.live.refresh()

    def emit(self, text: str, file: TextIO | None = None) -> None:
        if file is not None and file is not self.out:
            super().emit(text, file)
            return
        line = Text()
        line.append(time.strftime("%H:%M:%S "), style="dim")
        line.append(visible(text, lines=True), style=line_style(text))
        self.console.print(line)

    def report(self, text: str) -> None:
        for line in text.splitlines():
            self.console.print(Text(visible(line), style=line_style(line)))

    def __enter__(self) -> LiveReporter:
        super().__enter__()
        if not self.quiet:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.live.stop()
        finally:
            super().__exit__(*exc)

    # ---------------------------------------------------------------- the view

    def view(self) -> RenderableType:
        t = self.tracker
        head = Text()
        head.append(f"experiment {t.experiment}" if t.experiment else "orch", style="bold")
        if t.arms:
            head.append(": " + visible(" vs ".join(t.arms)))
        if t.simulated:
            head.append("  SIMULATED", style="magenta")
        head.append(f"  elapsed {duration(t.clock() - t.started)}", style="dim")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True, overflow="ellipsis")
        grid.add_row(self.spinner, head)
        if t.launch:
            cap = f" (at most {t.max_blocks})" if t.max_blocks else ""
            pos = Text()
            pos.append(f"launch {t.launch}/{t.launches}", style="bold")
            pos.append(f" · block {t.block}/{t.blocks}{cap} · {visible(t.arm)}")
            eta = t.eta_text()
            pos.append("  " + (eta or "ETA after the first launch"), style="green" if eta else "dim")
            grid.add_row("", pos)
        grid.add_row("", self.phase_text())
        return grid

    def phase_text(self) -> Text:
        t, p, d = self.tracker, self.tracker.phase, self.tracker.data
        who = d.get("profile") or t.arm
        text = Text(f"{visible(str(who))}: " if who else "")
        if p in ("warmup", "run"):
            level = d.get("concurrency", 1)
            label = f"{p} {int(d.get('index', 0)) + 1}/{d.get('of', '?')}"
            if d.get("rate") is not None:
                label += f" @ {float(d['rate']):g} req/s"
            elif level != 1:
                label += f" @ {level} streams"
        else:
            label = PHASES.get(p, p)
        text.append(label, style="bold cyan")
        text.append(f" {t.elapsed():.1f}s")
        if p == "loading":
            if d.get("state") not in (None, "loading"):
                text.append(f" ({visible(str(d['state']))})")
            if d.get("log"):
                text.append("  log: " + visible(str(d["log"])), style="dim")
        elif p == "gpu wait" and d.get("timeout_s") is not None:
            text.append(f" (at most {d['timeout_s']:.0f}s)")
        elif p == "lock wait" and d.get("holder"):
            text.append(f" ({visible(str(d['holder']))})")
        flight = progress.live_run() if p in ("warmup", "run") else None
        if p == "run" and flight is not None and flight[1] > 0:
            text.append(f"  {flight[0]:.0f} tokens, {flight[0] / flight[1]:.1f} tok/s so far", style="green")
        if p in ("warmup", "run") and t.tokens:
            # Every token of the launch: its finished warmups and runs, and the one in flight.
            text.append(f"  {t.tokens + (flight[0] if flight else 0):.0f} tokens so far this launch")
            if t.last is not None and not t.last.warmup:
                text.append(f", last run {t.last.tok_s:.1f} tok/s")
        return text

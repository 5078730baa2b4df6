"""An experiment's progress as timestamped plain lines (or live: live.py)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.common.printable import visible

if TYPE_CHECKING:  # bench reports its phases through this module
    from orchestrator.config.workload import BenchConfig
    from orchestrator.results.run import RunResult

# ---------------------------------------------------------------- the run in flight

_REMOTE: dict[str, float] = {}
# A host's report this old is stale (its heartbeats come every second while a run is in flight).
REMOTE_FRESH_S = 3.0


def remote_live(data: dict[str, Any]) -> None:
    """A host agent's heartbeat said how far the run in flight there is (SSH hosts)."""
    with contextlib.suppress(TypeError, ValueError):
        _REMOTE.update(
            active=float(data.get("active", 0)),
            tokens=float(data.get("tokens", 0)),
            elapsed=float(data.get("elapsed", 0)),
            at=time.monotonic(),
        )


def live_run() -> tuple[float, float] | None:
    """(tokens so far, seconds) of the benchmark run in flight: from the host's heartbeats, else from the client
    in this process (a local host, or --client local); None when no run is in flight."""
    if _REMOTE.get("active") and time.monotonic() - _REMOTE.get("at", 0.0) < REMOTE_FRESH_S:
        return _REMOTE["tokens"], _REMOTE["elapsed"]
    from orchestrator.client import runner

    here = runner.live()
    return (here["tokens"], here["elapsed"]) if here["active"] else None


# ---------------------------------------------------------------- what is going on, and how long the rest takes

_ERROR = ("FAILED", " failed;", " interrupted;", "not repeating the run", "NOT idle", "would not die", "still busy")
_WARNING = ("NOTE:", "WARNING", "ENV MISMATCH", "INVALID", "SIGKILL needed", " is busy", "cleaning up", "killing its")


def severity(line: str) -> str:
    """error, warning or info: what a progress line is coloured as (and whether -q still shows it)."""
    if any(mark in line for mark in _ERROR):
        return "error"
    if any(mark in line for mark in _WARNING):
        return "warning"
    return "info"


_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def log_line(tail: str, width: int = 160) -> str:
    """The last thing a server's log says, fit for one line of a terminal (progress bars redraw with \\r)."""
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    last = lines[-1].split("\r")[-1] if lines else ""
    last = visible(_CONTROL.sub("", last).strip())  # what the colour codes leave (a title, a bidi override): shown
    return last if len(last) <= width else last[: width - 3] + "..."


def duration(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass(kw_only=True)
class Tracker:
    """The experiment's position and phase, from the core's phases; the ETA once one launch has been timed."""

    clock: Callable[[], float] = time.monotonic
    experiment: str = ""
    arms: tuple[str, ...] = ()
    simulated: bool = False
    launch: int = 0
    launches: int = 0
    block: int = 0
    blocks: int = 0
    max_blocks: int | None = None
    arm: str = ""
    phase: str = "starting"
    data: dict[str, Any] = field(default_factory=dict)
    phase_since: float = 0.0
    started: float = 0.0
    launch_since: float | None = None
    durations: list[float] = field(default_factory=list)
    tokens: int = 0  # output tokens of this launch's finished warmups and runs (the view adds the one in flight)
    last: RunResult | None = None

    def __post_init__(self) -> None:
        self.started = self.phase_since = self.clock()

    def update(self, name: str, data: dict[str, Any]) -> bool:
        """Take one hook; True when the phase changed (not merely its details)."""
        now = self.clock()
        if name == "experiment":
            self.experiment = str(data.get("id", ""))
            self.arms = tuple(data.get("arms", ()))
            self.simulated = bool(data.get("simulated"))
            return False
        if name == "slot":
            if self.launch_since is not None:
                self.durations.append(now - self.launch_since)
            self.launch_since = now
            self.launch, self.launches = int(data["n"]), int(data["total"])
            self.block, self.blocks = int(data["block"]), int(data["blocks"])
            self.max_blocks = data.get("max_blocks")
            self.arm = str(data.get("arm", ""))
            self.tokens, self.last = 0, None
            name, data = "slot", {}
        changed = name != self.phase or data.get("index") != self.data.get("index")
        if changed:
            self.phase_since = now
        self.phase, self.data = name, data
        return changed

    def finished(self, run: RunResult) -> None:
        self.tokens += run.tokens
        self.last = run
        # The host's last heartbeat of this run stays fresh a few seconds: it must not count again as in flight.
        _REMOTE["active"] = 0.0

    def per_launch_s(self) -> float | None:
        return sum(self.durations) / len(self.durations) if self.durations else None

    def eta_s(self, launches: int | None = None) -> float | None:
        """Seconds until launch number `launches` (default: the design's last) ends, or None before one was timed."""
        mean = self.per_launch_s()
        if mean is None or self.launch_since is None:
            return None
        current = max(0.0, mean - (self.clock() - self.launch_since))
        return max(0, (launches or self.launches) - self.launch) * mean + current

    def eta_text(self) -> str:
        eta = self.eta_s()
        if eta is None:
            return ""
        # A launch slower than the ones before it is not "0s" from done: it is done when it is done.
        text = f"ETA {duration(eta)}" if eta >= 1 else "ETA any moment"
        if self.max_blocks and self.blocks and self.max_blocks > self.blocks:
            # --blocks auto: the design grows one block per undecided look, up to max_blocks.
            most = self.eta_s(self.launches // self.blocks * self.max_blocks)
            text += f" to block {self.blocks} (at most {self.max_blocks} blocks: {duration(most or 0)})"
        return text

    def elapsed(self) -> float:
        return self.clock() - self.phase_since


# ---------------------------------------------------------------- plain lines (cron, CI, pipes)


def run_line(run: RunResult, config: BenchConfig) -> str:
    """A finished run (or warmup) as one progress line."""
    if run.errors:
        # Its token count and rate describe only the requests that completed: what matters is what failed, and how
        # long the run really took (a stall lasts stall_s after the last token).
        what = f"Warmup {run.index + 1}/{config.warmup}" if run.warmup else f"Run {run.index + 1}/{config.runs}"
        streams = f" @ {run.concurrency} streams" if run.concurrency > 1 else ""
        streams = f" @ {run.rate:g} req/s" if run.rate else streams
        why = run.invalid_reason or f"{run.errors} of {run.requests} requests failed"
        return f"  {what}{streams}: FAILED after {run.seconds:.2f}s: {why}"
    if run.warmup:
        return f"  Warmup {run.index + 1}/{config.warmup} done ({run.tokens} tokens)"
    if run.rate and (run.open_loop.get("stopped") or {}).get("capacity"):
        # The client was full (client-limited): nothing of the run is measured, only why and what to do.
        return f"  Run {run.index + 1}/{config.runs} @ {run.rate:g} req/s: INVALID, {run.invalid_reason}"
    if run.rate:
        line = open_loop_line(run, config)
    elif run.concurrency == 1:  # the seed's line, character for character
        line = (
            f"  Run {run.index + 1}/{config.runs}: {run.tokens} tokens in {run.seconds:.2f}s = {run.tok_s:.1f} tok/s "
            f"(prompt: {run.prompt_tokens} toks)"
        )
    else:
        itl = run.metrics.get("itl", {})
        line = (
            f"  Run {run.index + 1}/{config.runs} @ {run.concurrency} streams: {run.requests} requests, "
            f"{run.tokens} tokens in {run.seconds:.2f}s = {run.tok_s:.1f} tok/s per stream, "
            f"{run.aggregate_tok_s:.0f} tok/s aggregate"
            + (f", ITL p50 {itl['p50'] * 1000:.1f} ms" if itl.get("p50") is not None else "")
        )
    if run.spec_accept_length is not None:
        # the seed's line (concurrency 1) as it always read; the longer lines are lists of clauses
        line += ("" if not run.rate and run.concurrency == 1 else ",") + f" accept len {run.spec_accept_length:.2f}"
        spec = run.metrics.get("spec") or {}
        if spec.get("drafted"):
            line += f" ({spec['accepted']:.0f} of {spec['drafted']:.0f} drafted tokens accepted)"
    if not run.valid:
        line += f"  INVALID: {run.invalid_reason}"
    return line


def open_loop_line(run: RunResult, config: BenchConfig) -> str:
    """A finished open-loop run: its rate achieved against the schedule's, latency from the scheduled send times,
    and a shortfall (who held the rate back)."""
    from orchestrator.client.summary import lag_text

    ol = run.open_loop
    e2e, ttft = run.metrics.get("e2e") or {}, run.metrics.get("ttft") or {}

    def rate(key: str) -> str:
        value = ol.get(key)
        return "-" if value is None else f"{value:.2f}"

    lag = (ol.get("send_lag") or {}).get("p99")
    line = (
        f"  Run {run.index + 1}/{config.runs} @ {run.rate:g} req/s: {run.requests} requests, achieved "
        f"{rate('achieved_rate')} req/s of {rate('scheduled_rate')} scheduled, {run.tokens} tokens, "
        f"{run.tok_s:.1f} tok/s per stream, {run.aggregate_tok_s:.0f} tok/s aggregate"
        + (f", TTFT p50 {ttft['p50'] * 1000:.0f} ms" if ttft.get("p50") is not None else "")
        + (f", E2E p99 {e2e['p99']:.2f}s" if e2e.get("p99") is not None else "")
        + (f", send lag p99 {lag_text(lag)}" if lag is not None else "")
    )
    if ol.get("held"):
        line += f", {ol['held']} held by --max-concurrency {ol.get('max_concurrency')}"
    stopped = ol.get("stopped")
    if stopped:
        where = " in the client" if stopped.get("limited") == "client" else ""
        line += f"; STOPPED SENDING after {stopped.get('sent')} of {stopped.get('of')} requests: over-saturated{where}"
    elif ol.get("limited"):
        line += f"; SHORT OF ITS RATE ({ol['limited']}-limited)"
    return line


def request_line(req: dict[str, Any]) -> str:
    """-v: one request of a run."""
    ttft, e2e = req.get("ttft_s"), req.get("e2e_s")
    line = f"    request {int(req.get('index', 0)) + 1}: {req.get('tokens', 0)} tokens"
    line += f", prompt {req.get('prompt_tokens')}"
    line += f", TTFT {ttft * 1000:.1f} ms" if isinstance(ttft, int | float) else ""
    line += f", {e2e:.2f}s end to end" if isinstance(e2e, int | float) else ""
    accept = req.get("accept_length")
    line += f", accept len {accept:.2f}" if isinstance(accept, int | float) else ""
    return line + (f", ERROR: {req['error']}" if req.get("error") else "")


class PlainReporter:
    """Progress as lines, each with the time of day; -q keeps only errors (on stderr), -v adds every request. It is
    the core's events (events.Events): the lines and the phases come through the object passed in, nothing else."""

    HEARTBEAT_S = 30.0  # a long model load says so this often (-v: every 5 s)
    watched = True

    def __init__(self, out: TextIO, *, quiet: bool = False, verbose: bool = False, err: TextIO | None = None) -> None:
        self.out, self.err = out, err or sys.stderr
        self.quiet, self.verbose = quiet, verbose
        self.bench: BenchConfig | None = None
        self.tracker = Tracker()
        self._beat = 0.0

    def line(self, msg: str) -> None:
        if self.quiet:
            if severity(msg) == "error":
                self.emit(msg, self.err)
            return
        if msg.startswith("launch ") and self.tracker.eta_text():
            first, _, rest = msg.partition("\n")
            msg = f"{first}; {self.tracker.eta_text()}" + (f"\n{rest}" if rest else "")
        self.emit(msg)

    def run(self, name: str, run: RunResult) -> None:
        self.tracker.finished(run)
        if self.quiet or self.bench is None:
            return
        self.emit(run_line(run, self.bench))
        if self.verbose:
            for req in run.per_request:
                self.emit(request_line(req))

    def phase(self, name: str, **info: Any) -> None:
        with contextlib.suppress(Exception):  # showing progress must never break a measurement
            self.show_phase(name, info)

    def show_phase(self, name: str, data: dict[str, Any]) -> None:
        if self.tracker.update(name, data):
            self._beat = self.tracker.clock()
        every = 5.0 if self.verbose else self.HEARTBEAT_S
        if name == "loading" and not self.quiet and self.tracker.clock() - self._beat >= every:
            self._beat = self.tracker.clock()
            log = f"; log: {data['log']}" if data.get("log") else ""
            state = data.get("state", "loading")
            self.emit(f"{data.get('profile', '')}: {state} for {self.tracker.elapsed():.0f}s{log}")

    def emit(self, text: str, file: TextIO | None = None) -> None:
        print(time.strftime("%H:%M:%S ") + text, file=file or self.out, flush=True)

    def report(self, text: str) -> None:
        """The final report (or -q's verdict): as it is, no timestamps."""
        print(text, file=self.out, flush=True)

    def __enter__(self) -> PlainReporter:
        return self  # the live view (live.py) starts here

    def __exit__(self, *exc: object) -> None:
        pass


def is_terminal(out: TextIO) -> bool:
    """A terminal that can show a live view (not a pipe, a file, or TERM=dumb)."""
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"

"""The benchmark client: stdlib-only asyncio HTTP/1.1 streaming, shipped to hosts with the agent.

It runs next to the server (through the host-side agent) by default, or on the orch machine (`--client local`).
Token accounting is per token, not per chunk: under speculative decoding one stream chunk carries several tokens,
and a chunk of k tokens after a gap g contributes k inter-token latencies of g/k. Each read is parsed where it lands
(`streamparse`), with one timestamp for every event it brought; see docs/client.md.

This module runs a benchmark (c streams, or open loop through `openloop`; Ctrl-C); its parts: `request` (bodies, the
Record, token counts checked), `stream` (one streamed request), `openloop` (requests sent at scheduled times),
`watchdog` (the launch's liveness, polled during a run), `metrics` (/metrics counters) and `summary` (a run reduced
to its metrics and validity).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from orchestrator.client.headroom import Headroom, closed_loop_room
from orchestrator.client.metrics import counter_deltas, scrape_metrics
from orchestrator.client.openloop import run_schedule
from orchestrator.client.request import (
    KEEP_OUTPUT,
    Record,
    Wire,
    session_body,
    session_turn,
)
from orchestrator.client.stream import Guard, check_bounds, fetch, live, live_begin, live_end
from orchestrator.client.summary import summarize_run
from orchestrator.client.watchdog import watch
from orchestrator.common import stopsignals

# What the rest of orch (bench, progress, the agent) and benchmarks/client_fidelity.py use through this module.
__all__ = ["Wire", "live", "run", "run_requests", "summarize_run"]


async def run_requests(
    host: str,
    port: int,
    endpoint: Wire | dict[str, Any],
    bodies: list[dict[str, Any]],
    max_tokens: list[int],
    concurrency: int,
    timeout: float,
    *,
    stall_s: float = 60.0,
    first_token_s: float = 180.0,
    watchdog: Callable[[], str | None] | None = None,
    watchdog_every_s: float = 1.0,
) -> tuple[list[Record], float, dict[str, Any], str | None]:
    """c workers take requests (or multi-turn sessions, session_units) in order until none is left. Returns records,
    the busy window, metric deltas and why the run was aborted (None unless the watchdog said so).

    The busy window ends when the first worker finds no request left: until then all c streams were busy, so
    tokens received inside it measure throughput at concurrency c, without the drain at the end. `watchdog` is
    called every watchdog_every_s while the run is in flight (in a thread); a reason from it cancels every request
    in flight or queued, each recorded with that reason.
    """
    check_bounds(timeout=timeout, stall_s=stall_s, first_token_s=first_token_s, watchdog_every_s=watchdog_every_s)
    wire = Wire.of(endpoint)
    before = await scrape_metrics(host, port, wire)
    live_begin()
    t0 = time.perf_counter()
    records = [Record(index=i, start=0.0, max_tokens=max_tokens[i]) for i in range(len(bodies))]
    units = session_units(bodies)
    next_unit = 0
    sent = [False] * len(bodies)
    window_end: float | None = None
    aborted: str | None = None
    guards: set[Guard] = set()

    def abort(reason: str) -> None:
        nonlocal aborted
        aborted = reason
        for g in list(guards):
            g.stop(f"aborted: {reason}")

    async def worker() -> None:
        nonlocal next_unit, window_end
        while True:
            if next_unit >= len(units) or aborted is not None:
                if window_end is None:
                    window_end = time.perf_counter() - t0
                return
            first, end = units[next_unit]
            next_unit += 1
            await send_unit(records, bodies, sent, first, end, send, lambda: aborted is not None)

    async def send(body: dict[str, Any], rec: Record) -> None:
        rec.start = time.perf_counter() - t0
        await fetch(
            host, port, wire, body, rec, t0, timeout, stall_s=stall_s, first_token_s=first_token_s, guards=guards
        )
        if rec.error is not None:
            rec.failed = time.perf_counter() - t0

    watcher = (
        asyncio.get_running_loop().create_task(watch(watchdog, watchdog_every_s, abort))
        if watchdog is not None
        else None
    )
    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(units)))))
    finally:
        live_end()
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    if aborted is not None:
        for rec in records:
            if not sent[rec.index]:
                rec.error = f"aborted: {aborted} (not sent)"
    # After an abort the server may be the reason: do not wait on its /metrics.
    after = await scrape_metrics(host, port, wire) if before is not None and aborted is None else None
    deltas: dict[str, Any] = {}
    if before is not None and after is not None:
        deltas = counter_deltas(before, after, wire)
    return records, window_end if window_end is not None else time.perf_counter() - t0, deltas, aborted


def run(
    host: str,
    port: int,
    endpoint: Wire | dict[str, Any],
    bodies: list[dict[str, Any]],
    max_tokens: list[int],
    concurrency: int,
    timeout: float = 600.0,
    min_duration_s: float = 0.0,
    *,
    stall_s: float = 60.0,
    first_token_s: float = 180.0,
    watchdog: Callable[[], str | None] | None = None,
    watchdog_every_s: float = 1.0,
    open_loop: dict[str, Any] | None = None,
    descriptors_each: int = 1,
) -> dict[str, Any]:
    """One benchmark run, measured and summarised where this code runs (the host, or the orch machine).

    A request fails when no token arrives for stall_s after its first (or none within first_token_s); `watchdog`,
    polled every watchdog_every_s, aborts the whole run by returning a reason. See docs/client.md.

    With `open_loop` ({"schedule": seconds per request, "rate", "arrivals", "max_concurrency"}) the requests are sent
    at their scheduled times (run_schedule) instead of by `concurrency` busy streams, and the summary has an
    "open_loop" part (summary.open_loop_summary). `descriptors_each`: the descriptors a request takes in this
    process (more than its connection where orch relays it to a remote host here), for the requests in flight the
    client can hold (client.headroom).
    """
    check_bounds(timeout=timeout, stall_s=stall_s, first_token_s=first_token_s, watchdog_every_s=watchdog_every_s)
    if open_loop is not None:
        if any(session_turn(b) is not None for b in bodies):
            raise ValueError("multi-turn sessions run on closed-loop streams, not on an open-loop schedule")
        cap = open_loop.get("max_concurrency")
        done = _run_interruptibly(
            lambda: run_schedule(
                host,
                port,
                endpoint,
                bodies,
                max_tokens,
                [float(t) for t in open_loop["schedule"]],
                timeout,
                max_concurrency=int(cap) if cap is not None else None,
                stall_s=stall_s,
                first_token_s=first_token_s,
                watchdog=watchdog,
                watchdog_every_s=watchdog_every_s,
                stop_oversaturated=bool(open_loop.get("stop_oversaturated")),
                descriptors_each=descriptors_each,
            )
        )
        info = {**open_loop, "peak_in_flight": done.peak, **({"stopped": done.stopped} if done.stopped else {})}
        return summarize_run(done.records, done.window, 0, done.deltas, min_duration_s, done.aborted, open_loop=info)
    room = closed_loop_room(concurrency, max(max_tokens, default=1), descriptors_each)
    if concurrency > room.requests and bodies:
        # Sending would end in "Too many open files" halfway through the level and look like the server failing:
        # nothing is sent, and the run says the client is the limit.
        return client_limited_run(concurrency, room, len(bodies), max_tokens, min_duration_s)
    records, window, deltas, aborted = _run_interruptibly(
        lambda: run_requests(
            host,
            port,
            endpoint,
            bodies,
            max_tokens,
            concurrency,
            timeout,
            stall_s=stall_s,
            first_token_s=first_token_s,
            watchdog=watchdog,
            watchdog_every_s=watchdog_every_s,
        )
    )
    return summarize_run(records, window, concurrency, deltas, min_duration_s, aborted)


def client_limited_run(
    concurrency: int, room: Headroom, requests: int, max_tokens: list[int], min_duration_s: float
) -> dict[str, Any]:
    """A closed-loop run this client cannot hold (more streams than its open files or memory allow): none sent."""
    why = (
        f"client-limited: {concurrency} streams at once need more than this client can hold: {room.why}; raise the "
        "open-file limit (ulimit -n) where the client runs, or lower --concurrency"
    )
    records = [Record(index=i, start=0.0, max_tokens=max_tokens[i], error=f"not sent: {why}") for i in range(requests)]
    summary = summarize_run(records, 0.0, concurrency, {}, min_duration_s)
    summary["client_limited"] = why
    return summary


async def send_unit(
    records: list[Record],
    bodies: list[dict[str, Any]],
    sent: list[bool],
    first: int,
    end: int,
    send: Callable[[dict[str, Any], Record], Coroutine[Any, Any, None]],
    stopped: Callable[[], bool],
) -> None:
    """Requests [first, end) one after another on one stream: a lone request, or a session's turns in order, each
    carrying the conversation so far with the server's own replies. A failed turn leaves the session's later turns
    unsent (failed too: the conversation they continue does not exist)."""
    history: list[dict[str, Any]] = []
    for i in range(first, end):
        if stopped():
            return
        rec, body = records[i], bodies[i]
        sent[i] = True
        rec.turn = session_turn(body)
        conversation: list[dict[str, Any]] = []
        keep = True
        if rec.turn is not None:
            body, conversation = session_body(body, history)
            keep = KEEP_OUTPUT in body
            rec.output = []  # the reply is fed back into the next turn
        await send(body, rec)
        if rec.error is not None:
            for later in records[i + 1 : end]:
                sent[later.index] = True
                later.turn = session_turn(bodies[later.index])
                later.error = f"not sent: turn {(rec.turn or 0) + 1} of its session failed ({rec.error})"
            return
        if rec.turn is not None:
            history = [*conversation, {"role": "assistant", "content": "".join(rec.output or [])}]
            if not keep:
                rec.output = None


def session_units(bodies: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The [start, end) index ranges a stream takes at once: each multi-turn session's turns (from a turn 0 to the
    next), and every other request alone."""
    units: list[tuple[int, int]] = []
    for i, body in enumerate(bodies):
        turn = session_turn(body)
        if units and turn is not None and turn > 0:
            units[-1] = (units[-1][0], i + 1)
        else:
            units.append((i, i + 1))
    return units


T = TypeVar("T")

# Rounds of cancelling what is still pending before the event loop closes: each round awaits what it cancelled.
DRAIN_ROUNDS = 10


def _run_interruptibly(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run, except that Ctrl-C (and orch's SIGTERM, SIGHUP) always ends the run promptly with KeyboardInterrupt.

    From Python 3.11 asyncio.run turns the first SIGINT into one cancellation of the main task, and
    asyncio.wait_for swallows a cancellation that races with its inner task finishing (seen in CI: a Ctrl-C at the
    start of a run was lost and the benchmark went on). Here a Ctrl-C cancels the run again every 50 ms until it
    ends, and the run then always ends in KeyboardInterrupt, whatever the coroutine made of the cancellation (or
    raised instead). Raising inside the loop instead would leave tasks holding a KeyboardInterrupt nobody retrieves.
    The handlers are in place before the loop is built and until it is closed: a signal raising KeyboardInterrupt
    half-way through building or closing a loop leaves a broken object whose destructor prints a traceback (seen
    with SIGTERM). Only the first signal does anything, and the handler never raises: a flood of them (a `kill -INT`
    loop) neither stacks up cancellations nor calls into a loop that is closing ("Event loop is closed"), and orch's
    handler, back in place, takes the stop as taken (stopsignals), so the signals after it do not cut short the
    teardown that follows.
    """
    interrupted = False
    state: dict[str, Any] = {}

    def keep_cancelling() -> None:
        task = state.get("task")
        if task is not None and not task.done():
            task.cancel()
            state["loop"].call_later(0.05, keep_cancelling)

    def on_signal(signum: int, frame: object) -> None:
        nonlocal interrupted
        if interrupted:
            return
        interrupted = True
        loop = state.get("loop")
        if loop is not None:
            # A loop already closed raises here: the flag alone then says it, read once the loop is closed.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(keep_cancelling)

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in stopsignals.STOP_SIGNALS:
            current = signal.getsignal(sig)
            # Only handlers that would raise in the middle of the loop (Python's for SIGINT, orch's for the others).
            if stopsignals.raises(current):
                previous[sig] = signal.signal(sig, on_signal)
    done: list[T] = []
    try:
        loop = asyncio.new_event_loop()
        state["loop"] = loop
        try:
            if not interrupted:
                task: asyncio.Task[T] = loop.create_task(make())
                state["task"] = task
                try:
                    done.append(loop.run_until_complete(task))
                except asyncio.CancelledError:
                    if not interrupted:
                        raise
        finally:
            # Cancel and await every task still pending, again while cancelling one starts another (a request's
            # cleanup may): a task left pending when the loop closes prints "Task was destroyed but it is pending",
            # and one started after it "Event loop is closed".
            for _ in range(DRAIN_ROUNDS):
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                if not pending:
                    break
                for t in pending:
                    t.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    finally:
        # Taken before orch's handler is back (and again after, for a signal that came in between), so that it
        # only counts the signals after this one.
        ours = any(h is stopsignals.raise_interrupt for h in previous.values())
        if interrupted and ours:
            stopsignals.stop_taken()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if interrupted:
            if ours:
                stopsignals.stop_taken()
            raise KeyboardInterrupt
    return done[0]

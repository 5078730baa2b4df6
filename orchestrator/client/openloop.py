"""An open-loop run: each request sent at its scheduled time, whatever the requests before it are doing."""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.client.headroom import Headroom, headroom
from orchestrator.client.metrics import counter_deltas, scrape_metrics
from orchestrator.client.request import Record, Wire
from orchestrator.client.stream import Guard, check_bounds, fetch, live_begin, live_end
from orchestrator.client.watchdog import watch

# The event loop's timers wake up to a millisecond late (epoll's timeout is in whole milliseconds, rounded up): the
# last stretch before a request is due is waited out by yielding to the loop instead, which keeps reading streams.
SPIN_S = 0.0015

# Over-saturation (docs/load.md#over-saturation): checked every CHECK_S once the run is MIN_S old and at least
# LATENCIES typical request latencies long; the second half of the time so far must have had MIN_DUE requests due,
# of which the server finished DEFICIT fewer (and at least MIN_DEFICIT and SIGMAS x sqrt(due) fewer: more than the
# arrivals' own Poisson noise), at TIMES checks in a row. The typical latency is that of the first EARLY requests to
# finish.
CHECK_S = 0.5
MIN_S = 3.0
LATENCIES = 2.5
MIN_DUE = 20
DEFICIT = 0.2
MIN_DEFICIT = 8
SIGMAS = 3.0
TIMES = 3
EARLY = 5


def oversaturation(history: list[tuple[float, int, int]], latency_s: float | None, *, by: str = "server") -> str | None:
    """Why an open-loop run is over-saturated, from its (seconds, requests due, requests finished) checks so far,
    or None: over the second half of the time so far the server finished clearly fewer requests than fell due, so the
    backlog grows with time (a queue without a steady state) instead of settling where rate x latency puts it (Little's
    law). `latency_s`: a typical finished request's end-to-end latency (None: none finished yet, no judgement).

    by="client": the same judgement on (seconds, requests due, requests sent), the backlog waiting in the client
    (held by --max-concurrency, or behind a client that cannot send on time); latency_s 0 there, since sending a
    request that is due waits for no answer."""
    if not history or latency_s is None:
        return None
    t, due, done = history[-1]
    if t < max(MIN_S, LATENCIES * latency_s):
        return None
    # the last check at or before half the time so far
    k = bisect.bisect_right([h[0] for h in history], t / 2) - 1
    if k < 0:
        return None
    t_half, due_half, done_half = history[k]
    arrived, finished = due - due_half, done - done_half
    if arrived < MIN_DUE or arrived - finished < max(MIN_DEFICIT, DEFICIT * arrived, SIGMAS * math.sqrt(arrived)):
        return None
    if by == "client":
        return (
            f"over-saturated in the client: from {t_half:.1f}s to {t:.1f}s {arrived} requests fell due and the client "
            f"sent {finished}; the backlog waiting in the client grew from {due_half - done_half} to {due - done}"
        )
    return (
        f"over-saturated: from {t_half:.1f}s to {t:.1f}s {arrived} requests fell due and the server finished "
        f"{finished}; the backlog grew from {due_half - done_half} to {due - done}"
    )


async def until(deadline: float) -> None:
    """Return at perf_counter() `deadline`, within tens of microseconds (SPIN_S), never before it."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        await asyncio.sleep(left - SPIN_S if left > SPIN_S else 0)


class Sender:
    """The requests of one open-loop run: each sent in its own task when due, or, while `cap` are in flight, held
    in the client (first come, first served) until one ends. A record's `start` is when it was due, `sent` when its
    task began, `queued` how long the cap held it. A request due while `room` are in flight finds the client itself
    full (its open files, its memory): sending stops there, client-limited, and the requests in flight are cut (the
    run measures the client, not the server: nothing of it is used, and the server is released at once)."""

    def __init__(
        self,
        host: str,
        port: int,
        wire: Wire,
        bodies: list[dict[str, Any]],
        records: list[Record],
        limits: tuple[float, float, float],
        cap: int | None,
        stop_oversaturated: bool = False,
        room: Headroom | None = None,
    ) -> None:
        self.host, self.port, self.wire, self.bodies, self.records = host, port, wire, bodies, records
        self.stop_oversaturated = stop_oversaturated
        self.room = room or Headroom(requests=len(records) + 1, why="not bounded")
        self.saturated: str | None = None  # why sending stopped early (over-saturation, a full client), if it did
        self.saturated_at = 0.0
        self.limited_by = "server"  # where the backlog was when sending stopped: "server" or "client"
        self.full = False  # sending stopped because the client could hold no more requests in flight (room)
        self.flying: set[int] = set()  # the requests in flight
        self.cut: set[int] = set()  # those in flight when the client was full: cancelled, left out of the run
        self.sent = self.finished = 0
        self.early: list[float] = []  # end-to-end latencies of the first EARLY requests to finish
        self.timeout, self.stall_s, self.first_token_s = limits  # fetch's: a request's timeout and stall bounds
        self.cap = cap
        self.loop = asyncio.get_running_loop()
        self.t0 = 0.0
        self.aborted: str | None = None
        self.guards: set[Guard] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.held: collections.deque[tuple[int, float]] = collections.deque()  # (request, when it was due)
        self.in_flight = self.peak = 0
        self.dispatcher: asyncio.Task[None] | None = None
        self.closed = False  # the run is over (or interrupted): nothing more is sent

    def close(self) -> list[asyncio.Task[None]]:
        """Send nothing more and cancel the dispatcher and every request in flight (Ctrl-C, or the run's end);
        returns those tasks, for the caller to await. A request cancelled here must not start a held one: that task,
        born after the cancelling, would outlive the loop ("Task was destroyed but it is pending")."""
        self.closed = True
        self.held.clear()
        tasks = [t for t in (self.dispatcher, *self.tasks) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        return tasks

    def abort(self, reason: str) -> None:
        self.aborted = reason
        self.held.clear()
        if self.dispatcher is not None:
            self.dispatcher.cancel()  # it may be asleep until the next request is due, seconds away
        for g in list(self.guards):
            g.stop(f"aborted: {reason}")

    def stop_sending(self, why: str, at: float, by: str) -> None:
        """Send nothing more (the requests held are left out); those in flight finish and are measured."""
        self.saturated, self.saturated_at, self.limited_by = why, at, by
        self.held.clear()
        if self.dispatcher is not None and self.dispatcher is not asyncio.current_task():
            self.dispatcher.cancel()

    def start(self, i: int) -> None:
        self.sent += 1
        self.in_flight += 1
        self.flying.add(i)
        self.peak = max(self.peak, self.in_flight)
        task = self.loop.create_task(self.one(i))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def one(self, i: int) -> None:
        rec = self.records[i]
        rec.sent = time.perf_counter() - self.t0
        try:
            await fetch(
                self.host,
                self.port,
                self.wire,
                self.bodies[i],
                rec,
                self.t0,
                self.timeout,
                stall_s=self.stall_s,
                first_token_s=self.first_token_s,
                guards=self.guards,
            )
            if rec.error is not None:
                rec.failed = time.perf_counter() - self.t0
        finally:
            self.in_flight -= 1
            self.flying.discard(i)
            self.finished += 1
            if len(self.early) < EARLY and rec.e2e is not None and rec.error is None:
                self.early.append(rec.e2e)
            if self.held and self.aborted is None and self.saturated is None and not self.closed:
                j, due = self.held.popleft()
                self.records[j].queued = time.perf_counter() - self.t0 - due
                self.start(j)

    async def dispatch(self) -> None:
        for i, rec in enumerate(self.records):
            await until(self.t0 + rec.start)
            if self.cap is not None and self.in_flight >= self.cap:
                self.held.append((i, time.perf_counter() - self.t0))
            elif self.in_flight >= self.room.requests:
                # One more connection would fail (EMFILE) or starve the rest of the process, the watchdog first;
                # holding it instead would queue the schedule's rest behind this client's own limit.
                t = time.perf_counter() - self.t0
                self.full = True
                self.stop_sending(
                    f"{self.in_flight} requests in flight at {t:.2f}s were the most this client can hold: "
                    f"{self.room.why}",
                    t,
                    "client",
                )
                # Waiting for them would take their whole latency (minutes at 2,048 tokens against a flooded server)
                # to finish a run that measures nothing.
                self.cut = set(self.flying)
                for task in list(self.tasks):
                    task.cancel()
                return
            else:
                self.start(i)

    def latency(self) -> float | None:
        """The median end-to-end latency of the first EARLY requests to finish (None before the first): the
        latency before any backlog, since later ones grow with the backlog itself."""
        return statistics.median(self.early) if self.early else None

    async def watch_saturation(self) -> None:
        """Stop sending once the run is over-saturated (oversaturation, at TIMES checks in a row), at the server or
        in the client (requests due but not sent: held by --max-concurrency, or behind a client that cannot send on
        time): requests in flight finish and count; those not yet sent are left out of the run."""
        starts = [r.start for r in self.records]
        histories: dict[str, list[tuple[float, int, int]]] = {"client": [], "server": []}
        streaks = dict.fromkeys(histories, 0)
        while self.aborted is None and self.saturated is None:
            await asyncio.sleep(CHECK_S)
            if self.saturated is not None or self.dispatcher is None or (self.dispatcher.done() and not self.held):
                return  # everything was sent, or sending stopped: nothing left to stop
            t = time.perf_counter() - self.t0
            due = bisect.bisect_right(starts, t)
            histories["client"].append((t, due, self.sent))
            histories["server"].append((t, due, self.finished))
            # The client's backlog is judged without waiting out request latencies: a latency of 2,048 tokens is
            # longer than most schedules, and sending a request that is due waits for no answer.
            for by, latency in (("client", 0.0), ("server", self.latency())):
                why = oversaturation(histories[by], latency, by=by)
                streaks[by] = streaks[by] + 1 if why else 0
                if why and streaks[by] >= TIMES:
                    waiting = due - self.sent
                    if by == "server" and waiting > self.in_flight:
                        by = "client"  # the server's backlog was mostly waiting in the client, not at the server
                        why += f"; {waiting} of it waiting in the client, {self.in_flight} in flight"
                    if self.cap is not None and by == "client":
                        why += f" (held by --max-concurrency {self.cap})"
                    self.stop_sending(why, t, by)
                    return

    async def run(self) -> None:
        """Send every request on time and wait for all of them (or for an abort)."""
        self.t0 = time.perf_counter()
        self.dispatcher = self.loop.create_task(self.dispatch())
        watcher = self.loop.create_task(self.watch_saturation()) if self.stop_oversaturated else None
        try:
            await self.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

    async def wait(self) -> None:
        """Until the dispatcher has sent (or stopped sending) and every request sent has finished."""
        assert self.dispatcher is not None
        # asyncio.wait, not await: the dispatcher cancelled by an abort must not look like Ctrl-C cancelling the run.
        await asyncio.wait({self.dispatcher})
        if not self.dispatcher.cancelled() and (error := self.dispatcher.exception()) is not None:
            raise error
        while self.tasks:
            await asyncio.wait(set(self.tasks))


@dataclass(frozen=True, kw_only=True)
class ScheduleResult:
    """What an open-loop run brings back."""

    records: list[Record]
    window: float  # the last request's due time: tokens received within it measure throughput while requests came
    deltas: dict[str, Any]  # the server's counters over the run
    aborted: str | None  # why the run was aborted (None: it was not)
    peak: int  # the most requests in flight
    # Where and why it stopped sending early (None if it did not): "limited" says where the backlog was ("server" or
    # "client"), and "capacity" (the room) is there when the client could hold no more.
    stopped: dict[str, Any] | None


async def run_schedule(
    host: str,
    port: int,
    endpoint: Wire | dict[str, Any],
    bodies: list[dict[str, Any]],
    max_tokens: list[int],
    schedule: list[float],
    timeout: float,
    *,
    max_concurrency: int | None = None,
    stall_s: float = 60.0,
    first_token_s: float = 180.0,
    watchdog: Callable[[], str | None] | None = None,
    watchdog_every_s: float = 1.0,
    stop_oversaturated: bool = False,
    descriptors_each: int = 1,
) -> ScheduleResult:
    """Open loop: request i is sent schedule[i] seconds after the start (Sender): a slow answer delays no later
    send, and a request a --max-concurrency cap holds back still has its latency counted from when it was due (vLLM
    issue 54101: time queued in the client must count).

    With `stop_oversaturated`, sending stops once the server is over-saturated (oversaturation), or the backlog
    waiting in the client is: the requests in flight finish and are measured, the rest are left out, and the window
    ends where sending stopped. Whatever the flag, sending stops once the client is full (headroom.headroom: the
    requests in flight its open files and memory can hold, each request taking `descriptors_each` descriptors): the
    client is the limit, and the run says so."""
    check_bounds(timeout=timeout, stall_s=stall_s, first_token_s=first_token_s, watchdog_every_s=watchdog_every_s)
    if len(schedule) != len(bodies) or any(b < a for a, b in itertools.pairwise(schedule)):
        raise ValueError("the schedule must give one time per request, in order")
    # Before anything of the run opens a descriptor: what is open now is the rest of the process's share.
    room = headroom(max(max_tokens, default=1), descriptors_each)
    wire = Wire.of(endpoint)
    before = await scrape_metrics(host, port, wire)
    records = [Record(index=i, start=at, max_tokens=max_tokens[i]) for i, at in enumerate(schedule)]
    sender = Sender(
        host,
        port,
        wire,
        bodies,
        records,
        (timeout, stall_s, first_token_s),
        max_concurrency,
        stop_oversaturated,
        room,
    )
    live_begin()
    watcher = (
        asyncio.get_running_loop().create_task(watch(watchdog, watchdog_every_s, sender.abort))
        if watchdog is not None
        else None
    )
    try:
        await sender.run()
    finally:
        live_end()
        # Every task of the run ends here, awaited, whether the run finished or was cancelled (Ctrl-C): none may be
        # left pending when the event loop closes.
        leftovers = sender.close()
        if watcher is not None:
            watcher.cancel()
            leftovers.append(watcher)
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)
    if sender.aborted is not None:
        for rec in records:
            if rec.sent is None:
                rec.error = f"aborted: {sender.aborted} (not sent)"
    # Not after an abort (the server may be the reason) nor once the client was full (the run is not used, and a
    # flooded server may take seconds to answer): do not wait on its /metrics.
    scrape = before is not None and sender.aborted is None and not sender.full
    after = await scrape_metrics(host, port, wire) if scrape else None
    deltas = counter_deltas(before, after, wire) if before is not None and after is not None else {}
    window = schedule[-1] if schedule and sender.aborted is None else time.perf_counter() - sender.t0
    stopped = None
    sent = [r for r in records if r.sent is not None]
    if sender.saturated is not None and sender.aborted is None and len(sent) < len(records):
        stopped = {
            "at_s": sender.saturated_at,
            "sent": sender.sent,
            "of": len(records),
            "reason": sender.saturated,
            "limited": sender.limited_by,
            **({"capacity": sender.room.requests, "cut": len(sender.cut)} if sender.full else {}),
        }
        records, window = [r for r in sent if r.index not in sender.cut], sender.saturated_at
    return ScheduleResult(
        records=records, window=window, deltas=deltas, aborted=sender.aborted, peak=sender.peak, stopped=stopped
    )

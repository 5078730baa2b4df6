"""What `--sweep auto` asks for (Sweep): how many rates, the probe's workload, and the rate levels' workload."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.config import arrivals
from orchestrator.config.workload import BenchConfig

DEFAULT_LEVELS = 5  # rates from the slowest arm's synchronous rate to the fastest arm's saturated one, both included
# The probe's saturating level: this many streams kept busy unless --max-concurrency caps the sweep lower (a rate
# the cap cannot carry would only measure the cap).
THROUGHPUT_CONCURRENCY = 32
PROBE_RUNS = 2
# A saturated rate at most this much above the synchronous one is no range: the probe's medians over 2 runs move
# by a few percent between launches, so a smaller gap is noise, not a server that takes more load.
NO_RANGE_GAIN = 0.05
PROBE_REQUESTS_PER_STREAM = 2  # so a saturated run has a steady stretch between ramp-up and drain
METHOD = (
    "a probe launch per arm (one block): concurrency 1 gives its synchronous rate (requests / seconds), concurrency "
    "{c} its saturated rate (aggregate output tok/s / tokens per request), medians over {runs} runs; the sweep's rates "
    "are spread evenly from the lowest synchronous rate to the highest saturated rate, both included (GuideLLM's "
    "sweep), rounded to 3 significant figures; every rate level stops sending once the server is over-saturated"
)


def parse(spec: str) -> int:
    """`auto` or `auto:N` → N, the number of rate levels; ValueError says what is valid."""
    text = str(spec).strip().lower()
    kind, colon, count = text.partition(":")
    if kind != "auto":
        raise ValueError(f"{spec!r}: expected auto or auto:N (N rate levels, 2 to {arrivals.MAX_LEVELS})")
    if not colon:
        return DEFAULT_LEVELS
    if not count.isdigit() or not 2 <= int(count) <= arrivals.MAX_LEVELS:
        raise ValueError(f"{spec!r}: N in auto:N must be a whole number from 2 to {arrivals.MAX_LEVELS}")
    return int(count)


def no_range_reason(concurrency: int, synchronous: Mapping[str, float], saturated: Mapping[str, float]) -> str | None:
    """Why a sweep has no range of rates (None when it has one): no arm's saturated rate is above its synchronous
    rate by more than NO_RANGE_GAIN. With one stream (--max-concurrency 1) the client is the limit; with more, the
    server completed no more requests per second than one stream does. Either way each arm's one-stream rate is the
    highest it can be offered without being client-limited, so the sweep runs one level: the lowest of them."""
    if not synchronous or any(saturated.get(a, 0.0) > s * (1 + NO_RANGE_GAIN) for a, s in synchronous.items()):
        return None
    lowest = min(synchronous.values())
    if concurrency == 1:
        return (
            "no range to sweep: --max-concurrency 1 keeps one request in flight, so the client is the limit and "
            f"each arm's synchronous rate is also its highest; one rate level, the lowest of them ({lowest:g} req/s)"
        )
    return (
        f"no range to sweep: at concurrency {concurrency} no arm completed more requests per second than with one "
        "stream: the server's saturation was not reached (the client or the server is the limit); one rate level, "
        f"the lowest synchronous rate ({lowest:g} req/s)"
    )


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """What --sweep auto was asked for: how many rates, and the open-loop settings every rate level runs with."""

    levels: int = DEFAULT_LEVELS
    arrivals: str = "poisson"
    duration_s: float | None = None
    requests_per_level: int | None = None
    max_concurrency: int | None = None

    @property
    def concurrency(self) -> int:
        """The probe's saturating concurrency."""
        return min(THROUGHPUT_CONCURRENCY, self.max_concurrency or THROUGHPUT_CONCURRENCY)

    def probe_bench(self, bench: BenchConfig) -> BenchConfig:
        """The probe's workload: the sweep's own requests (prompts, tokens, seed), closed loop at 1 and the
        saturating concurrency, a short run count."""
        levels = (1,) if self.concurrency == 1 else (1, self.concurrency)
        return dataclasses.replace(
            bench,
            runs=PROBE_RUNS,
            warmup=max(1, min(bench.warmup, 2)),
            concurrency=levels,
            requests_per_stream=PROBE_REQUESTS_PER_STREAM,
            rate=(),
            arrivals="poisson",
            duration_s=None,
            requests_per_level=None,
            max_concurrency=None,
            stop_oversaturated=False,
            # Its runs give rates to choose levels by, not results: a short one (a few short requests) still does.
            min_run_s=0.0,
        )

    def swept_bench(self, bench: BenchConfig, rates: Sequence[float]) -> BenchConfig:
        """The sweep's workload: the rates found, with the open-loop settings given, every level stopping when
        over-saturated."""
        return dataclasses.replace(
            bench,
            concurrency=(1,),
            requests_per_stream=1,
            rate=tuple(rates),
            arrivals=self.arrivals,
            duration_s=self.duration_s,
            requests_per_level=self.requests_per_level,
            max_concurrency=self.max_concurrency,
            stop_oversaturated=True,
        )

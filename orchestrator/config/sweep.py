"""What `--sweep auto` asks for (Sweep): how many rates, the probe's workload, and the rate levels' workload."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.config import arrivals
from orchestrator.config.workload import BenchConfig

DEFAULT_LEVELS = 5  # rates from the slowest arm's synchronous rate to the fastest arm's saturated one, both included
# The probe's saturating level: this many streams kept busy unless --max-concurrency caps the sweep lower (a rate
# the cap cannot carry would only measure the cap).
THROUGHPUT_CONCURRENCY = 32
PROBE_RUNS = 2
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


@dataclass(frozen=True)
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

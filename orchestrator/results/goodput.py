"""A run's value of any metric a comparison may be on (`config/slo.METRICS`), goodput under an SLO included, computed
here from the run's per-request rows (so a stored experiment can be judged against another SLO)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.config.slo import METRICS, QUANTITIES, SLO, STORED_PERCENTILES
from orchestrator.stats.estimates import quantile

if TYPE_CHECKING:
    from orchestrator.results.run import RunResult

GOODPUT_METRICS = ("goodput", "goodput_tok_s")
# A run in which no request met the SLO has a goodput of 0, and a ratio needs two positive numbers: the comparison
# counts every run's good requests plus this half (the usual continuity correction). It pulls small counts toward a
# ratio of 1, so it can only make a verdict harder to reach, never easier.
CONTINUITY = 0.5


def needs_rows(slo: SLO | None, metric: str) -> bool:
    """Whether judging needs the runs' per-request rows (a stored experiment reads them only then): an SLO counts
    requests, a quantity's percentile the client does not store with each run (a p95) is computed from them, and a
    metric with a value function of its own may read them."""
    if slo is not None or (METRICS[metric].value is not None if metric in METRICS else False):
        return True
    quantity, _, p = metric.rpartition("_p")
    return quantity in QUANTITIES and p.isdigit() and int(p) not in QUANTITIES[quantity].stored


def completed(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The requests that completed (no error, an end-to-end time): the only ones that can be good."""
    return [r for r in rows if not r.get("error") and r.get("e2e_s") is not None]


def request_latencies(row: Mapping[str, Any]) -> dict[str, float | None]:
    """One completed request's latencies as an SLO checks them (config/slo.Quantity.under_slo), by quantity."""
    return {name: q.under_slo(row) for name, q in QUANTITIES.items()}


@dataclass(frozen=True, kw_only=True)
class Attainment:
    """One run (or several pooled) under an SLO: how many requests were sent, completed and good (met every limit),
    the good requests' output tokens, and the seconds goodput is per (goodput_seconds)."""

    requests: int
    completed: int
    good: int
    good_tokens: int
    seconds: float

    @property
    def req_s(self) -> float:
        """Goodput: good requests per second of the run."""
        return self.good / self.seconds if self.seconds > 0 else 0.0

    @property
    def tok_s(self) -> float:
        """Output tokens per second of the run, counting only the good requests' tokens."""
        return self.good_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def fraction(self) -> float | None:
        """Attainment: the share of the requests sent that met every limit (None without requests)."""
        return self.good / self.requests if self.requests else None

    def corrected(self, metric: str) -> float:
        """The goodput metric with CONTINUITY good requests added (half a request, and half a request's tokens)."""
        if self.seconds <= 0:
            return 0.0
        if metric == "goodput":
            return (self.good + CONTINUITY) / self.seconds
        mean_tokens = self.good_tokens / self.good if self.good else 0.0
        return (self.good_tokens + CONTINUITY * mean_tokens) / self.seconds if mean_tokens else 0.0

    def __add__(self, other: Attainment) -> Attainment:
        return Attainment(
            requests=self.requests + other.requests,
            completed=self.completed + other.completed,
            good=self.good + other.good,
            good_tokens=self.good_tokens + other.good_tokens,
            seconds=self.seconds + other.seconds,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "good_requests": self.good,
            "good_tokens": self.good_tokens,
            "seconds": self.seconds,
            "req_s": self.req_s,
            "tok_s": self.tok_s,
            "attainment": self.fraction,
        }


def attainment(rows: Sequence[Mapping[str, Any]], seconds: float, slo: SLO) -> Attainment:
    """Per-request attainment: a request is good when it completed and meets every limit of the SLO."""
    done = completed(rows)
    good = [r for r in done if slo.meets(request_latencies(r))]
    return Attainment(
        requests=len(rows),
        completed=len(done),
        good=len(good),
        good_tokens=sum(int(r.get("tokens") or 0) for r in good),
        seconds=seconds,
    )


def run_attainment(run: RunResult, slo: SLO) -> Attainment | None:
    """The run under the SLO; None when its per-request rows are not at hand (not stored, or not loaded)."""
    if not run.per_request:
        return None
    return attainment(run.per_request, goodput_seconds(run), slo)


def goodput_seconds(run: RunResult) -> float:
    """The seconds a run's goodput is per. Closed loop: from its start to its last request's end (vLLM's duration;
    the load itself waits on the server). Open loop: its requests / the rate its schedule offered them at — the time
    the schedule took to offer them — so goodput is the share within the SLO times that rate: every arm is sent the
    same schedule, and one whose requests end later has not served fewer of them (dividing by the time to the last
    end would call it slower at equal attainment)."""
    scheduled = run.open_loop.get("scheduled_rate")
    requests = run.open_loop.get("requests")
    if isinstance(scheduled, (int, float)) and scheduled > 0 and isinstance(requests, int) and requests > 0:
        return requests / float(scheduled)
    return run.seconds


def _quantity_samples(rows: Sequence[Mapping[str, Any]], quantity: str) -> list[float]:
    """One value per completed request that has one (config/slo.Quantity.sample), as the client's own percentiles
    take them (TPOT: two tokens or more)."""
    sample = QUANTITIES[quantity].sample
    return [v for r in completed(rows) if (v := sample(r)) is not None]


def run_value(run: RunResult, metric: str, slo: SLO | None = None) -> float | None:
    """The run's value of a metric (METRICS, or a RunResult field such as ttft_s); None where it cannot be had: a
    goodput without an SLO or per-request rows, a percentile without samples."""
    spec = METRICS.get(metric)
    if spec is not None and spec.value is not None:
        return spec.value(run, slo)
    quantity, _, p = metric.rpartition("_p")
    percentile = p.isdigit() and (quantity in QUANTITIES or quantity in STORED_PERCENTILES)
    if spec is None or not (percentile or metric in GOODPUT_METRICS):
        # tok_s, aggregate_tok_s, a metric registered without a value function: the RunResult field of its name
        value = getattr(run, metric, None)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if metric in GOODPUT_METRICS:
        got = run_attainment(run, slo) if slo is not None else None
        if got is None:
            return None
        return got.req_s if metric == "goodput" else got.tok_s
    if quantity in QUANTITIES and run.per_request:
        samples = sorted(_quantity_samples(run.per_request, quantity))
        return quantile(samples, int(p) / 100) if samples else None
    # ITL, and runs without their per-request rows: the percentiles the client stored (p50, p90 and p99).
    stored = (run.metrics.get(quantity) or {}).get(f"p{p}")
    return float(stored) if isinstance(stored, int | float) else None


def comparable(run: RunResult, metric: str, slo: SLO | None) -> float | None:
    """The run's value as a ratio uses it: a goodput metric with the continuity correction, anything else as is."""
    if metric in GOODPUT_METRICS:
        got = run_attainment(run, slo) if slo is not None else None
        return got.corrected(metric) if got is not None else None
    return run_value(run, metric, slo)


def block_values(
    base: Sequence[RunResult], arm: Sequence[RunResult], metric: str, slo: SLO | None
) -> tuple[list[float], list[float]] | None:
    """The run values of one block's two launches for a ratio, or None when a run has no usable value. A block in
    which no request of either launch met the SLO is a tie (both goodputs are 0): every value 1, a ratio of exactly 1,
    whatever the runs' lengths (which the correction alone would compare)."""
    b = [comparable(r, metric, slo) for r in base]
    a = [comparable(r, metric, slo) for r in arm]
    bv, av = [v for v in b if v is not None], [v for v in a if v is not None]
    if len(bv) != len(b) or len(av) != len(a):
        return None
    if metric in GOODPUT_METRICS and slo is not None and not any(good_requests(r, slo) for r in (*base, *arm)):
        return [1.0] * len(bv), [1.0] * len(av)
    if not all(v > 0 for v in bv + av):
        return None
    return bv, av


def good_requests(run: RunResult, slo: SLO) -> int:
    got = run_attainment(run, slo)
    return got.good if got is not None else 0


def pooled(runs: Sequence[RunResult], slo: SLO) -> Attainment | None:
    """Several runs' requests together (an arm's at one level): None when none has per-request rows."""
    parts = [a for r in runs if (a := run_attainment(r, slo)) is not None]
    if not parts:
        return None
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total

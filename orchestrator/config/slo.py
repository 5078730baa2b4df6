"""What a verdict is on (`--metric`) and the service-level objectives goodput counts against (`--slo`): the one
registry of metrics (METRICS) and per-request quantities (QUANTITIES) that `--metric`, `--slo`, the nightly's items,
its history and the reports read."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import InputError
from orchestrator.fields import FieldError, seconds

PERCENTILES = (50, 90, 95, 99)


def _seconds(key: str) -> Callable[[Mapping[str, Any]], float | None]:
    def read(row: Mapping[str, Any]) -> float | None:
        value = row.get(key)
        return None if value is None else float(value)

    return read


def request_tpot(row: Mapping[str, Any]) -> float | None:
    """(e2e - TTFT) / (tokens - 1), as the client computes TPOT; None for a request of one token or none."""
    ttft, e2e, tokens = row.get("ttft_s"), row.get("e2e_s"), int(row.get("tokens") or 0)
    if ttft is None or e2e is None or tokens <= 1:
        return None
    return (float(e2e) - float(ttft)) / (tokens - 1)


def _tpot_under_slo(row: Mapping[str, Any]) -> float | None:
    # A request of at most one token has no time per output token; like vLLM's goodput it counts as 0 there (it
    # cannot break a TPOT limit).
    return request_tpot(row) if int(row.get("tokens") or 0) > 1 else 0.0


@dataclass(frozen=True, kw_only=True)
class Quantity:
    """A per-request latency (seconds): its `_pNN` percentiles are metrics, and an SLO's objective may limit it (each
    request's own value checked against the limit). `sample`: one completed request's value from its per-request row
    (None: it has none), as the percentiles take it; `checked`: as an SLO checks it (default: the same)."""

    name: str
    words: str
    sample: Callable[[Mapping[str, Any]], float | None]
    checked: Callable[[Mapping[str, Any]], float | None] | None = None
    # The percentiles the client keeps with each run (its summary's metrics[name]): the others need the per-request
    # rows, which a stored experiment reads only when judging needs them.
    stored: tuple[int, ...] = ()

    def under_slo(self, row: Mapping[str, Any]) -> float | None:
        return (self.checked or self.sample)(row)


# The per-request latencies an objective may limit (register_quantity adds one, with its percentile metrics).
QUANTITIES: dict[str, Quantity] = {
    q.name: q
    for q in (
        Quantity(name="ttft", words="time to first token", sample=_seconds("ttft_s"), stored=(50, 90, 99)),
        Quantity(
            name="tpot",
            words="time per output token after the first",
            sample=request_tpot,
            checked=_tpot_under_slo,
            stored=(50, 90, 99),
        ),
        Quantity(name="e2e", words="end-to-end time", sample=_seconds("e2e_s"), stored=(50, 90, 99)),
    )
}
# Latencies the client keeps only as each run's percentiles (no per-request value, so no SLO objective): a metric
# for each of its percentiles.
STORED_PERCENTILES = {"itl": ("inter-token latency", (50, 90, 99))}
_KEY_RE = re.compile(r"^(?P<quantity>[a-z0-9]+)(?:_p(?P<percentile>\d+))?\Z")
MIN_LIMIT_S, MAX_LIMIT_S = 0.001, 86400.0
# A limit as --slo and a suite's slo take it: the duration syntax of every option (fields.seconds_of), less the bare
# number: `ttft_p99=500` means 500 ms to whoever wrote it (vLLM's --goodput takes milliseconds), 500 s as seconds, so
# an SLO's limit carries its unit.
LIMIT = seconds(MIN_LIMIT_S, MAX_LIMIT_S, bare=False)
EXAMPLE = "ttft_p99=500ms,tpot_p99=50ms,e2e_p99=10s"


@dataclass(frozen=True)
class Objective:
    """One limit of an SLO, e.g. `ttft_p99=500ms`. Per request (goodput, attainment): the request's own TTFT must be
    at most the limit. The percentile, when given, is the aggregate statement the SLO makes: a run meets
    `ttft_p99=500ms` when its p99 TTFT is at most 500 ms, i.e. when about 99 % of its requests meet the limit."""

    quantity: str  # ttft | tpot | e2e
    percentile: int | None  # None: a per-request limit with no aggregate statement (`ttft=500ms`)
    limit_s: float

    @property
    def key(self) -> str:
        return self.quantity + (f"_p{self.percentile}" if self.percentile is not None else "")

    @property
    def text(self) -> str:
        """As `--slo` takes it: milliseconds below 10 s, else seconds (`ttft_p99=500ms`, `e2e_p99=10s`)."""
        return f"{self.key}={seconds_text(self.limit_s)}"

    def describe(self) -> str:
        """In words, for a report: `TTFT p99 ≤ 500 ms`."""
        name = self.quantity.upper()
        at = f" p{self.percentile}" if self.percentile is not None else " (each request)"
        return f"{name}{at} <= {seconds_text(self.limit_s, space=True)}"


def at(where: str) -> str:
    """A message's prefix naming where the value came from (none where the caller says it: click's option errors)."""
    return f"{where}: " if where else ""


def seconds_text(value: float, *, space: bool = False) -> str:
    gap = " " if space else ""
    if value < 10:
        return f"{round(value * 1000, 3):g}{gap}ms"
    return f"{round(value, 3):g}{gap}s"


@dataclass(frozen=True)
class SLO:
    """The objectives of `--slo`, in one order (TTFT, TPOT, E2E). A request is good when it completed and meets every
    limit; goodput is good requests (or their output tokens) per second (results/goodput.goodput_seconds), as vLLM's
    `--goodput` and AIPerf count."""

    objectives: tuple[Objective, ...]

    @property
    def text(self) -> str:
        return ",".join(o.text for o in self.objectives)

    def describe(self) -> str:
        return ", ".join(o.describe() for o in self.objectives)

    def limit(self, quantity: str) -> float | None:
        return next((o.limit_s for o in self.objectives if o.quantity == quantity), None)

    def meets(self, values: Mapping[str, float | None]) -> bool:
        """Whether a request's latencies (seconds, by quantity) meet every limit; a missing value does not."""
        for o in self.objectives:
            v = values.get(o.quantity)
            if v is None or not v <= o.limit_s:
                return False
        return True

    def to_dict(self) -> dict[str, float]:
        """As stored with the experiment (and in its bundle): objective key → limit in seconds."""
        return {o.key: o.limit_s for o in self.objectives}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "slo") -> SLO:
        if not isinstance(d, Mapping) or not d:
            raise InputError(f"{at(where)}expected objectives such as {{ttft_p99: 0.5}} (seconds)")
        out = []
        for key, value in d.items():
            quantity, percentile = objective_key(str(key), where)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InputError(f"{at(where)}{key}: expected a limit in seconds, got {value!r}")
            out.append(Objective(quantity, percentile, checked_limit(float(value), f"{at(where)}{key}")))
        return checked(tuple(out), where)


def objective_key(key: str, where: str) -> tuple[str, int | None]:
    """`ttft_p99` → ("ttft", 99); anything else is an InputError naming it and what is valid."""
    m = _KEY_RE.match(key.strip().lower())
    valid = (
        f"valid: {', '.join(QUANTITIES)}, each with an optional percentile "
        f"{', '.join(f'_p{p}' for p in PERCENTILES)} (e.g. {EXAMPLE})"
    )
    if not m or m["quantity"] not in QUANTITIES:
        raise InputError(f"{at(where)}unknown objective {key.strip()!r}; {valid}")
    percentile = int(m["percentile"]) if m["percentile"] is not None else None
    if percentile is not None and percentile not in PERCENTILES:
        raise InputError(f"{at(where)}{key.strip()!r}: percentile p{percentile} is not offered; {valid}")
    return m["quantity"], percentile


def checked_limit(limit_s: float, where: str) -> float:
    if not math.isfinite(limit_s) or not 0 < limit_s <= MAX_LIMIT_S:
        raise InputError(f"{at(where)}the limit must be more than 0 and at most {MAX_LIMIT_S:g} s")
    return limit_s


def checked(objectives: tuple[Objective, ...], where: str) -> SLO:
    seen: dict[str, str] = {}
    for o in objectives:
        if o.quantity in seen:
            raise InputError(
                f"{at(where)}{o.quantity} is limited twice ({seen[o.quantity]} and {o.key}); a request is counted "
                f"against one {o.quantity.upper()} limit: give one"
            )
        seen[o.quantity] = o.key
    # One order whatever the order typed or stored (a bundle's JSON object may come back sorted): the reports' columns
    # and the SLO's text read the same in an experiment and in its reproduction.
    return SLO(tuple(sorted(objectives, key=lambda o: list(QUANTITIES).index(o.quantity))))


def parse_slo(text: str, where: str = "--slo") -> SLO:
    """`ttft_p99=500ms,tpot_p99=50ms,e2e_p99=10s` (any subset; limits as durations with units from 1ms to 1d: 500ms,
    0.5s, 1m30s; LIMIT): an InputError names the piece that is wrong."""
    pieces = [p.strip() for p in str(text).split(",")]
    if not any(pieces):
        raise InputError(f"{at(where)}empty; expected objectives such as {EXAMPLE}")
    out = []
    for piece in pieces:
        if not piece:
            raise InputError(f"{at(where)}{text!r} has an empty piece between commas; expected e.g. {EXAMPLE}")
        key, sep, value = piece.partition("=")
        if not sep:
            raise InputError(f"{at(where)}{piece!r}: expected OBJECTIVE=LIMIT such as ttft_p99=500ms")
        quantity, percentile = objective_key(key, where)
        try:
            limit = LIMIT(value)
        except FieldError as e:
            raise InputError(f"{at(where)}{piece!r}: {e}") from None
        out.append(Objective(quantity, percentile, limit))
    return checked(tuple(out), where)


# ---------------------------------------------------------------- what a verdict is on


@dataclass(frozen=True, kw_only=True)
class MetricSpec:
    """One metric a comparison may be on: per run, then a launch's value is the median of its runs, as for tok/s.
    The nightly tracks it too, under `nightly_name` where its suites spell it otherwise (agg_tok_s)."""

    name: str
    label: str  # in words, for reports
    unit: str  # tok/s | req/s | ms
    higher_is_better: bool
    needs_slo: bool = False
    scale: float = 1.0  # shown value = stored value x scale (latencies are stored in seconds, shown in ms)
    # A run's value (given a results/run.RunResult and the SLO); None: results/goodput.run_value's rules (goodput,
    # a quantity's percentile, else the RunResult field of the metric's name).
    value: Callable[[Any, SLO | None], float | None] | None = None
    nightly_name: str = ""

    @property
    def suite_name(self) -> str:
        return self.nightly_name or self.name


def _percentile_metrics(name: str, words: str, percentiles: tuple[int, ...]) -> list[MetricSpec]:
    return [
        MetricSpec(name=f"{name}_p{p}", label=f"{words}, p{p}", unit="ms", higher_is_better=False, scale=1000.0)
        for p in percentiles
    ]


def _metrics() -> dict[str, MetricSpec]:
    specs = [
        MetricSpec(name="tok_s", label="tok/s per stream", unit="tok/s", higher_is_better=True),
        MetricSpec(
            name="aggregate_tok_s",
            label="aggregate tok/s (all streams)",
            unit="tok/s",
            higher_is_better=True,
            nightly_name="agg_tok_s",
        ),
        MetricSpec(
            name="goodput",
            label="requests within every SLO limit per second",
            unit="req/s",
            higher_is_better=True,
            needs_slo=True,
        ),
        MetricSpec(
            name="goodput_tok_s",
            label="output tok/s of the requests within every SLO limit",
            unit="tok/s",
            higher_is_better=True,
            needs_slo=True,
        ),
    ]
    for q in QUANTITIES.values():
        specs += _percentile_metrics(q.name, q.words, PERCENTILES)
    for name, (words, percentiles) in STORED_PERCENTILES.items():
        specs += _percentile_metrics(name, words, percentiles)
    return {s.name: s for s in specs}


METRICS = _metrics()
DEFAULT_METRIC = "tok_s"


def register_metric(spec: MetricSpec) -> MetricSpec:
    """Add a metric to the one registry: `--metric`, the reports and the nightly's items take it from then on."""
    METRICS[spec.name] = spec
    return spec


def register_quantity(quantity: Quantity) -> Quantity:
    """Add a per-request latency: `--slo` may limit it, and its percentiles are metrics (register_metric)."""
    QUANTITIES[quantity.name] = quantity
    for spec in _percentile_metrics(quantity.name, quantity.words, PERCENTILES):
        register_metric(spec)
    return quantity


def unregister(name: str) -> None:
    """Take a metric or a quantity (with its percentile metrics) out of the registry again (tests, plugins)."""
    if QUANTITIES.pop(name, None) is not None:
        for p in PERCENTILES:
            METRICS.pop(f"{name}_p{p}", None)
    METRICS.pop(name, None)


def parse_metric(text: str, where: str = "--metric") -> str:
    name = str(text).strip().lower()
    if name not in METRICS:
        raise InputError(f"{at(where)}unknown metric {text!r}; valid: {', '.join(METRICS)}")
    return name


def check_metric(metric: str, slo: SLO | None, where: str = "--metric") -> None:
    """A goodput metric counts requests within the SLO: without one it has nothing to count."""
    if METRICS[metric].needs_slo and slo is None:
        raise InputError(f"{where} {metric} counts requests within the SLO: give --slo too (e.g. --slo {EXAMPLE})")


def stored_judgement(config: Mapping[str, Any], where: str) -> tuple[SLO | None, str]:
    """The SLO and metric a stored experiment (or a bundle's config) was judged on; one stored before them: no SLO,
    and tok/s. A bad value is an InputError naming `where`."""
    raw = config.get("slo")
    slo = SLO.from_dict(raw, f"{at(where)}slo") if raw is not None else None
    metric = parse_metric(config.get("metric") or DEFAULT_METRIC, f"{at(where)}metric")
    check_metric(metric, slo, f"{at(where)}metric")
    return slo, metric

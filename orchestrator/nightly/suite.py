"""A nightly suite file: its items (A/B experiments and single-profile checks), metrics, thresholds and limits."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import engines, yamlfile
from orchestrator.client.request import ENDPOINT_NAMES
from orchestrator.config import arrivals as arrivals_mod
from orchestrator.config import limits
from orchestrator.config import profile as profiles_mod
from orchestrator.config.profile import Profile
from orchestrator.config.prompts import BUNDLED_SETS, generated
from orchestrator.config.sessions import MAX_TURNS
from orchestrator.config.slo import EXAMPLE as SLO_EXAMPLE
from orchestrator.config.slo import METRICS as AB_METRICS
from orchestrator.config.slo import SLO, parse_slo
from orchestrator.config.workload import CLIENT_PLACES, DEFAULT_DURATION_S, BenchConfig, check_requests
from orchestrator.errors import InputError, OrchError
from orchestrator.experiment import failon
from orchestrator.fields import (
    FieldError,
    boolean,
    choice,
    did_you_mean,
    int_range,
    key_name,
    nonempty_str,
    seconds,
    show,
)
from orchestrator.results.run import Level, Rate, level_name, level_phrase
from orchestrator.stats import estimates


class SuiteError(InputError):
    """A suite file is missing, malformed or invalid: the message names the file, the item and the field."""


# The series a night tracks that no comparison is on: what each measures and whether higher is better. Every metric
# of the one registry (config/slo.METRICS) is a nightly metric too, under its suite name (metrics()). A/B items also
# track each arm's ratio to the baseline.
NIGHTLY_ONLY: dict[str, tuple[str, bool]] = {
    "accept_length": ("speculative accept length", True),
    # Across the levels (no @): where an arm's ratio to the baseline crosses 1, and each arm's highest load within
    # the item's slo (stats/crossover). A night that does not cross in the range measured is censored, not a number
    # (history.measure, result.judge).
    "crossover": ("the load where an arm's tok/s ratio to the baseline crosses 1 (req/s or concurrency)", True),
    "max_rate_slo": ("each arm's highest load within every percentile objective of the item's slo", True),
}


def metrics() -> dict[str, tuple[str, bool]]:
    """Every metric a suite may track, (what it measures, whether higher is better): each of the registry's (under
    its suite name: agg_tok_s for aggregate_tok_s) and the nightly's own series. Read when asked, so a metric
    registered later (config/slo.register_metric) is tracked too."""
    shared = {s.suite_name: (s.label, s.higher_is_better) for s in AB_METRICS.values()}
    return {**shared, **NIGHTLY_ONLY}


def as_metric(name: str) -> str | None:
    """The registry's (`--metric`'s) name of a nightly metric: a night takes its values with the same function as a
    comparison (results/goodput.comparable), so both say the same of one run; None for the nightly's own series."""
    return next((s.name for s in AB_METRICS.values() if s.suite_name == name), None)


# The metrics taken over every level of the workload rather than at one (no `@`).
ACROSS_LEVELS = ("crossover", "max_rate_slo")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
DEFAULT_THRESHOLD = 0.03
DEFAULT_DEADLINE_S = 6 * 3600.0
DEFAULT_WAIT_S = 1800.0
DEFAULT_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Metric:
    """One tracked metric of an item: name, at which level, and the change worth waking someone for."""

    name: str
    concurrency: float | None  # the level: a concurrency, or a rate of an open-loop workload; None: the first
    threshold: float

    @property
    def higher_is_better(self) -> bool:
        return metrics()[self.name][1]

    @property
    def key(self) -> str:
        """As written in the suite file: `tok_s`, `agg_tok_s@32` or (open loop) `goodput@0.5`."""
        return self.name + (f"@{self.concurrency:g}" if self.concurrency is not None else "")


@dataclass(frozen=True, kw_only=True)
class Item:
    """One thing measured every night: an A/B (two or more profiles, the first the baseline) or one profile."""

    name: str
    profiles: tuple[Profile, ...]
    host: str
    sim: bool
    bench: BenchConfig
    blocks: int
    order: str
    metrics: tuple[Metric, ...]
    threshold: float  # also the A/B's smallest difference worth calling (its min_effect)
    timeout_s: float
    fail_on: tuple[str, ...] = ()
    strict_env: bool = False
    allow_node_mismatch: bool = False  # a multi-node item: launch even if its nodes differ (recorded, reported)
    ready_timeout_s: float | None = None
    grace_s: float = 10.0
    gpu_wait_s: float = 120.0
    port: int | None = None  # every launched arm serves here, not on its profile's port (a shared box)
    slo: SLO | None = None  # what the goodput metric counts against (stored with each night's experiment)
    cache_measured: bool = False  # as orch ab --cache-measured: a prefix-cache gap between arms keeps the verdict

    @property
    def kind(self) -> str:
        return "ab" if len(self.profiles) > 1 else "bench"

    @property
    def levels(self) -> tuple[Level, ...]:
        """The workload's levels as its results key them: concurrencies, or (open loop) Rates."""
        return tuple(Rate(r) for r in self.bench.rate) if self.bench.open_loop else self.bench.concurrency


@dataclass(frozen=True, kw_only=True)
class Suite:
    name: str
    path: Path
    sha256: str  # of the file as read: which version of the suite a night ran
    items: tuple[Item, ...]
    deadline_s: float = DEFAULT_DEADLINE_S
    wait_s: float = DEFAULT_WAIT_S
    confirm: bool = True  # re-measure an item that looks like a regression before reporting it
    min_history: int = 5
    inventory: str | None = None
    fan_out: bool = False  # items on Slurm hosts each run in their own allocation, in parallel
    fields: dict[str, Any] = field(default_factory=dict, compare=False)  # the file's top-level mapping, as read


# ---------------------------------------------------------------- value parsers


# A night's deadline, an item's timeout: a duration (fields.seconds_of: 90, "90s", "45m", "2h", "1h30m").
duration = seconds(1.0, 7 * 86400.0)


def percentage(v: Any) -> float:
    """ "3%" or 0.03 -> 0.03 (more than 0 and less than 50 %)."""
    expected = "a percentage such as 3% or a fraction such as 0.03, more than 0% and less than 50%"
    if isinstance(v, bool):
        raise FieldError(f"expected {expected}, got {show(v)}")
    try:
        if isinstance(v, str):
            text = v.strip()
            value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        elif isinstance(v, int | float):
            value = float(v)
        else:
            raise ValueError
    except ValueError:
        raise FieldError(f"expected {expected}, got {show(v)}") from None
    if not 0 < value < 0.5:
        raise FieldError(f"expected {expected}, got {show(v)}")
    return value


def _levels(v: Any) -> tuple[int, ...]:
    items = v if isinstance(v, list) else [v]
    check = int_range(1, 4096)
    levels = tuple(check(x) for x in items)
    if not levels or len(set(levels)) != len(levels):
        raise FieldError(f"expected distinct concurrency levels from 1 to 4096, got {show(v)}")
    return levels


def _rates(v: Any) -> tuple[float, ...]:
    """`rate: [1, 2, 4]` (or one number): open-loop levels in requests per second, as --rate takes them."""
    items = v if isinstance(v, list) else [v]
    expected = (
        f"expected up to {arrivals_mod.MAX_LEVELS} distinct request rates per second, each above 0 and at most "
        f"{arrivals_mod.MAX_RATE:g} (e.g. [1, 2, 4, 8])"
    )
    rates = []
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int | float) or not 0 < x <= arrivals_mod.MAX_RATE:
            raise FieldError(f"{expected}, got {show(v)}")  # NaN fails the range too
        rates.append(float(x))
    if not rates or len(rates) > arrivals_mod.MAX_LEVELS or len(set(rates)) != len(rates):
        raise FieldError(f"{expected}, got {show(v)}")
    return tuple(rates)


def _arrivals(v: Any) -> str:
    if not isinstance(v, str):
        raise FieldError(f"expected poisson, constant or gamma:CV (as --arrivals takes it), got {show(v)}")
    try:
        arrivals_mod.parse(v)
    except ValueError as e:
        raise FieldError(str(e)) from None
    return v.strip().lower()


def _fail_on(v: Any) -> tuple[str, ...]:
    """As `orch ab --fail-on` takes them (experiment/failon.parse_modes), from a list or a comma list."""
    items = v if isinstance(v, list) else [p.strip() for p in str(v).split(",")] if isinstance(v, str) else None
    if not items:
        raise FieldError(f"expected one or more of {', '.join(failon.GRAMMAR)}, got {show(v)}")
    if not all(isinstance(x, str) for x in items):
        raise FieldError(f"expected one or more of {', '.join(failon.GRAMMAR)}, got {show(v)}")
    try:
        return failon.parse_modes(items)
    except InputError as e:
        said = str(e).replace("--fail-on mode", "mode").replace("--fail-on ", "")
        said = said.replace("--rate levels", "workload.rate levels").replace("--concurrency", "workload.concurrency")
        raise FieldError(said) from None


def _slo(v: Any) -> SLO:
    """`slo: ttft_p99=500ms,tpot_p99=50ms` as --slo takes it."""
    if not isinstance(v, str):
        raise FieldError(f"expected objectives such as {SLO_EXAMPLE} (as --slo takes them), got {show(v)}")
    try:
        return parse_slo(v, where="")
    except InputError as e:
        raise FieldError(str(e)) from None


def _metric(spec: Any, threshold: float) -> Metric:
    if not isinstance(spec, str):
        raise FieldError(f"expected a metric name such as tok_s or agg_tok_s@32, got {show(spec)}")
    name, sep, at = spec.partition("@")
    known = metrics()
    if name not in known:
        raise FieldError(f"unknown metric {show(name)}{did_you_mean(name, known)}; valid: {', '.join(known)}")
    if sep and name in ACROSS_LEVELS:
        raise FieldError(f"{show(spec)}: {name} is taken across every level of the workload; write {name} alone")
    level: float | None = None
    if at:
        try:
            level = float(at)
        except ValueError:
            level = None
        if level is None or not 0 < level <= arrivals_mod.MAX_RATE:
            raise FieldError(
                f"{show(spec)}: after '@' comes one of the workload's levels: a concurrency (agg_tok_s@32) or, with "
                "rate levels, a rate in requests per second (goodput@0.5)"
            )
        if level == int(level):
            level = int(level)
    return Metric(name, level, threshold)


# ---------------------------------------------------------------- the file

WORKLOAD_FIELDS: dict[str, Callable[[Any], Any]] = {
    "runs": int_range(*limits.INT_RANGES["runs"]),
    "warmup": int_range(*limits.INT_RANGES["warmup"]),
    "max_tokens": int_range(*limits.INT_RANGES["max_tokens"]),
    "seed": int_range(-(2**63), 2**63 - 1),
    "concurrency": _levels,
    "requests_per_stream": int_range(*limits.INT_RANGES["requests_per_stream"]),
    "endpoint": choice(ENDPOINT_NAMES),
    "prompts": nonempty_str,
    "input_len": int_range(*limits.INT_RANGES["input_len"]),
    "client": choice(tuple(CLIENT_PLACES)),
    "min_run_s": seconds(0.0, 86400.0),
    "stall_timeout": seconds(0.5, 86400.0),
    "first_token_timeout": seconds(0.5, 86400.0),
    # Open loop, as orch ab's --rate, --arrivals, --duration, --requests, --max-concurrency (docs/load.md).
    "rate": _rates,
    "arrivals": _arrivals,
    "duration": seconds(*limits.DURATION_S),
    "requests": int_range(*limits.OPEN_LOOP_INTS["requests_per_level"]),
    "max_concurrency": int_range(*limits.OPEN_LOOP_INTS["max_concurrency"]),
    # As orch ab --flush-cache: the prefix cache emptied before every timed run (part of the workload).
    "flush_cache": boolean,
    # As orch ab --turns: a dataset's conversations as multi-turn sessions of this many turns (closed loop only).
    "turns": int_range(2, MAX_TURNS),
}
ITEM_FIELDS: dict[str, Callable[[Any], Any]] = {
    "name": nonempty_str,
    "ab": lambda v: v,  # checked with the profiles, below
    "bench": lambda v: v,
    "host": nonempty_str,
    "sim": boolean,
    "blocks": int_range(1, 100),
    "order": choice(estimates.ORDERS),
    "metrics": lambda v: v,
    "threshold": percentage,
    "timeout": duration,
    "fail_on": _fail_on,
    "strict_env": boolean,
    "allow_node_mismatch": boolean,
    "ready_timeout": seconds(1.0, 86400.0),
    "grace": seconds(0.0, 600.0),
    "gpu_wait": seconds(0.0, 3600.0),
    "port": int_range(1, 65535),
    "workload": lambda v: v,
    "slo": lambda v: _slo(v),
    "cache_measured": boolean,
}
TOP_FIELDS: dict[str, Callable[[Any], Any]] = {
    "suite": nonempty_str,
    "deadline": duration,
    "wait": lambda v: 0.0 if v == 0 else duration(v),
    "confirm": boolean,
    "min_history": int_range(3, 100),
    "fan_out": boolean,
    "inventory": nonempty_str,
    "defaults": lambda v: v,
    "items": lambda v: v,
}


def _checked(data: Mapping[Any, Any], schema: Mapping[str, Callable[[Any], Any]], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        checker = schema.get(str(key))
        if checker is None:
            valid = ", ".join(schema)
            raise SuiteError(f"{where}: {key_name(key)}: unknown field{did_you_mean(str(key), schema)}; valid: {valid}")
        if value is None:
            continue
        try:
            out[str(key)] = checker(value)
        except FieldError as e:
            raise SuiteError(f"{where}: {key_name(key)}: {e}") from None
    return out


def _mapping(v: Any, where: str) -> Mapping[Any, Any]:
    if not isinstance(v, Mapping):
        raise SuiteError(f"{where}: expected a mapping of fields, got {show(v)}")
    return v


def _load_profile(ref: Any, base: Path, where: str) -> Profile:
    if not isinstance(ref, str) or not ref.strip():
        raise SuiteError(f"{where}: expected a profile name or file, got {show(ref)}")
    path = Path(ref)
    if (path.suffix in (".yaml", ".yml") or "/" in ref) and not path.is_absolute():
        ref = str(base / path)  # relative to the suite file, wherever cron starts orch
    try:
        return profiles_mod.load(ref, cwd=base)
    except OrchError as e:
        raise SuiteError(f"{where}: {e}") from None


def _item(raw: Any, defaults: Mapping[Any, Any], index: int, base: Path, where: str) -> Item:
    data = _mapping(raw, f"{where}: items[{index}]")
    name = data.get("name")
    label = f"{where}: item {name!r}" if isinstance(name, str) and name else f"{where}: items[{index}]"
    if "name" not in data:
        raise SuiteError(f"{label}: name: required (letters, digits, '.', '_', '-'; unique in the suite)")
    merged = {**defaults, **data}
    if isinstance(defaults.get("workload"), Mapping) and isinstance(data.get("workload"), Mapping):
        # A workload in the defaults and one in the item merge field by field: the item overrides what it names.
        merged["workload"] = {**defaults["workload"], **data["workload"]}
    fields = _checked(merged, ITEM_FIELDS, label)
    if not NAME_RE.match(fields["name"]):
        raise SuiteError(f"{label}: name: expected letters, digits, '.', '_', '-' (at most 64), got {show(name)}")
    if ("ab" in fields) == ("bench" in fields):
        raise SuiteError(f"{label}: give exactly one of ab: [BASELINE, OTHER, ...] (an A/B) or bench: PROFILE")
    if "ab" in fields:
        refs = fields["ab"]
        if not isinstance(refs, list) or len(refs) < 2:
            raise SuiteError(f"{label}: ab: expected a list of two or more profiles (the first is the baseline)")
        profiles = tuple(_load_profile(r, base, f"{label}: ab[{i}]") for i, r in enumerate(refs))
    else:
        profiles = (_load_profile(fields["bench"], base, f"{label}: bench"),)
    try:
        profiles_mod.check_distinct_names(list(profiles))
    except OrchError as e:
        raise SuiteError(f"{label}: {e}") from None
    workload = _checked(
        _mapping(fields.get("workload", {}), f"{label}: workload"), WORKLOAD_FIELDS, f"{label}: workload"
    )
    _check_loop(workload, f"{label}: workload")
    prompts = workload.get("prompts", "builtin")
    if not generated(prompts) and prompts not in BUNDLED_SETS and not Path(prompts).is_absolute():
        prompts = str(base / prompts)
    bench = BenchConfig(
        runs=workload.get("runs", 5),
        warmup=workload.get("warmup", 2),
        max_tokens=workload.get("max_tokens", 2048),
        seed=workload.get("seed", 0),
        concurrency=workload.get("concurrency", (1,)),
        requests_per_stream=workload.get("requests_per_stream", 1),
        endpoint=workload.get("endpoint") or _common_endpoint(profiles, label),
        prompts=prompts,
        input_len=workload.get("input_len"),
        client=workload.get("client", "host"),
        min_run_s=workload.get("min_run_s", 1.0),
        stall_timeout_s=workload.get("stall_timeout", 60.0),
        first_token_timeout_s=workload.get("first_token_timeout", 180.0),
        rate=workload.get("rate", ()),
        arrivals=workload.get("arrivals", "poisson"),
        duration_s=(
            workload.get("duration", DEFAULT_DURATION_S) if "rate" in workload and "requests" not in workload else None
        ),
        requests_per_level=workload.get("requests"),
        max_concurrency=workload.get("max_concurrency"),
        flush_cache=workload.get("flush_cache", False),
        turns=workload.get("turns"),
    )
    blocks = fields.get("blocks", 3 if len(profiles) > 1 else 1)
    try:
        # What an arm's engine cannot do (an endpoint, --sim) is refused tonight, not at 3 a.m.
        engines.check_use(profiles, bench.endpoint, simulate=fields.get("sim", False), flush_cache=bench.flush_cache)
    except InputError as e:
        raise SuiteError(f"{label}: {e}") from None
    _check_plan(bench, profiles, blocks, fields.get("sim", False), label)
    threshold = fields.get("threshold", DEFAULT_THRESHOLD)
    levels = tuple(Rate(r) for r in bench.rate) if bench.open_loop else bench.concurrency
    metrics = _metrics(fields.get("metrics", ["tok_s"]), threshold, levels, label)
    if "accept_length" in {m.name for m in metrics} and not any(p.speculative for p in profiles):
        raise SuiteError(f"{label}: metrics: accept_length needs a profile with speculative decoding")
    needs_slo = [m.name for m in metrics if (shared := as_metric(m.name)) is not None and AB_METRICS[shared].needs_slo]
    if needs_slo and "slo" not in fields:
        raise SuiteError(
            f"{label}: metrics: {needs_slo[0]} counts requests within an SLO: add slo: (e.g. slo: {SLO_EXAMPLE})"
        )
    fail_on = fields.get("fail_on", ())
    _check_across_levels(metrics, fail_on, profiles, (levels, blocks), fields.get("slo"), label)
    compared = [m for m in fail_on if m in ("slower", "different")]
    if compared and len(profiles) < 2 and any(p.expect is None for p in profiles):
        raise SuiteError(
            f"{label}: fail_on: {', '.join(compared)} needs something to compare with: an A/B (ab:) or an expect: "
            f"block in profile {profiles[0].name}"
        )
    return Item(
        name=fields["name"],
        profiles=profiles,
        host=fields.get("host", "local"),
        sim=fields.get("sim", False),
        bench=bench,
        blocks=blocks,
        order=fields.get("order", "random"),
        metrics=metrics,
        threshold=threshold,
        timeout_s=fields.get("timeout", DEFAULT_TIMEOUT_S),
        fail_on=fail_on,
        strict_env=fields.get("strict_env", False),
        allow_node_mismatch=fields.get("allow_node_mismatch", False),
        ready_timeout_s=fields.get("ready_timeout"),
        grace_s=fields.get("grace", 10.0),
        gpu_wait_s=fields.get("gpu_wait", 120.0),
        port=fields.get("port"),
        slo=fields.get("slo"),
        cache_measured=fields.get("cache_measured", False),
    )


OPEN_LOOP_ONLY = ("arrivals", "duration", "requests", "max_concurrency")


def _check_loop(workload: Mapping[str, Any], where: str) -> None:
    """Rate levels (open loop) exclude concurrency levels (closed loop), as --rate excludes --concurrency; turns
    (multi-turn sessions) need closed loop, as --turns does."""
    if "turns" in workload and ("rate" in workload or "input_len" in workload):
        other = "rate" if "rate" in workload else "input_len"
        raise SuiteError(
            f"{where}: turns: not with {other}: multi-turn sessions run on closed-loop streams, each turn waiting for "
            "the reply it feeds back, from a dataset's conversations; leave one out"
        )
    if "rate" in workload:
        closed = [k for k in ("concurrency", "requests_per_stream") if k in workload]
        if closed:
            raise SuiteError(
                f"{where}: {closed[0]}: not with rate: (open loop: requests sent at scheduled times); give rate: "
                "[R, ...] or concurrency: [N, ...], not both"
            )
        if "duration" in workload and "requests" in workload:
            raise SuiteError(
                f"{where}: duration, requests: a run at each rate lasts a time or a number of requests; give one"
            )
        return
    given = [k for k in OPEN_LOOP_ONLY if k in workload]
    if given:
        raise SuiteError(
            f"{where}: {given[0]}: applies to rate levels (open loop) only; add rate: [R, ...] (requests per second) "
            "or leave it out"
        )


def _check_across_levels(
    metrics: tuple[Metric, ...],
    fail_on: tuple[str, ...],
    profiles: tuple[Profile, ...],
    design: tuple[tuple[Level, ...], int],
    slo: SLO | None,
    label: str,
) -> None:
    """crossover and max_rate_slo (metrics, or fail_on's crossover-below / max-rate-slo-below) need what they are
    taken from: two or more levels and two or more blocks (`design`; their CI is over blocks), an A/B for a
    crossover, an slo with a percentile objective for the other."""
    levels, blocks = design
    asked = [(f"metrics: {m.name}", m.name) for m in metrics if m.name in ACROSS_LEVELS] + [
        (f"fail_on: {mode}", failon.across_levels_metric(mode)) for mode in fail_on if failon.across_levels_metric(mode)
    ]
    for where, name in asked:
        if len(levels) < 2:
            shown = ", ".join(level_phrase(v) for v in levels)
            raise SuiteError(
                f"{label}: {where}: needs two or more levels to interpolate between, and the workload runs {shown} "
                "only; give workload.rate: [R1, R2, ...] (open loop) or workload.concurrency: [N1, N2, ...]"
            )
        if name == "crossover" and len(profiles) < 2:
            raise SuiteError(
                f"{label}: {where}: a crossover is where an arm's ratio to the baseline crosses 1; it needs an A/B "
                "(ab: [BASELINE, OTHER])"
            )
        if blocks < 2:
            raise SuiteError(
                f"{label}: {where}: its 95% CI is taken over blocks and needs two or more; the item has blocks: "
                f"{blocks}{' (the default for one profile)' if len(profiles) < 2 else ''}: give blocks: 2 or more"
            )
        if name == "max_rate_slo" and (slo is None or not any(o.percentile is not None for o in slo.objectives)):
            got = f"slo: {slo.text}" if slo is not None else "no slo:"
            raise SuiteError(
                f"{label}: {where}: the highest load within an SLO needs an slo: with a percentile objective (e.g. "
                f"slo: {SLO_EXAMPLE}); the item has {got}"
            )


def _common_endpoint(profiles: tuple[Profile, ...], label: str) -> str:
    try:
        return engines.common_endpoint([p.engine for p in profiles])
    except InputError as e:
        raise SuiteError(f"{label}: workload.endpoint: {e}") from None


def _check_plan(bench: BenchConfig, profiles: tuple[Profile, ...], blocks: int, sim: bool, label: str) -> None:
    """What `orch ab` refuses before launching (an absurd plan, a bad prompt file), refused before the night."""
    try:
        work = limits.checked_plan(bench, profiles, blocks=blocks, sim=sim, names=limits.SUITE_NAMES)
    except limits.PlanError as e:
        raise SuiteError(f"{label}: workload: {e}") from None
    refusal = work.too_short(limits.SUITE_NAMES)
    if refusal:
        raise SuiteError(f"{label}: workload: {refusal}")
    try:
        check_requests(bench)
    except OrchError as e:
        raise SuiteError(f"{label}: workload: {e}") from None


def _metrics(raw: Any, threshold: float, levels: tuple[Level, ...], label: str) -> tuple[Metric, ...]:
    """A list of names (each with the item's threshold) or a mapping name -> its own threshold."""
    where = f"{label}: metrics"
    if isinstance(raw, str):
        raw = [raw]
    if isinstance(raw, list):
        pairs = [(spec, threshold) for spec in raw]
    elif isinstance(raw, Mapping):
        pairs = []
        for spec, value in raw.items():
            try:
                pairs.append((spec, threshold if value is None else percentage(value)))
            except FieldError as e:
                raise SuiteError(f"{where}: {key_name(spec)}: {e}") from None
    else:
        raise SuiteError(f"{where}: expected a list such as [tok_s, ttft_p99] or a mapping such as {{tok_s: 3%}}")
    if not pairs:
        raise SuiteError(f"{where}: empty; name at least one of {', '.join(metrics())}")
    out: list[Metric] = []
    for spec, th in pairs:
        try:
            metric = _metric(spec, th)
        except FieldError as e:
            raise SuiteError(f"{where}: {e}") from None
        if metric.concurrency is not None and metric.concurrency not in levels:
            field_name = "workload.rate" if levels and isinstance(levels[0], Rate) else "workload.concurrency"
            shown = ", ".join(level_name(v) for v in levels)
            kind = "" if field_name == "workload.rate" else "concurrency "
            raise SuiteError(
                f"{where}: {metric.key}: the workload runs {kind}{shown} only; "
                f"add {metric.concurrency:g} to {field_name} or measure at one of those"
            )
        if metric.key in {m.key for m in out}:
            raise SuiteError(f"{where}: {metric.key} listed twice")
        out.append(metric)
    return tuple(out)


def load(path: str | Path) -> Suite:
    """Read and validate a suite file, profiles included; every problem is a SuiteError naming file, item, field."""
    p = Path(path)
    if p.is_dir():
        raise SuiteError(f"{p}: is a directory; give the suite's YAML file")
    if not yamlfile.is_file(p):
        raise SuiteError(f"{p}: no such suite file")
    raw_bytes = p.read_bytes()
    data = yamlfile.load(p, SuiteError, "nightly suite file")
    where = str(p)
    if data is None:
        raise SuiteError(f"{where}: empty; a suite needs at least `items:` (see docs/nightly.md)")
    top = _checked(_mapping(data, where), TOP_FIELDS, where)
    defaults = _mapping(top.get("defaults", {}), f"{where}: defaults")
    if "name" in defaults:
        raise SuiteError(f"{where}: defaults: name: every item needs its own name")
    _checked(defaults, ITEM_FIELDS, f"{where}: defaults")
    if "workload" in defaults:
        _checked(
            _mapping(defaults["workload"], f"{where}: defaults: workload"),
            WORKLOAD_FIELDS,
            f"{where}: defaults: workload",
        )
    raw_items = top.get("items")
    if not isinstance(raw_items, list) or not raw_items:
        raise SuiteError(f"{where}: items: expected a list of one or more items (each with name and ab: or bench:)")
    base = p.resolve().parent
    items = tuple(_item(raw, defaults, i, base, where) for i, raw in enumerate(raw_items))
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            raise SuiteError(f"{where}: item {item.name!r}: name: used twice; item names must be unique")
        seen.add(item.name)
    name = top.get("suite", p.stem)
    if not NAME_RE.match(name):
        raise SuiteError(f"{where}: suite: expected letters, digits, '.', '_', '-' (at most 64), got {show(name)}")
    inventory = top.get("inventory")
    if inventory is not None and not Path(inventory).is_absolute():
        inventory = str(base / inventory)
    if inventory is None:
        # Like `orch ab`'s lookup, but next to the suite instead of the working directory cron happens to use.
        env = os.environ.get("ORCH_HOSTS")
        candidates = [base / "hosts.yaml", Path(env) if env else profiles_mod.user_profile_dir().parent / "hosts.yaml"]
        inventory = next((str(c) for c in candidates if yamlfile.is_file(c)), None)
    return Suite(
        name=name,
        path=p.resolve(),
        sha256=hashlib.sha256(raw_bytes).hexdigest(),
        items=items,
        deadline_s=top.get("deadline", DEFAULT_DEADLINE_S),
        wait_s=top.get("wait", DEFAULT_WAIT_S),
        confirm=top.get("confirm", True),
        min_history=top.get("min_history", 5),
        inventory=inventory,
        fan_out=top.get("fan_out", False),
        fields=dict(data),
    )

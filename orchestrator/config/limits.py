"""The limits every experiment's plan meets before anything is built: from options, a suite, a bundle or --resume."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.client.request import ENDPOINT_NAMES
from orchestrator.config import arrivals
from orchestrator.config.plan import OPTIONS, Plan, assumed_speed, claimed_speed, plan, sim_speed
from orchestrator.config.plan import SUITE_NAMES as SUITE_NAMES  # the names a suite's refusals use, for its callers
from orchestrator.config.profile import Profile
from orchestrator.config.traces import TraceRequest
from orchestrator.config.workload import CLIENT_PLACES, BenchConfig
from orchestrator.errors import InputError

# What each workload field may be. The CLI's option ranges and a suite's workload fields are these same numbers; a
# bundle or a stored experiment (a --resume) meets them too, as nothing else has checked those.
INT_RANGES: dict[str, tuple[int, int]] = {
    "runs": (1, 10_000),
    "warmup": (0, 1000),
    "max_tokens": (1, 1_000_000),
    "warmup_max_tokens": (1, 1_000_000),
    "requests_per_stream": (1, 10_000),
    "input_len": (1, 1_000_000),
}
LEVELS = (1, 4096)  # concurrency levels
DURATION_S = (0.001, arrivals.MAX_DURATION_S)  # an open-loop run's --duration (and a trace replay's span)
OPEN_LOOP_INTS: dict[str, tuple[int, int]] = {
    "requests_per_level": (1, arrivals.MAX_REQUESTS),
    "max_concurrency": (1, 100_000),
}
BLOCKS = (1, 1000)  # blocks of one experiment (each launches every arm once)
SECONDS_RANGES: dict[str, tuple[float, float]] = {
    "min_run_s": (0.0, 86400.0),
    "stall_timeout_s": (0.5, 86400.0),
    "first_token_timeout_s": (0.5, 86400.0),
    "request_timeout_s": (0.5, 7 * 86400.0),
}


class PlanError(InputError):
    """A workload or plan orch will not run: a field out of its range, or more work per launch than the limits."""


def check_workload(bench: BenchConfig, where: str = "", names: Mapping[str, str] | None = None) -> None:
    """Every field of the workload within what orch runs; PlanError names the first that is not (prefixed with
    `where`, e.g. "content.config.bench."), as `names` calls it (OPTIONS, SUITE_NAMES; by default the field's own
    name)."""

    def field(name: str) -> str:
        return where + (names or {}).get(name, name)

    for name, (lo, hi) in INT_RANGES.items():
        value = getattr(bench, name)
        if value is None and name == "input_len":
            continue
        if not _int_within(value, lo, hi):
            raise PlanError(f"{field(name)}: expected a whole number from {lo:,} to {hi:,}, got {_shown(value)}")
    levels = bench.concurrency
    lo, hi = LEVELS
    if (
        not levels
        or not all(_int_within(c, lo, hi) for c in levels)
        or len(set(levels)) != len(levels)
        or len(levels) > hi
    ):
        raise PlanError(
            f"{field('concurrency')}: expected distinct whole numbers from {lo} to {hi}, got {_shown(levels)}"
        )
    for name, (flo, fhi) in SECONDS_RANGES.items():
        value = getattr(bench, name)
        if not (_is_number(value) and math.isfinite(value) and flo <= value <= fhi):
            raise PlanError(f"{field(name)}: expected seconds from {flo:g} to {fhi:g}, got {_shown(value)}")
    if not (isinstance(bench.seed, int) and not isinstance(bench.seed, bool)):
        raise PlanError(f"{field('seed')}: expected a whole number, got {_shown(bench.seed)}")
    for name, valid in (("endpoint", ENDPOINT_NAMES), ("client", CLIENT_PLACES)):
        if getattr(bench, name) not in valid:
            raise PlanError(f"{field(name)}: expected one of {', '.join(valid)}, got {_shown(getattr(bench, name))}")
    if not isinstance(bench.prompts, str) or not bench.prompts:
        raise PlanError(f"{field('prompts')}: expected a prompt set's name or a file, got {_shown(bench.prompts)}")
    check_open_loop(bench, where, names)


def check_open_loop(bench: BenchConfig, where: str = "", names: Mapping[str, str] | None = None) -> None:
    """The open-loop fields (docs/load.md): rates, arrivals, one of duration and requests, the cap; all left at their
    defaults in a closed-loop workload."""

    def field(name: str) -> str:
        return where + (names or {}).get(name, name)

    rates = bench.rate
    if not rates:
        given = [
            name
            for name, default in (
                ("duration_s", None),
                ("requests_per_level", None),
                ("max_concurrency", None),
                ("arrivals", "poisson"),
            )
            if getattr(bench, name) != default
        ]
        if given:
            raise PlanError(
                f"{field(given[0])}: applies to an open-loop workload (rate levels) only; {field('rate')} is empty"
            )
        return
    if not (
        len(rates) <= arrivals.MAX_LEVELS
        and all(_is_number(r) and math.isfinite(r) and 0 < r <= arrivals.MAX_RATE for r in rates)
        and len(set(rates)) == len(rates)
    ):
        raise PlanError(
            f"{field('rate')}: expected up to {arrivals.MAX_LEVELS} distinct request rates above 0 and at most "
            f"{arrivals.MAX_RATE:g} per second, got {_shown(rates)}"
        )
    if not isinstance(bench.arrivals, str):
        raise PlanError(f"{field('arrivals')}: expected poisson, constant or gamma:CV, got {_shown(bench.arrivals)}")
    try:
        arrivals.parse(bench.arrivals)
    except ValueError as e:
        raise PlanError(f"{field('arrivals')}: {e}") from None
    if (bench.duration_s is None) == (bench.requests_per_level is None):
        raise PlanError(
            f"{field('duration_s')}, {field('requests_per_level')}: an open-loop workload gives exactly one of them "
            f"(got {_shown(bench.duration_s)} and {_shown(bench.requests_per_level)})"
        )
    lo, hi = DURATION_S
    if bench.duration_s is not None and not (
        _is_number(bench.duration_s) and math.isfinite(bench.duration_s) and lo <= bench.duration_s <= hi
    ):
        raise PlanError(
            f"{field('duration_s')}: expected seconds from {lo:g} to {hi:g}, got {_shown(bench.duration_s)}"
        )
    for name, (ilo, ihi) in OPEN_LOOP_INTS.items():
        value = getattr(bench, name)
        if value is not None and not _int_within(value, ilo, ihi):
            raise PlanError(f"{field(name)}: expected a whole number from {ilo:,} to {ihi:,}, got {_shown(value)}")


def check_blocks(blocks: Any, name: str = "blocks") -> None:
    if not _int_within(blocks, *BLOCKS):
        raise PlanError(f"{name}: expected a whole number from {BLOCKS[0]} to {BLOCKS[1]}, got {_shown(blocks)}")


def checked_plan(
    bench: BenchConfig,
    profiles: Sequence[Profile],
    *,
    blocks: int,
    sim: bool,
    least_blocks: int | None = None,
    show: Callable[[str], None] = lambda _: None,
    names: Mapping[str, str] = OPTIONS,
    trace: Sequence[TraceRequest] | None = None,
) -> Plan:
    """The plan of an experiment (its most blocks), refused with PlanError if a field is out of range or a launch
    would do more than the limits allow; `show` sees the plan line first (with `least_blocks`, --blocks auto's
    range). A refused field is named as `names` says (orch ab's options by default). Arithmetic on the options (and a
    trace's lines, which give its requests' lengths: `trace`, else read from the workload's file): nothing is
    generated or launched, so an absurd plan costs nothing to refuse."""
    check_workload(bench, names=names)
    check_blocks(blocks, names.get("blocks", "blocks"))
    speeds = [sim_speed(p.env_dict() | p.sim_env(), p.server_flags()) for p in profiles] if sim else []
    calibrated = bool(speeds) and all(s is not None for s in speeds)
    # A real engine's speed is unknown before it runs, unless every profile claims one (expect.tok_s).
    claims = [p.expect.tok_s if p.expect else None for p in profiles]
    claimed = not calibrated and all(c is not None for c in claims)
    if calibrated:
        arms = [s for s in speeds if s is not None]
    elif claimed:
        arms = [claimed_speed(c) for c in claims if c is not None]
    else:
        arms = [assumed_speed()] * len(profiles)
    work = plan(bench, arms, blocks=blocks, calibrated=calibrated, claimed=claimed, trace=trace)
    least = (
        plan(bench, arms, blocks=least_blocks, calibrated=calibrated, claimed=claimed, trace=trace)
        if least_blocks is not None
        else None
    )
    show(work.line(least))
    refusal = work.refusal(names)
    if refusal:
        raise PlanError(refusal)
    return work


def _int_within(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= 40 else text[:37] + "..."

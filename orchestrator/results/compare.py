"""Two experiments side by side (and a claim against a measurement): per arm and per ratio, did it reproduce?

Pure: reads results.ABResult objects, never the store or a host. The fingerprint differences ("causes") are ranked
by the caller and only carried here so that the renderers can put them under the verdict."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.common.printable import visible
from orchestrator.errors import InputError
from orchestrator.results import datasource
from orchestrator.results.datasource import DataSource
from orchestrator.results.model import ABResult, ArmResult
from orchestrator.results.run import Level, Rate, level_phrase
from orchestrator.stats.estimates import RatioEstimate
from orchestrator.stats.reproduction import (
    DEFAULT_TOLERANCE,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    ArmEstimate,
    ReproVerdict,
    arm_estimate,
    reproduction_verdict,
)

# Documented exit codes of `orch compare` / `orch reproduce` (1 error, 2 usage, 130 interrupted are the CLI's).
EXIT_CODES = {REPRODUCED: 0, NOT_REPRODUCED: 3, INCONCLUSIVE: 4}


@dataclass(frozen=True, kw_only=True)
class ArmSide:
    """One arm in one experiment, at one concurrency level."""

    label: str
    tok_s: ArmEstimate | None  # None: no valid timed run
    ttft_s: float | None  # median over valid timed runs
    itl_p50_s: float | None
    accept_length: float | None


@dataclass(frozen=True, kw_only=True)
class ArmRow:
    label: str  # A's name of the arm (B's where only B has it)
    a: ArmSide | None  # None: the arm exists in b only
    b: ArmSide | None
    verdict: ReproVerdict | None  # b against a; None unless both sides have a tok/s
    b_label: str | None = None  # B's own name of it, where --map paired arms of different names

    @property
    def shown(self) -> str:
        return self.label if self.b_label is None else f"{self.label} (B: {self.b_label})"


@dataclass(frozen=True, kw_only=True)
class RatioRow:
    arm: str  # A's names (as ArmRow.label)
    vs: str
    a: RatioEstimate | None
    b: RatioEstimate | None
    verdict: ReproVerdict | None
    b_name: str | None = None  # "arm / vs" in B's names, where --map renamed either

    @property
    def shown(self) -> str:
        name = f"{self.arm} / {self.vs}"
        return name if self.b_name is None else f"{name} (B: {self.b_name})"


@dataclass(frozen=True, kw_only=True)
class Side:
    experiment_id: str
    host: str
    simulated: bool
    blocks: int
    dataset: DataSource | None = None  # what its requests were drawn from


@dataclass(frozen=True, kw_only=True)
class OneSidedLevel:
    """A level one experiment measured and the other did not: left out of the verdict (there is nothing to judge it
    against), said with the other side's levels."""

    level: Level
    side: str  # "A" or "B": the side that measured it
    other: tuple[Level, ...]  # the other side's levels

    @property
    def other_side(self) -> str:
        return "B" if self.side == "A" else "A"

    @property
    def nearest(self) -> Rate | None:
        """An open-loop rate's closest rate on the other side: close is still another level, never paired with it."""
        if not isinstance(self.level, Rate):
            return None
        rates = [x for x in self.other if isinstance(x, Rate)]
        return min(rates, key=lambda x: abs(x - self.level)) if rates else None

    @property
    def shown(self) -> str:
        """The level in words, a rate with the digits that tell it from the other side's nearest."""
        nearest = self.nearest
        return level_phrase(self.level) if nearest is None else f"{rates_apart(self.level, nearest)[0]} req/s"

    @property
    def said(self) -> str:
        """One sentence: which side measured it, that it was not judged, and what the other side measured instead."""
        out = f"{self.shown}: measured by {self.side} only, not judged ({self.other_side} measured "
        out += levels_text(self.other)
        nearest = self.nearest
        if nearest is not None:
            theirs = rates_apart(self.level, nearest)[1]
            out += (
                f"; {self.other_side}'s nearest, {theirs} req/s, is another level: rates close but not equal are never "
                "paired"
            )
        return out + ")"


def rates_apart(a: float, b: float) -> tuple[str, str]:
    """Two different rates written with as many digits as it takes to tell them apart (0.625 and 0.6250001 are
    not both "0.625")."""
    for digits in range(6, 18):  # 6: the digits of :g, as every other level is written
        shown = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if shown[0] != shown[1]:
            return shown
    return repr(a), repr(b)


@dataclass(frozen=True, kw_only=True)
class ExperimentComparison:
    """b (the new result) judged against a (the recorded one)."""

    a: Side
    b: Side
    concurrency: float  # the level: a concurrency, or a results/run.Rate (open loop)
    tolerance: float
    arms: tuple[ArmRow, ...]
    ratios: tuple[RatioRow, ...]
    causes: tuple[str, ...]  # fingerprint differences, most likely cause first (ranked by the caller)
    status: str
    reason: str  # one sentence: why this status
    arm_map: tuple[tuple[str, str], ...] = ()  # (B's name, A's name) pairs given with --map
    # `dataset: A -> B` when the two sent other data (results/datasource.change): an environment step, said as a
    # fingerprint difference is, first among the causes.
    dataset_change: str | None = None
    # With two or more levels both measured (compare_levels): each level judged on its own, the headline first;
    # `status` and `reason` are then over all of them (the fields above are the headline level's).
    levels: tuple[ExperimentComparison, ...] = ()
    # Levels only one side measured (compare_levels): left out of the verdict, A's first; the judged levels are the
    # ones both measured.
    one_sided: tuple[OneSidedLevel, ...] = ()

    @property
    def map_hint(self) -> str | None:
        """The --map line that would pair the arms found on one side only, when they could be the same arms."""
        return map_line(self.only_in_a, self.only_in_b)

    @property
    def only_in_a(self) -> list[str]:
        return [r.label for r in self.arms if r.b is None]

    @property
    def only_in_b(self) -> list[str]:
        return [r.label for r in self.arms if r.a is None]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def arm_side(arm: ArmResult, level: float, seed: int = 0) -> ArmSide:
    per_launch = [v for v in arm.per_launch_at(level) if v]
    timed = arm.timed_at(level)
    return ArmSide(
        label=arm.label,
        tok_s=arm_estimate(per_launch, seed=seed) if per_launch else None,
        ttft_s=_median([r.ttft_s for r in timed if r.ttft_s is not None]),
        itl_p50_s=_median([r.metrics["itl"]["p50"] for r in timed if r.metrics.get("itl", {}).get("p50")]),
        accept_length=arm.accept_length_at(level),
    )


def _item_name(kind: str, name: str) -> str:
    return f"{name} tok/s" if kind == "arm" else f"ratio {name}"


def overall(
    items: Sequence[tuple[str, ReproVerdict | None]], missing: Sequence[str], tolerance: float
) -> tuple[str, str]:
    """reproduced if every item reproduced (and nothing is missing), not reproduced if any did not, else
    inconclusive; with the sentence that says why."""
    tol = f"±{tolerance * 100:.1f}%"
    failed = [(n, v) for n, v in items if v is not None and v.status == NOT_REPRODUCED]
    if failed:
        parts = [f"{n} {v.change * 100:+.1f}%" for n, v in failed]
        return NOT_REPRODUCED, f"beyond {tol}: " + ", ".join(parts)
    open_ = [n for n, v in items if v is None or v.status == INCONCLUSIVE]
    if not items:
        return INCONCLUSIVE, "nothing to compare: no arm with valid runs on both sides"
    if open_ or missing:
        needs = [v.blocks_needed for _, v in items if v is not None and v.blocks_needed]
        uncertain = [(n, v.recording_blocks_needed) for n, v in items if v is not None and v.recording_blocks_needed]
        why = []
        if open_:
            tail = f" (about {max(needs)} blocks would likely decide)" if needs and not uncertain else ""
            why.append("undecided: " + ", ".join(open_) + tail)
        if needs and uncertain:
            decidable = [n for n, v in items if v is not None and v.blocks_needed]
            why.append(f"about {max(needs)} blocks would likely decide {', '.join(decidable)}")
        if uncertain:
            why.append(
                f"the recording is too uncertain to reproduce {', '.join(n for n, _ in uncertain)}: ask for a "
                f"recording of at least {max(b for _, b in uncertain)} blocks (and re-run it with as many)"
            )
        if missing:
            why.append("on one side only: " + ", ".join(missing))
        return INCONCLUSIVE, "; ".join(why)
    return REPRODUCED, f"all {len(items)} values agree within {tol}"


def map_line(only_a: Sequence[str], only_b: Sequence[str]) -> str | None:
    """`--map B=A ...` pairing arms found on one side only: by position when both sides have as many (a guess the
    user checks, never applied unasked), else one example pair."""
    if not only_a or not only_b:
        return None
    pairs = zip(only_b, only_a, strict=True) if len(only_a) == len(only_b) else [(only_b[0], only_a[0])]
    return " ".join(f"--map {b}={a}" for b, a in pairs)


def check_map(arm_map: Mapping[str, str], a: Sequence[str], b: Sequence[str]) -> None:
    """--map NEW=OLD pairs: NEW an arm of B, OLD an arm of A, each used once, no B arm left under a taken name."""
    for new, old in arm_map.items():
        if new not in b:
            raise InputError(f"--map {new}={old}: B has no arm {new!r} (B's arms: {_names(b)})")
        if old not in a:
            raise InputError(f"--map {new}={old}: A has no arm {old!r} (A's arms: {_names(a)})")
    targets = list(arm_map.values())
    twice = sorted({t for t in targets if targets.count(t) > 1})
    if twice:
        raise InputError(f"--map pairs more than one arm of B with {', '.join(twice)} of A: give each arm once")
    clash = [label for label in b if label not in arm_map and label in targets]
    if clash:
        raise InputError(
            f"--map: B's own arm {clash[0]!r} would be compared with A's {clash[0]!r} too; map it as well "
            f"(--map {clash[0]}=OTHER)"
        )


class NoLevelInCommon(InputError):
    """A and B measured no level alike: concurrency against rates (closed against open loop), or other levels of one
    kind. Every arm would have "no valid runs" at the other's levels; the mismatch is what to say."""


def levels_text(levels: Sequence[Level]) -> str:
    """A side's levels in one phrase: "concurrency 1, 4", "rates 2, 4 req/s", or both kinds where a side has both."""
    rates = [f"{float(level):g}" for level in levels if isinstance(level, Rate)]
    closed = [f"{level:g}" for level in levels if not isinstance(level, Rate)]
    parts = ([f"concurrency {', '.join(closed)}"] if closed else []) + (
        [f"rate{'s' if len(rates) > 1 else ''} {', '.join(rates)} req/s"] if rates else []
    )
    return " and ".join(parts)


def common_levels(a: ABResult, b: ABResult) -> list[Level]:
    """A's levels that B measured too, of the same kind (a Rate equals a concurrency of the same number)."""
    return [level for level in a.levels if _has(b.levels, level)]


def _has(levels: Sequence[Level], level: Level) -> bool:
    # Exact equality: a rate of 0.625 and one of 0.634 req/s are two levels, however close.
    return any(level == other and type(level) is type(other) for other in levels)


def one_sided_levels(a: ABResult, b: ABResult) -> tuple[OneSidedLevel, ...]:
    """The levels only one side measured, A's then B's, each with the other side's levels."""
    return (
        *(OneSidedLevel(level=x, side="A", other=tuple(b.levels)) for x in a.levels if not _has(b.levels, x)),
        *(OneSidedLevel(level=x, side="B", other=tuple(a.levels)) for x in b.levels if not _has(a.levels, x)),
    )


def check_levels(a: ABResult, b: ABResult) -> None:
    """Refuse two experiments that measured levels but none in common, naming both sides' levels."""
    if not a.levels or not b.levels or common_levels(a, b):
        return
    kinds = {isinstance(level, Rate) for level in (*a.levels, *b.levels)}
    advice = (
        "compare experiments of the same kind of load (both --concurrency, or both --rate)"
        if len(kinds) > 1
        else "compare experiments measured at a level in common"
    )
    raise NoLevelInCommon(
        f"A ({visible(a.experiment_id)}) measured {levels_text(a.levels)}; B ({visible(b.experiment_id)}) measured "
        f"{levels_text(b.levels)}: no level in common; {advice}"
    )


def _names(names: Iterable[str]) -> str:
    return ", ".join(visible(name) for name in names)


class NothingInCommon(InputError):
    """No arm of B has the name of an arm of A (nor was paired with one by --map): there is no verdict to give."""


def compare(
    a: ABResult,
    b: ABResult,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    causes: Sequence[str] = (),
    concurrency: float | None = None,
    arm_map: Mapping[str, str] | None = None,
) -> ExperimentComparison:
    """b (new) against a (recorded): arms matched by label (the profile name; name#2 in an A/A test), or as arm_map
    pairs them (B's label -> A's label); each comparison (each arm vs the first arm) matched by (arm, baseline).
    NothingInCommon when no arm matches."""
    level = concurrency if concurrency is not None else (a.levels[0] if a.levels else 1)
    arm_map = dict(arm_map or {})
    a_arms = {arm.label: arm for arm in a.arms}
    check_map(arm_map, list(a_arms), [arm.label for arm in b.arms])
    b_arms = {arm_map.get(arm.label, arm.label): arm for arm in b.arms}  # keyed by A's names
    if a_arms and b_arms and not set(a_arms) & set(b_arms):
        # The names as fields (a store's or a bundle's, maybe with a newline or an escape in them): shown, one line.
        hint = visible(map_line(list(a_arms), list(b_arms)) or "")
        raise NothingInCommon(
            f"nothing to compare: no arm of B ({visible(b.experiment_id)}: {_names(b_arms)}) has the name of an arm "
            f"of A ({visible(a.experiment_id)}: {_names(a_arms)}); say which arm of B is which arm of A with --map "
            f"B_ARM=A_ARM, e.g. {hint}"
        )
    labels = list(a_arms) + [label for label in b_arms if label not in a_arms]
    rows: list[ArmRow] = []
    for label in labels:
        sa = arm_side(a_arms[label], level, a.design.seed) if label in a_arms else None
        sb = arm_side(b_arms[label], level, b.design.seed) if label in b_arms else None
        both = sa is not None and sb is not None and sa.tok_s is not None and sb.tok_s is not None
        v = (
            reproduction_verdict(sa.tok_s, sb.tok_s, tolerance)
            if both and sa and sb and sa.tok_s and sb.tok_s
            else None
        )
        b_own = b_arms[label].label if label in b_arms else None
        rows.append(ArmRow(label=label, a=sa, b=sb, verdict=v, b_label=b_own if b_own != label else None))
    a_cmp = {(c.arm_label, c.vs_label): c.estimate for c in a.comparisons_at(level, "tok_s")}
    b_cmp = {
        (arm_map.get(c.arm_label, c.arm_label), arm_map.get(c.vs_label, c.vs_label)): (c.estimate, c)
        for c in b.comparisons_at(level, "tok_s")
    }
    ratios: list[RatioRow] = []
    for key in list(a_cmp) + [k for k in b_cmp if k not in a_cmp]:
        ea = a_cmp.get(key)
        eb, cb = b_cmp.get(key, (None, None))
        rv = reproduction_verdict(ea, eb, tolerance) if ea is not None and eb is not None else None
        b_name = f"{cb.arm_label} / {cb.vs_label}" if cb is not None else None
        ratios.append(
            RatioRow(
                arm=key[0],
                vs=key[1],
                a=ea,
                b=eb,
                verdict=rv,
                b_name=b_name if b_name != f"{key[0]} / {key[1]}" else None,
            )
        )
    items = [(_item_name("arm", r.label), r.verdict) for r in rows if r.a and r.b]
    items += [
        (_item_name("ratio", f"{r.arm}/{r.vs}"), r.verdict) for r in ratios if r.arm in a_arms and r.arm in b_arms
    ]
    missing = [r.label for r in rows if r.a is None or r.b is None]
    status, reason = overall(items, missing, tolerance)
    return ExperimentComparison(
        a=Side(experiment_id=a.experiment_id, host=a.host, simulated=a.simulated, blocks=a.blocks, dataset=a.dataset),
        b=Side(experiment_id=b.experiment_id, host=b.host, simulated=b.simulated, blocks=b.blocks, dataset=b.dataset),
        concurrency=level,
        tolerance=tolerance,
        arms=tuple(rows),
        ratios=tuple(ratios),
        causes=tuple(causes),
        status=status,
        reason=reason,
        arm_map=tuple(arm_map.items()),
        dataset_change=datasource.change(a.dataset, b.dataset),
    )


def compare_levels(
    a: ABResult,
    b: ABResult,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    causes: Sequence[str] = (),
    arm_map: Mapping[str, str] | None = None,
) -> ExperimentComparison:
    """b against a at every level both measured (the first, the headline, with the others in `levels`): reproduced
    only if every level reproduced, not reproduced if any level did not, else inconclusive, said with the level.
    A level only one side measured is left out (`one_sided`), said in the reason, and decides nothing: it has
    nothing to be judged against. NoLevelInCommon when both measured levels but none alike (concurrency against
    rates, or other levels)."""
    check_levels(a, b)
    shared = common_levels(a, b)
    one_sided = one_sided_levels(a, b) if shared else ()
    head = compare(a, b, tolerance=tolerance, causes=causes, concurrency=shared[0] if shared else None, arm_map=arm_map)
    others = tuple(compare(a, b, tolerance=tolerance, concurrency=level, arm_map=arm_map) for level in shared[1:])
    if not others and not one_sided:
        return head
    judged = (head, *others)
    worst = next(
        (status for status in (NOT_REPRODUCED, INCONCLUSIVE) if any(c.status == status for c in judged)), REPRODUCED
    )
    if worst == REPRODUCED and not one_sided:
        reason = f"{head.reason}, at each of the {len(judged)} levels"
    elif worst == REPRODUCED:
        where = f"each of the {len(judged)} levels" if others else f"{level_phrase(head.concurrency)}, the one level"
        reason = f"{head.reason}, at {where} both measured"
    else:
        reason = "; ".join(f"{level_phrase(c.concurrency)}: {c.reason}" for c in judged if c.status == worst)
    if one_sided:
        left = ", ".join(f"{x.side}'s {x.shown}" for x in one_sided)
        reason += f"; not judged, measured on one side only: {left}"
    return dataclasses.replace(head, levels=judged if others else (), status=worst, reason=reason, one_sided=one_sided)


# ---------------------------------------------------------------- a claim ("94 tok/s on our box")


@dataclass(frozen=True, kw_only=True)
class ClaimVerdict:
    """One arm's measurement against a colleague's claimed tok/s (and claimed ratio vs a baseline)."""

    arm: str
    measured: ArmEstimate | None
    claimed_tps: float | None
    tps: ReproVerdict | None
    baseline: str | None
    baseline_measured: ArmEstimate | None
    claimed_ratio: float | None
    ratio: RatioEstimate | None  # measured arm / baseline
    ratio_verdict: ReproVerdict | None
    tolerance: float
    status: str
    reason: str
    simulated: bool = False

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]


def claim_verdict(
    result: ABResult,
    arm: str,
    *,
    claimed_tps: float | None = None,
    claimed_ratio: float | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    concurrency: float | None = None,
) -> ClaimVerdict:
    """result holds the claimed arm and (as its first arm, when it is not the claimed one) the baseline, measured
    from fresh state. The claim has no interval, so only this measurement's noise counts."""
    labels = [a.label for a in result.arms]
    if arm not in labels:
        raise InputError(f"the claim is about arm {arm!r}, but the result has only: {', '.join(labels)}")
    if claimed_tps is None and claimed_ratio is None:
        raise InputError("nothing claimed: give a claimed tok/s (--claim) and/or a claimed ratio (--claim-ratio)")
    for name, value in (("claimed tok/s", claimed_tps), ("claimed ratio", claimed_ratio)):
        if value is not None and not value > 0:
            raise InputError(f"{name} must be a positive number, got {value}")
    level = concurrency if concurrency is not None else (result.levels[0] if result.levels else 1)
    index = labels.index(arm)
    base = result.arms[0] if index > 0 else None
    if claimed_ratio is not None and base is None:
        raise InputError(f"a claimed ratio needs a baseline arm besides {arm!r} (--vs BASELINE)")
    measured = arm_side(result.arms[index], level, result.design.seed).tok_s
    base_measured = arm_side(base, level, result.design.seed).tok_s if base else None
    tps = reproduction_verdict(claimed_tps, measured, tolerance) if claimed_tps and measured else None
    est = next((c.estimate for c in result.comparisons_at(level, "tok_s") if c.arm_index == index), None)
    rv = reproduction_verdict(claimed_ratio, est, tolerance) if claimed_ratio and est else None
    items = ([(_item_name("arm", arm), tps)] if claimed_tps else []) + (
        [(_item_name("ratio", f"{arm}/{base.label}" if base else arm), rv)] if claimed_ratio else []
    )
    status, reason = overall(items, [], tolerance)
    return ClaimVerdict(
        arm=arm,
        measured=measured,
        claimed_tps=claimed_tps,
        tps=tps,
        baseline=base.label if base else None,
        baseline_measured=base_measured,
        claimed_ratio=claimed_ratio,
        ratio=est,
        ratio_verdict=rv,
        tolerance=tolerance,
        status=status,
        reason=reason,
        simulated=result.simulated,
    )


def estimate_json(e: ArmEstimate | RatioEstimate | None) -> dict[str, Any] | None:
    """value, 95 % CI (None with one launch/block) and the number of launches/blocks behind it."""
    if e is None:
        return None
    if isinstance(e, ArmEstimate):
        ci = [e.lo, e.hi] if e.lo is not None and e.hi is not None else None
        return {"value": e.value, "ci95": ci, "n": e.launches, "method": e.method}
    return {"value": e.ratio, "ci95": [e.lo, e.hi] if e.blocks >= 2 else None, "n": e.blocks, "method": e.method}

"""The nightly history page's model: what each item's series, points, levels and steps are, as plain data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# CSS class of an item's state in the header table: what needs a human first.
STATE_CLASSES = {
    "regression": "bad",
    "fail_on": "bad",
    "failed": "bad",
    "timeout": "bad",
    "interrupted": "bad",
    "skipped": "warn",
    "environment": "env",
    "improvement": "good",
    "building": "info",
    "ok": "good",
    "not run": "info",
}


@dataclass(frozen=True, kw_only=True)
class Point:
    """One measurement of a night: `x` the night's index (a confirmation's two measurements sit either side of
    it), its value and 95 % CI; `censored` "above"/"below" for a bound (a crossing beyond the range measured), or
    "undecided" (the value a placeholder in the middle of lo and hi, where a crossing may lie), as history stores it.
    A crossing's lo or hi is None where it reaches the end of the range measured."""

    x: float
    value: float
    lo: float | None
    hi: float | None
    kind: str = "night"  # night | first (a night that was re-measured) | rerun (its confirmation re-run)
    censored: str | None = None


@dataclass(frozen=True)
class Level:
    """The level the detector sees between two steps: the median of its nights (outlier nights left out)."""

    first: int  # night index
    last: int
    value: float


@dataclass(frozen=True, kw_only=True)
class Change:
    """A change point in hindsight: the night its new level starts, regression or improvement, and its size."""

    x: int
    kind: str  # regression | improvement
    before: float
    after: float
    change: float  # after / before - 1


@dataclass(frozen=True)
class EnvStep:
    """An environment step: a new history starts at night `x`; `label` says what changed (engine 0.5.9 → 0.5.10)."""

    x: int
    label: str


@dataclass(frozen=True)
class Gap:
    """A night without a value: failed, timed out, interrupted or skipped, with its reason (shown, not hovered)."""

    x: int
    label: str


@dataclass(frozen=True, kw_only=True)
class Series:
    """One series of an item (an arm's metric, or a ratio measured within the night) over every night of the item."""

    series: str  # baseline:tok_s, eagle3-3step/baseline:tok_s
    anchor: str  # the element id of its figure
    title: str  # `baseline tok/s`
    unit: str  # the y axis' label
    threshold: float
    higher_is_better: bool
    nights: tuple[str, ...]  # each night's date, by index (failed nights included)
    points: tuple[Point, ...]
    levels: tuple[Level, ...]
    band: tuple[int, int, float, float] | None  # first and last night of the current level, band's low and high
    changes: tuple[Change, ...]
    env_steps: tuple[EnvStep, ...]
    gaps: tuple[Gap, ...]
    outliers: tuple[int, ...]  # night indices: one bad night that did not persist
    noise: float | None  # night-to-night variation in the current environment (as the summary estimates it)
    noise_warning: str | None  # the summary's warning when it is above half the threshold
    simulated: bool = False
    ratio: bool = False  # values are ratios (0.912x)


@dataclass(frozen=True, kw_only=True)
class NightRow:
    """One night of an item, as its nights table shows it."""

    night: str
    state: str  # ok | regression | fail_on | environment | ... (STATE_CLASSES)
    label: str  # what the summary calls it: REGRESSION, FAIL-ON slower, FAILED ...
    experiments: tuple[str, ...]
    note: str


@dataclass(frozen=True, kw_only=True)
class Item:
    """One item of the page: its state tonight, how noisy it is, and its series."""

    item: str
    host: str
    anchor: str
    state: str  # a key of STATE_CLASSES
    label: str
    night: str  # the night its state is from (tonight, unless it did not run tonight)
    noise: str  # `1.2 % vs 3 %` for its noisiest series, or "—"
    noise_warning: str | None
    env_nights: int | None  # nights in its current environment, tonight included
    experiments: tuple[str, ...]  # tonight's
    simulated: bool
    attached: bool
    series: tuple[Series, ...]
    nights: tuple[NightRow, ...]


@dataclass(frozen=True, kw_only=True)
class Page:
    """The whole page: what it covers, the night it is as of, its items; `reports` maps an experiment id to the
    A/B report file written beside the page (relative), for the ids to link to."""

    title: str
    night: str  # tonight's date: the latest night shown (its --now), not the wall clock
    items: tuple[Item, ...]
    simulated: bool
    attached: tuple[str, ...]  # the ATTACHED banner's lines
    reports: Mapping[str, str] = field(default_factory=dict)

"""Results by prompt category: each arm's tok/s and accept length per category, and each comparison's paired ratio
per category with its CI and verdict, from the runs' per-request rows."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from orchestrator.config import datasets
from orchestrator.config.workload import BenchConfig, requests_digest, run_categories
from orchestrator.errors import InputError
from orchestrator.results.bundleformat import bench_config
from orchestrator.results.pairing import block_pairs, same_requests
from orchestrator.results.run import Level, Rate
from orchestrator.stats.estimates import RatioEstimate, bounded, ratio_ci, verdict
from orchestrator.stats.family import FAMILY_ALPHA, Adjustment, excludes_one, holm, t_crit

if TYPE_CHECKING:
    from orchestrator.results.model import ABResult, ArmResult
    from orchestrator.results.run import RunResult

# (concurrency, rate or 0.0, run index) → the categories of the run's requests in order (config/workload.RunSlot).
Categories = Mapping[tuple[int, float, int], Sequence[str]]


def run_category_values(run: RunResult, categories: Categories) -> dict[str, tuple[float, float | None, int]]:
    """One run's (tok/s per stream, mean accept length or None, completed requests) per category: each completed
    request's tokens over its end-to-end time, averaged over the category's requests, as the run's own tok/s is
    over all of them."""
    names = categories.get((run.concurrency, float(run.rate or 0.0), run.index))
    if not names:
        return {}
    speeds: dict[str, list[float]] = {}
    accepts: dict[str, list[float]] = {}
    for row in run.per_request:
        index, e2e, tokens = row.get("index"), row.get("e2e_s"), int(row.get("tokens") or 0)
        if row.get("error") or not isinstance(index, int) or not 0 <= index < len(names) or not e2e or tokens <= 0:
            continue
        speeds.setdefault(names[index], []).append(tokens / float(e2e))
        if row.get("accept_length") is not None:
            accepts.setdefault(names[index], []).append(float(row["accept_length"]))
    return {
        c: (statistics.fmean(v), statistics.fmean(accepts[c]) if c in accepts else None, len(v))
        for c, v in speeds.items()
    }


@dataclass(frozen=True, kw_only=True)
class CategoryArm:
    """One arm in one category: the median over its launches of each launch's median run value (as the headline
    tok/s), the mean per-request accept length, and how many requests it rests on."""

    arm_label: str
    category: str
    tok_s: float | None
    accept_length: float | None
    requests: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm_label": self.arm_label,
            "category": self.category,
            "tok_s": self.tok_s,
            "accept_length": self.accept_length,
            "requests": self.requests,
        }


@dataclass(frozen=True, kw_only=True)
class CategoryComparison:
    """An arm against the first in one category: paired block by block (both launches of a block sent the same
    prompts in the same runs), the ratio of launch medians with its CI over blocks, and its verdict."""

    arm_label: str
    vs_label: str
    category: str
    estimate: RatioEstimate | None
    verdict: str | None
    paired: bool
    per_launch: int = 0  # the fewest of this category's requests any compared launch completed
    # One of the family of category verdicts (every category, compared arm and level): its CI at Holm's level for it
    # (stats/family); None for a family of one, whose CI is the plain 95 %.
    adjustment: Adjustment | None = None
    noun: str = "category"  # what `category` names: a category, or a prompt (results/byprompt)

    @property
    def ratio(self) -> float | None:
        return self.estimate.ratio if self.estimate is not None else None

    @property
    def unbounded(self) -> str | None:
        """Said instead of a CI too wide to print (stats/estimates.bounded): this category had too few requests."""
        est = self.estimate
        if est is None or est.blocks < 2 or bounded(est):
            return None
        return f"too few requests in this {self.noun} to bound: {self.per_launch} per launch"

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        return {
            "arm_label": self.arm_label,
            "vs_label": self.vs_label,
            "category": self.category,
            "ratio": self.ratio,
            "blocks": est.blocks if est else 0,
            # As Comparison.to_dict: one block's interval holds only run-to-run noise, so it is not published; nor
            # is one too wide to mean anything (null, with the reason).
            "ci95": [est.lo, est.hi] if est and est.blocks >= 2 and not self.unbounded else None,
            **({"ci_note": self.unbounded} if self.unbounded else {}),
            "requests_per_launch": self.per_launch,
            "ci_method": est.method if est else None,
            **({"adjustment": self.adjustment.to_dict()} if self.adjustment is not None else {}),
            "verdict": self.verdict,
            "paired": self.paired,
        }


@dataclass(frozen=True)
class ByCategory:
    """A level's results by category (categories in alphabetical order)."""

    level: Level
    categories: tuple[str, ...]
    arms: tuple[CategoryArm, ...]
    comparisons: tuple[CategoryComparison, ...]

    def arm(self, label: str, category: str) -> CategoryArm | None:
        return next((a for a in self.arms if a.arm_label == label and a.category == category), None)

    def sentences(self) -> list[str]:
        """Per comparison, where the arm pays and where it does not, in words."""
        out = []
        for vs in dict.fromkeys(c.arm_label for c in self.comparisons):
            mine = [c for c in self.comparisons if c.arm_label == vs]
            said = {
                word: [c.category for c in mine if c.verdict == word]
                for word in ("faster", "slower", "no difference", "inconclusive")
            }
            parts = []
            if said["faster"]:
                parts.append(f"pays on {_and(said['faster'])}")
            if said["slower"] or said["no difference"]:
                parts.append(
                    "not on "
                    + _and(
                        [f"{c} (slower)" for c in said["slower"]]
                        + [f"{c} (no difference)" for c in said["no difference"]]
                    )
                )
            if said["inconclusive"]:
                parts.append(f"undecided on {_and(said['inconclusive'])}")
            if parts:
                held = next((c.adjustment for c in mine if c.adjustment is not None), None)
                family = f" ({held.family_note()})" if held is not None else ""
                out.append(f"{vs} vs {mine[0].vs_label}{family}: " + "; ".join(parts))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": None if isinstance(self.level, Rate) else self.level,
            **({"rate": float(self.level)} if isinstance(self.level, Rate) else {}),
            "categories": list(self.categories),
            "arms": [a.to_dict() for a in self.arms],
            "comparisons": [c.to_dict() for c in self.comparisons],
            "summary": self.sentences(),
        }


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _launch_values(runs: Sequence[RunResult], categories: Categories, category: str) -> tuple[list[float], int]:
    """A launch's run values in one category, in run order (runs without a request of it left out), and how many of
    its requests completed."""
    out, requests = [], 0
    for run in sorted(runs, key=lambda r: r.index):
        found = run_category_values(run, categories).get(category)
        if found is not None:
            out.append(found[0])
            requests += found[2]
    return out, requests


def _arm_summary(arm: ArmResult, level: Level, categories: Categories, category: str) -> CategoryArm:
    medians, accepts, requests = [], [], 0
    for launch in arm.launches:
        values = []
        for run in launch.timed_at(level):
            found = run_category_values(run, categories).get(category)
            if found is not None:
                values.append(found[0])
                requests += found[2]
                if found[1] is not None:
                    accepts.append(found[1])
        if values:
            medians.append(statistics.median(values))
    return CategoryArm(
        arm_label=arm.label,
        category=category,
        tok_s=statistics.median(medians) if medians else None,
        accept_length=statistics.fmean(accepts) if accepts else None,
        requests=requests,
    )


Estimator = Callable[[float], RatioEstimate]


def _compare(
    result: ABResult, base: ArmResult, arm: ArmResult, level: Level, category: str, categories: Categories, noun: str
) -> tuple[CategoryComparison, Estimator | None, int]:
    """The comparison in one category before its verdict, its estimate with the CI at a two-sided level 1 − alpha
    (None without a paired block), and how many paired blocks it rests on."""
    b_runs, a_runs, paired, counts = [], [], True, []
    for b_launch, a_launch in block_pairs(base, arm):
        # Only runs valid in both launches: run i of both sent the same prompts, so each pair meets the same prompts.
        both = {r.index for r in b_launch.timed_at(level)} & {r.index for r in a_launch.timed_at(level)}
        b, b_n = _launch_values([r for r in b_launch.timed_at(level) if r.index in both], categories, category)
        a, a_n = _launch_values([r for r in a_launch.timed_at(level) if r.index in both], categories, category)
        if b and a and all(v > 0 for v in (*b, *a)):
            b_runs.append(b)
            a_runs.append(a)
            counts += [b_n, a_n]
            paired = paired and same_requests(b_launch, a_launch, level)
    if not b_runs:
        return (
            CategoryComparison(
                arm_label=arm.label,
                vs_label=base.label,
                category=category,
                estimate=None,
                verdict=None,
                paired=False,
                noun=noun,
            ),
            None,
            0,
        )

    def at(alpha: float) -> RatioEstimate:
        crit = None if alpha == FAMILY_ALPHA else t_crit(alpha, len(b_runs) - 1)
        return ratio_ci(b_runs, a_runs, seed=result.design.seed, paired=paired, alpha=alpha, t_crit=crit)

    found = CategoryComparison(
        arm_label=arm.label,
        vs_label=base.label,
        category=category,
        estimate=None,
        verdict=None,
        paired=paired,
        per_launch=min(counts),
        noun=noun,
    )
    return found, at, len(b_runs)


def _judged(
    c: CategoryComparison, est: RatioEstimate, min_effect: float, adjustment: Adjustment | None
) -> CategoryComparison:
    # An interval too wide to print decides nothing either: the verdict is held at inconclusive with it.
    said = verdict(est, min_effect, higher_is_better=True) if bounded(est) else "inconclusive"
    return replace(c, estimate=est, verdict=said, adjustment=adjustment)


def _decides(est: RatioEstimate) -> bool:
    """What the family steps down on: a CI narrow enough to print that excludes 1."""
    return bounded(est) and excludes_one(est)


def families(
    result: ABResult, names: tuple[str, ...], categories: Categories, noun: str = "category", nouns: str = "categories"
) -> dict[Level, ByCategory]:
    """Every level's breakdown by the groups `categories` puts each run's requests in (categories; prompts, for
    results/byprompt), of the levels whose runs carry per-request rows, the group verdicts of all levels and
    compared arms one family: those with two or more blocks stepped down together by Holm (stats/family)."""
    levels = [lv for lv in result.levels if any(run.per_request for arm in result.arms for run in arm.timed_at(lv))]
    base = result.arms[0]
    arms: dict[Level, tuple[CategoryArm, ...]] = {}
    found: dict[Level, list[CategoryComparison]] = {}
    members: list[tuple[Level, int, Estimator]] = []
    for lv in levels:
        arms[lv] = tuple(_arm_summary(arm, lv, categories, c) for c in names for arm in result.arms)
        found[lv] = []
        for c in names:
            for arm in result.arms[1:]:
                comparison, at, blocks = _compare(result, base, arm, lv, c, categories, noun)
                if at is not None and blocks >= 2:
                    members.append((lv, len(found[lv]), at))
                elif at is not None:
                    # One block: no CI that could carry a verdict, so no member of the family.
                    comparison = _judged(comparison, at(FAMILY_ALPHA), result.min_effect, None)
                found[lv].append(comparison)
    stepped = holm([m[2] for m in members], _decides)
    compared = {found[lv][j].arm_label for lv, j, _ in members}
    counted = {found[lv][j].category for lv, j, _ in members}
    over = _family_name(len(members), len(compared), len({lv for lv, _, _ in members}), len(counted), nouns)
    for (lv, j, _), (est, alpha) in zip(members, stepped, strict=True):
        adjustment = Adjustment(size=len(members), alpha=alpha, over=over) if len(members) > 1 else None
        found[lv][j] = _judged(found[lv][j], est, result.min_effect, adjustment)
    return {lv: ByCategory(lv, names, arms[lv], tuple(found[lv])) for lv in levels}


def _family_name(size: int, arms: int, levels: int, categories: int, nouns: str) -> str:
    """What the family of category verdicts is over: "8 categories"; "16 comparisons (2 arms × 8 categories)"."""
    if arms == 1 and levels == 1:
        return f"{size} {nouns}"
    groups = [f"{n} {word}" for n, word in ((arms, "arms"), (levels, "levels")) if n > 1]
    return f"{size} comparisons ({' × '.join(groups)} × {categories} {nouns})"


def by_category(result: ABResult, level: Level | None = None) -> ByCategory | None:
    """The level's results by category (default: the first level); None unless the workload has two or more
    categories and the runs carry their per-request rows (a stored experiment: read with them)."""
    categories = result.categories
    if not categories:
        return None
    names = tuple(sorted({c for slot in categories.values() for c in slot}))
    if len(names) < 2 or not result.levels:
        return None
    level = level if level is not None else result.levels[0]
    if "by_category" not in result.derived:
        result.derived["by_category"] = families(result, names, categories)
    found: dict[Level, ByCategory] = result.derived["by_category"]
    return found.get(level)


def only_category(result: ABResult) -> str | None:
    """The one category every request of the workload is in (HumanEval: code), or None when there are none or
    several: with one, the comparisons themselves are that category's verdict and no breakdown is drawn."""
    names = {c for slot in (result.categories or {}).values() for c in slot}
    return next(iter(names)) if len(names) == 1 else None


def stored_categories(config: Mapping[str, Any]) -> Categories | None:
    """A stored experiment's run categories, from its stored workload; None for orch's own prompt sets, or when the
    dataset can no longer be read as it was (gone, or changed: its digest no longer matches)."""
    try:
        bench = bench_config(config)
        if not datasets.categorised(bench.prompts):
            return None
        found = run_categories(bench)
    except (InputError, OSError, KeyError, TypeError, ValueError):
        return None
    recorded = config.get("requests_sha256")
    if recorded is not None and requests_digest(bench) != recorded:
        return None
    return found


def dataset_counts(bench: BenchConfig) -> dict[str, int] | None:
    """The prompts per category of the dataset a workload draws from; None for orch's own or generated prompts, or
    when the dataset cannot be read (a stored experiment's file gone)."""
    if not datasets.covers(bench.prompts):
        return None
    try:
        return dict(Counter(datasets.categories_of(bench.prompts)))
    except (InputError, OSError):
        return None


def unsent(result: ABResult) -> dict[str, int] | None:
    """The dataset's categories that no timed run sent, with their prompts (alphabetical); None where unknown."""
    if result.dataset_categories is None or result.categories is None:
        return None
    sent = {c for slot in result.categories.values() for c in slot}
    return {c: n for c, n in sorted(result.dataset_categories.items()) if c not in sent}

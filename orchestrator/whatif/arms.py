"""The what-if's data: which arms of an experiment share a drafter, and what each launch of them measured."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import InputError
from orchestrator.results.model import ABResult, ArmResult, LaunchResult, spec_steps
from orchestrator.whatif.fit import ArmPoint


class WhatIfError(InputError):
    """The experiment cannot support a what-if: no speculative arm, arms of several drafters, one step count."""


@dataclass(frozen=True, kw_only=True)
class SpecArm:
    """A speculative arm with what the model needs from each of its launches."""

    arm: ArmResult
    profile: Mapping[str, Any]
    steps: int
    verified: int
    per_block: Mapping[int, ArmPoint]  # block -> that launch's point


def family(profile: Mapping[str, Any]) -> tuple[Any, ...]:
    """What arms must share for one cost model: the engine, base model, TP size, drafter and its tree width."""
    spec = profile.get("speculative") or {}
    return (
        profile.get("engine"),
        profile.get("model_path"),
        profile.get("tp_size"),
        str(spec.get("algorithm") or "").lower(),
        spec.get("draft_model_path") or profile.get("model_path"),
        spec.get("eagle_topk") or 1,
    )


def describe_family(key: tuple[Any, ...]) -> str:
    engine, model, tp, algorithm, draft, topk = key
    tree = f", topk {topk}" if topk != 1 else ""
    return f"{algorithm} drafter {draft} on {model} ({engine}, TP {tp}{tree})"


def launch_point(launch: LaunchResult, steps: int, verified: int, level: int) -> ArmPoint | None:
    """One launch as a point: its tok/s (median of valid runs), mean accept length and per-position acceptance."""
    timed = launch.timed_at(level)
    tps = launch.value_at(level)
    taus = [r.spec_accept_length for r in timed if r.spec_accept_length]
    if not tps or tps <= 0 or not taus:
        return None
    tau = statistics.fmean(taus)
    return ArmPoint(
        steps=steps,
        verified=verified,
        cycle_ms=1000.0 * tau / tps,
        accept_length=tau,
        per_position=_per_position(timed),
    )


def _per_position(runs: Sequence[Any]) -> tuple[float, ...] | None:
    """P(draft i accepted) from per-position counters (metrics.spec.per_position and .drafts), summed over runs."""
    totals: list[float] = []
    drafts = 0.0
    for r in runs:
        spec = r.metrics.get("spec") or {}
        counts, n = spec.get("per_position"), spec.get("drafts")
        if not isinstance(counts, list) or not counts or not isinstance(n, (int, float)) or n <= 0:
            return None
        totals = [a + float(b) for a, b in zip(totals or [0.0] * len(counts), counts, strict=True)]
        drafts += n
    return tuple(t / drafts for t in totals) if drafts else None


def mean_point(points: Sequence[ArmPoint]) -> ArmPoint:
    pos = [p.per_position for p in points]
    per_pos = None
    if all(pos) and len({len(p or ()) for p in pos}) == 1:
        per_pos = tuple(statistics.fmean(col) for col in zip(*(p or () for p in pos), strict=True))
    return ArmPoint(
        steps=points[0].steps,
        verified=points[0].verified,
        cycle_ms=statistics.fmean(p.cycle_ms for p in points),
        accept_length=statistics.fmean(p.accept_length for p in points),
        per_position=per_pos,
    )


def profiles_of(result: ABResult) -> list[dict[str, Any] | None]:
    """Each arm's resolved profile as its launches' fingerprints recorded it (None where none did)."""
    out: list[dict[str, Any] | None] = []
    for arm in result.arms:
        found = next(
            (
                lf["profile"]
                for la in arm.launches
                if isinstance(lf := la.fingerprint or {}, dict) and isinstance(lf.get("profile"), dict)
            ),
            None,
        )
        out.append(found)
    return out


def _spec_arms(result: ABResult, profiles: Sequence[Mapping[str, Any] | None], level: int) -> list[SpecArm]:
    out = []
    for arm, prof in zip(result.arms, profiles, strict=False):
        if not prof or not prof.get("speculative"):
            continue
        # An arm without a finished launch has no steps of its own yet: its stored profile has them.
        steps = arm.spec_steps if arm.spec_steps is not None else spec_steps(dict(prof))
        if steps is None:
            continue
        spec = prof["speculative"]
        verified = int(spec.get("num_draft_tokens") or steps + 1)
        points = {la.block: p for la in arm.launches if (p := launch_point(la, steps, verified, level))}
        out.append(SpecArm(arm=arm, profile=prof, steps=steps, verified=verified, per_block=points))
    return out


def unfinished(result: ABResult) -> str:
    """Where an unfinished experiment stands (' (experiment X is running: 2 of 9 launches finished)'), else ''."""
    if result.status == "complete":
        return ""
    done, total = len(result.launches), len(result.design.slots())
    return f" (experiment {result.experiment_id} is {result.status}: {done} of {total} launches finished)"


def _none_finished(result: ABResult, labels: Sequence[str]) -> WhatIfError:
    exp = result.experiment_id
    which = f"of {', '.join(labels)} " if labels else ""
    if result.status == "running":
        return WhatIfError(
            f"experiment {exp} is still running and no launch {which}has finished yet: nothing to fit so far; "
            f"run `orch whatif {exp}` again when it has{unfinished(result)}"
        )
    return WhatIfError(f"no launch {which}finished{unfinished(result)}: nothing to fit")


def select_arms(
    result: ABResult, profiles: Sequence[Mapping[str, Any] | None], names: Sequence[str] | None, level: int
) -> list[SpecArm]:
    """The speculative arms to fit from: those named, else every speculative arm of the one drafter measured at
    two or more step counts. WhatIfError says why there are none."""
    exp = result.experiment_id
    spec = _spec_arms(result, profiles, level)
    if not result.launches and not all(profiles):
        # Before any launch finished, an experiment stored without its profiles cannot tell which arms speculate.
        raise _none_finished(result, [])
    if names:
        known = {a.label: a for a in result.arms} | {a.profile: a for a in result.arms}
        for n in names:
            if n not in known:
                raise WhatIfError(
                    f"--arms: experiment {exp} has no arm {n!r} (its arms: {', '.join(a.label for a in result.arms)})"
                )
        wanted = {known[n].label for n in names}
        not_spec = sorted(wanted - {s.arm.label for s in spec})
        if not_spec:
            raise WhatIfError(f"--arms: {', '.join(not_spec)} does not use speculative decoding")
        spec = [s for s in spec if s.arm.label in wanted]
    if not spec:
        raise WhatIfError(
            f"experiment {exp} has no speculative arm: a what-if needs arms of one drafter at two or more step counts "
            "(e.g. orch ab baseline eagle3-2step eagle3-3step)"
        )
    groups: dict[tuple[Any, ...], list[SpecArm]] = {}
    for s in spec:
        groups.setdefault(family(s.profile), []).append(s)
    usable = {k: v for k, v in groups.items() if len({s.steps for s in v}) >= 2}
    if len(groups) > 1 and (names or len(usable) != 1):
        listing = "; ".join(f"{describe_family(k)}: {', '.join(s.arm.label for s in v)}" for k, v in groups.items())
        raise WhatIfError(
            f"the speculative arms of experiment {exp} do not share one base model and drafter ({listing}); "
            "choose the arms of one with --arms A,B"
        )
    chosen = next(iter(usable.values())) if usable else next(iter(groups.values()))
    steps = sorted({s.steps for s in chosen})
    if len(steps) < 2:
        raise WhatIfError(
            f"experiment {exp} measured {describe_family(family(chosen[0].profile))} at {steps[0]} step(s) only: "
            "fitting draft and verify cost needs two or more step counts (add an arm with another num_steps)"
        )
    missing = [s.arm.label for s in chosen if not s.per_block]
    if missing and not any(s.arm.launches for s in chosen if not s.per_block):
        raise _none_finished(result, missing)
    if missing:
        raise WhatIfError(
            f"no launch of {', '.join(missing)} has valid timed runs with a reported accept length: nothing to fit"
        )
    return chosen


def baseline_of(
    result: ABResult, profiles: Sequence[Mapping[str, Any] | None], spec_profile: Mapping[str, Any], level: int
) -> tuple[str, dict[int, float]] | None:
    """The first arm without speculation on the same engine, base model and TP size: label, tok/s per block."""
    for arm, prof in zip(result.arms, profiles, strict=False):
        if arm.spec_steps is not None or not prof:
            continue
        if all(prof.get(k) == spec_profile.get(k) for k in ("engine", "model_path", "tp_size")):
            values = {la.block: v for la in arm.launches if (v := la.value_at(level))}
            if values:
                return arm.label, values
    return None

"""The lossless check (--check-outputs) and accept length per request: what the arms generated, prompt by prompt."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from orchestrator.results.run import Level, level_name
from orchestrator.stats.family import holm
from orchestrator.stats.fisher import more_often_p

if TYPE_CHECKING:
    from orchestrator.results.model import ABResult, ArmResult, LaunchResult
    from orchestrator.results.run import RunResult

# How much of each continuation a divergence shows (characters before and after the first difference).
EXCERPT_BEFORE = 12
EXCERPT_AFTER = 28
# Divergences this early (share of the output) in this many of the requests read as a broken drafter, not numerics.
EARLY_SHARE = 0.25
OFTEN_SHARE = 0.5
# An arm diverging more often than the baseline's own repeat at this one-sided level (Fisher's exact test) diverges
# more than numerics explain.
CONTROL_ALPHA = 0.05


@dataclass(frozen=True, kw_only=True)
class ControlComparison:
    """An arm's divergences held against the control's (the baseline against its own repeat, same prompts): whether
    the arm diverges more often than numerics alone make the same server diverge."""

    diverged: int
    compared: int
    control_diverged: int | None  # None: no control (one block)
    control_compared: int | None
    p: float | None  # one-sided Fisher exact p-value: the arm diverges more often than the control
    # The level p is held to: CONTROL_ALPHA for one arm; with several arms each held against the control, Holm's
    # step-down over them (one "diverges more" verdict per arm, printed together: docs/statistics.md).
    alpha: float = CONTROL_ALPHA
    family: int = 1

    @property
    def verdict(self) -> str:
        """more | numerics | cannot tell | no control."""
        if self.control_compared is None or self.control_diverged is None or not self.control_compared:
            return "no control"
        if self.p is not None and self.p < self.alpha:
            return "more"
        # The test can say "numerics" only if it could have said "more": had the arm diverged on half its prompts
        # more than the control's share (a broken drafter's "often"), would it have been found? With too few prompts
        # compared, or a control that diverges almost everywhere, it could not.
        share = self.control_diverged / self.control_compared
        could = math.ceil(self.compared * min(1.0, share + OFTEN_SHARE))
        found = more_often_p(could, self.compared, self.control_diverged, self.control_compared)
        return "numerics" if self.diverged == 0 or found < self.alpha else "cannot tell"

    def sentence(self) -> str:
        """The comparison in words: counts, p, and what they support."""
        head = f"{self.diverged}/{self.compared} diverged"
        verdict = self.verdict
        if verdict == "no control":
            return (
                f"{head}, and no control to hold them against: the baseline ran one block, so nothing shows how often "
                "numerics alone make it diverge from itself; --blocks 2 or more compares it with its own repeat"
            )
        head += f" vs {self.control_diverged}/{self.control_compared} in the baseline's own repeat"
        p = f"Fisher exact p={self.p:.3g}"
        if self.family > 1:
            p += f", held to {self.alpha:.3g} by Holm over {self.family} arms"
        if verdict == "more":
            return f"{head}: diverges more than numerics explain ({p}, one-sided)"
        if verdict == "numerics":
            return f"{head}: no more often than the baseline against itself ({p}): numerics"
        return (
            f"{head}: cannot tell: too few prompts compared to tell the arm from numerics ({p}); more blocks or "
            "--requests-per-stream compare more"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "diverged": self.diverged,
            "compared": self.compared,
            "control_diverged": self.control_diverged,
            "control_compared": self.control_compared,
            "test": "fisher exact, one-sided",
            "p": self.p,
            "alpha": self.alpha,
            # several arms held against one control are one family: Holm's step-down over their p-values
            "adjustment": {"method": "holm", "family_size": self.family} if self.family > 1 else None,
            "verdict": self.verdict,
        }


def against_control(check: OutputsCheck, control: OutputsCheck | None) -> ControlComparison:
    """An arm's check held against the control's (None: no control)."""
    diverged = len(check.divergences)
    if control is None or not control.compared:
        return ControlComparison(
            diverged=diverged, compared=check.compared, control_diverged=None, control_compared=None, p=None
        )
    c_diverged = len(control.divergences)
    p = more_often_p(diverged, check.compared, c_diverged, control.compared)
    return ControlComparison(
        diverged=diverged, compared=check.compared, control_diverged=c_diverged, control_compared=control.compared, p=p
    )


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """Where one request's output first differs between two launches."""

    block: int  # of the arm's launch (0-based)
    level: Level
    run: int  # the timed run's index
    request: int  # the request's index in its run: the same prompt in both launches
    position: int  # tokens (or stream chunks, see unit) identical before the first difference
    unit: str  # "token" (token ids compared) | "chunk" (text compared; position counts the baseline's stream chunks)
    length: int  # the baseline output's length in that unit
    base: str  # a short excerpt of each continuation around the difference
    arm: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "block": self.block + 1,
            "level": level_name(self.level),
            "run": self.run + 1,
            "request": self.request,
            "position": self.position,
            "unit": self.unit,
            "length": self.length,
            "base": self.base,
            "arm": self.arm,
        }


@dataclass(frozen=True, kw_only=True)
class OutputsCheck:
    """One arm's outputs against the baseline's (kind "arm"), or the baseline's against its own first block's (kind
    "control": the same server twice, so whatever differs there is numerics, never a drafter)."""

    arm: str
    vs: str
    kind: str
    compared: int
    identical: int
    divergences: tuple[Divergence, ...]  # every diverging request, in run order; the first is the first divergence
    temperatures: tuple[Any, ...] = ()  # what the compared requests' bodies asked for (0: greedy)
    # kind "arm": its divergences against the control's (set by outputs_check); None for the control itself
    control: ControlComparison | None = None

    @property
    def greedy(self) -> bool:
        """No compared request asked for sampling (None: a body that set no temperature, which engines read as
        their default, not as greedy)."""
        return all(t == 0 and t is not None for t in self.temperatures)

    @property
    def share(self) -> float | None:
        return self.identical / self.compared if self.compared else None

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    @property
    def median_position(self) -> float | None:
        """Where the diverging requests diverge, as a share of their length (median)."""
        shares = [d.position / d.length for d in self.divergences if d.length]
        return statistics.median(shares) if shares else None

    @property
    def pattern(self) -> str | None:
        """How the divergences look: none | rare | often, late | early and often (None: nothing compared)."""
        if not self.compared:
            return None
        if not self.divergences:
            return "none"
        if len(self.divergences) / self.compared < OFTEN_SHARE:
            return "rare"
        return "early and often" if (self.median_position or 0.0) < EARLY_SHARE else "often, late"

    def reading(self) -> str:
        """What the divergences may mean, in one sentence."""
        pattern = self.pattern
        if pattern is None:
            return "no request was compared (no kept outputs on both sides)"
        if not self.greedy:
            return f"not greedy (temperature {', '.join(map(str, self.temperatures))} sent): sampling may differ"
        if pattern == "none":
            return "identical on every prompt compared"
        if self.kind == "control":
            return "the baseline differs from itself across launches: numerics (thread scheduling, batch shapes)"
        if self.control is not None and self.control.verdict == "more" and pattern != "early and often":
            return "diverges more often than the baseline against itself (the control): more than numerics explain"
        if pattern == "early and often":
            return (
                "most prompts diverge early: more likely a broken drafter or verifier than numerics (a correct "
                "verifier keeps greedy tokens until a near-tie flips)"
            )
        if pattern == "often, late":
            return (
                "most prompts diverge, though late: more than near-ties usually explain; hold it against the "
                "baseline-vs-baseline control (as often there: numerics)"
            )
        return (
            "few prompts diverge: the pattern numerics make (a different batch shape flips a near-tie, and the rest "
            "of the output follows), if the baseline diverges from itself as often (the control)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "vs": self.vs,
            "kind": self.kind,
            "compared": self.compared,
            "identical": self.identical,
            "share_identical": self.share,
            "diverged": len(self.divergences),
            "median_divergence_share": self.median_position,
            "pattern": self.pattern,
            "reading": self.reading(),
            "first_divergence": self.first.to_dict() if self.first else None,
            # the temperatures the compared requests were sent with, as the client sent them (greedy: [0.0])
            "temperatures": list(self.temperatures),
            # kind "arm": its divergences against the baseline's own repeat (null for the control, and when nothing
            # was compared or the requests were not greedy)
            "against_control": self.versus_control.to_dict() if self.versus_control else None,
        }

    @property
    def versus_control(self) -> ControlComparison | None:
        """The comparison with the control when it can say something: greedy requests compared on this arm."""
        return self.control if self.control is not None and self.compared and self.greedy else None


def kept(run: RunResult) -> dict[int, dict[str, Any]]:
    """A run's kept outputs by request index ({} without --check-outputs)."""
    outputs = run.metrics.get("outputs")
    if not isinstance(outputs, list):
        return {}
    return {int(o["index"]): o for o in outputs if isinstance(o, dict) and isinstance(o.get("index"), int)}


def has_outputs(result: ABResult) -> bool:
    return any(kept(r) for launch in result.launches for r in launch.runs if not r.warmup)


def _excerpt(text: str, at: int) -> str:
    start = max(at - EXCERPT_BEFORE, 0)
    shown = ("…" if start else "") + text[start : at + EXCERPT_AFTER] + ("…" if len(text) > at + EXCERPT_AFTER else "")
    return json.dumps(shown, ensure_ascii=False)[1:-1]  # newlines and quotes escaped, on one line


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def diverge(base: dict[str, Any], arm: dict[str, Any]) -> tuple[int, str, int, str, str] | None:
    """(position, unit, length, base excerpt, arm excerpt) where two outputs of one prompt first differ; None when
    identical. Token ids where both sides have them, else the text (position: the baseline's whole stream chunks
    before the first differing character; one chunk is one token on llama.cpp's and SGLang's streams)."""
    base_text, arm_text = str(base.get("text") or ""), str(arm.get("text") or "")
    base_ids, arm_ids = base.get("ids"), arm.get("ids")
    if isinstance(base_ids, list) and isinstance(arm_ids, list):
        if base_ids == arm_ids:
            return None
        at = _common_prefix(base_ids, arm_ids)
        char = _common_prefix(base_text, arm_text)
        return at, "token", len(base_ids), _excerpt(base_text, char), _excerpt(arm_text, char)
    if base_text == arm_text:
        return None
    char = _common_prefix(base_text, arm_text)
    given = base.get("pieces")
    pieces: list[Any] = given if isinstance(given, list) else [base_text]
    whole, used = 0, 0
    for piece in pieces:
        used += len(str(piece))
        if used > char:
            break
        whole += 1
    return whole, "chunk", len(pieces), _excerpt(base_text, char), _excerpt(arm_text, char)


def _pairs(base: LaunchResult, arm: LaunchResult) -> Iterator[tuple[RunResult, RunResult]]:
    """The two launches' timed runs that sent the same requests: same level, same index."""
    mine = {(r.level, r.index): r for r in arm.runs if not r.warmup}
    for r in base.runs:
        other = mine.get((r.level, r.index))
        if not r.warmup and other is not None:
            yield r, other


def compare_launches(pairs: Sequence[tuple[LaunchResult, LaunchResult]], arm: str, vs: str, kind: str) -> OutputsCheck:
    compared = identical = 0
    found: list[Divergence] = []
    temperatures: set[Any] = set()
    for base, other in pairs:
        for b_run, a_run in _pairs(base, other):
            b_out, a_out = kept(b_run), kept(a_run)
            for index in sorted(set(b_out) & set(a_out)):
                compared += 1
                temperatures |= {b_out[index].get("temperature"), a_out[index].get("temperature")}
                where = diverge(b_out[index], a_out[index])
                if where is None:
                    identical += 1
                    continue
                position, unit, length, b_text, a_text = where
                found.append(
                    Divergence(
                        block=other.block,
                        level=b_run.level,
                        run=b_run.index,
                        request=index,
                        position=position,
                        unit=unit,
                        length=length,
                        base=b_text,
                        arm=a_text,
                    )
                )
    shown = tuple(sorted(temperatures, key=str))
    return OutputsCheck(
        arm=arm, vs=vs, kind=kind, compared=compared, identical=identical, divergences=tuple(found), temperatures=shown
    )


def outputs_check(result: ABResult) -> list[OutputsCheck]:
    """Each arm against the baseline, block by block (the same prompt at the same place of the same run), then the
    baseline against its own first block (the control, with 2+ blocks); [] when no output was kept."""
    if not has_outputs(result) or not result.arms:
        return []
    base = result.arms[0]
    by_block = {launch.block: launch for launch in base.launches}
    control = None
    blocks = sorted(by_block)
    if len(blocks) > 1:
        first = by_block[blocks[0]]
        repeats = [(first, by_block[b]) for b in blocks[1:]]
        control = compare_launches(repeats, f"{base.label} (blocks 2+)", f"{base.label} (block 1)", "control")
    out = []
    for arm in result.arms[1:]:
        pairs = [(by_block[la.block], la) for la in arm.launches if la.block in by_block]
        check = compare_launches(pairs, arm.label, base.label, "arm")
        out.append(replace(check, control=against_control(check, control)))
    return held_together(out) + ([control] if control is not None else [])


def held_together(checks: Sequence[OutputsCheck]) -> list[OutputsCheck]:
    """The arms' comparisons with the control as one family: with two or more that can say "diverges more", each
    p-value is held to its Holm level instead of CONTROL_ALPHA, so that one of several arms does not read as broken
    by chance more often than one arm would."""
    tested = [i for i, c in enumerate(checks) if (v := c.versus_control) is not None and v.p is not None]
    if len(tested) < 2:
        return list(checks)
    comparisons = [cast("ControlComparison", checks[i].versus_control) for i in tested]

    def member(c: ControlComparison) -> Callable[[float], ControlComparison]:
        return lambda a: replace(c, alpha=a, family=len(tested))

    held = holm([member(c) for c in comparisons], lambda c: c.p is not None and c.p < c.alpha, CONTROL_ALPHA)
    out = list(checks)
    for i, (comparison, _) in zip(tested, held, strict=True):
        out[i] = replace(out[i], control=comparison)
    return out


@dataclass(frozen=True, kw_only=True)
class AcceptDistribution:
    """One arm's accept length per request (vLLM issue 42690: averaged over tokens, long completions weigh more)."""

    arm: str
    level: Level
    requests: int
    per_request_mean: float
    token_weighted: float
    values: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        ordered = sorted(self.values)
        return {
            "arm": self.arm,
            "level": level_name(self.level),
            "requests": self.requests,
            "per_request_mean": self.per_request_mean,
            "token_weighted": self.token_weighted,
            "p10": _quantile(ordered, 0.1),
            "median": _quantile(ordered, 0.5),
            "p90": _quantile(ordered, 0.9),
        }


def _quantile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def accept_distribution(arm: ArmResult, level: Level | None = None) -> AcceptDistribution | None:
    """The arm's per-request accept lengths over its valid timed runs at a level; None without any."""
    at = level if level is not None else (arm.levels[0] if arm.levels else 1)
    values: list[float] = []
    tokens = passes = 0.0
    for run in arm.timed_at(at):
        for accept, n in _accepts(run):
            values.append(accept)
            tokens += n
            passes += n / accept
    if not values:
        return None
    return AcceptDistribution(
        arm=arm.label,
        level=at,
        requests=len(values),
        per_request_mean=statistics.fmean(values),
        token_weighted=tokens / passes,
        values=tuple(values),
    )


def _accepts(run: RunResult) -> Iterator[tuple[float, int]]:
    """(accept length, tokens) of each request of a run that reported one: from the run's own list (stored with
    it), else from its per-request rows (a run stored before the list)."""
    given = run.metrics.get("accept_lengths")
    rows = given if isinstance(given, list) else [[r.get("accept_length"), r.get("tokens")] for r in run.per_request]
    for row in rows:
        if not isinstance(row, list | tuple) or len(row) != 2:
            continue
        accept, n = row
        if isinstance(accept, int | float) and accept > 0 and isinstance(n, int) and n > 0:
            yield float(accept), n


def accept_distributions(result: ABResult, level: Level | None = None) -> list[AcceptDistribution]:
    return [d for arm in result.arms if (d := accept_distribution(arm, level)) is not None]
